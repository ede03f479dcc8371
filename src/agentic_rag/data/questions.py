"""Question files in -> unified rows (id, question, answers, gold titles, meta).

One reader for the question formats of the field, recognised by their fields, so every command takes
any of them: a JSON list or JSONL of objects with

* ``question`` (required);
* an id from ``id`` / ``_id`` / ``idx`` / ``qid`` (else the record's position);
* answers from ``answer`` (string or list), ``answers``, ``golden_answers`` (NQ / FlashRAG) and
  ``answer_aliases`` (2WikiMultiHopQA), in that order, deduplicated;
* gold titles from ``supporting_facts``: a list of titles (2Wiki dev500), of ``[title, sentence_id]``
  pairs (HotpotQA), or of ``[title, ...]`` lists (the AMOR HotpotQA dev file);
* MedQA's ``options`` (letter -> text) and ``answer_idx`` (the gold letter) kept in ``meta``;
* ``kind`` and ``type`` (strings) kept in ``meta`` in every format (evaluation's ``by_kind`` / ``by_type``).
* the fictional world's ``hops`` (1 or 2) kept in ``meta`` (the report's one-hop / two-hop claims).

Named formats (``format=``, recognised from the first record by default; the evaluation harness uses them),
each read as the benchmark ships it:

* ``hotpotqa``: ``_id, question, answer, supporting_facts, type, level`` and, in the distractor setting,
  ``context`` (``[title, [sentences]]`` pairs, kept as ``meta["paragraphs"]``); without ``context`` it is the
  question-only setting;
* ``2wikimultihopqa``: ``_id``/``id, question, answer`` (+ ``answer_aliases``), ``supporting_facts``
  (titles or ``[title, sentence]`` pairs), ``context`` and ``evidences`` when present;
* ``musique``: ``id, question, answer, answer_aliases, paragraphs`` (``title, paragraph_text,
  is_supporting``: the supporting titles are the gold titles), ``question_decomposition``, ``answerable``;
* ``bamboogle``: ``Question`` / ``Answer`` columns (a CSV with that header, or JSON records with those
  capitalised keys);
* ``nq``: ``id, question, golden_answers`` (FlashRAG; NQ-open's ``answer`` list also works);
* ``r1-searcher``: ``idx, question, answer`` (R1-Searcher's evaluation and training files);
* ``medqa``: ``question, options`` (``A``-``D`` -> text), ``answer_idx`` (the gold letter), ``answer`` (its
  text): the gold answers are ``[letter, option text]`` and :func:`prompt_question` shows the options.

``require_answers=True`` (evaluation) makes a record without a gold answer an error that names the field
and the line, like every other malformed record.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..jsonl import FileFormatError, decode, iter_json_container, iter_jsonl

QuestionFormatError = FileFormatError  # a malformed question file: path, line, reason
# a question's kind (yes_no, pick_one, multi_hop) and type (2Wiki's compositional, inference, comparison,
# bridge_comparison; HotpotQA's bridge, comparison): kept in ``meta`` whatever the format
GROUP_KEYS = ("kind", "type")


@dataclass
class QARow:
    id: str
    question: str
    answers: list[str] = field(default_factory=list)
    gold_titles: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "question": self.question, "answers": self.answers,
                "gold_titles": self.gold_titles, "meta": self.meta}


def _records(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line, record)`` from a JSON list or a JSONL file."""
    with open(path, "rb") as f:
        head = f.read(1 << 16).lstrip().removeprefix(b"\xef\xbb\xbf").lstrip()
    if not head:
        raise QuestionFormatError(path, 1, "the file is empty")
    if head[:1] != b"[":
        yield from iter_jsonl(path)
        return
    with open(path, "rb") as f:
        text = decode(path, f.read())
    for line, _, value in iter_json_container(path, text, "["):
        yield line, value


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, (int, float)):
        return [str(value)]
    if isinstance(value, list):
        return [str(v) for v in value if isinstance(v, (str, int, float))]
    return []


def gold_titles_of(supporting_facts: Any) -> list[str]:
    titles: list[str] = []
    if isinstance(supporting_facts, list):
        for fact in supporting_facts:
            if isinstance(fact, str):
                titles.append(fact)
            elif isinstance(fact, list) and fact and isinstance(fact[0], str):
                titles.append(fact[0])
    return list(dict.fromkeys(titles))


def row_from_record(path: str | os.PathLike, line: int, position: int, obj: Any,
                    question_field: str = "question", answer_field: str | None = None) -> QARow:
    if not isinstance(obj, dict):
        raise QuestionFormatError(path, line, "a record must be a JSON object")
    question = obj.get(question_field)
    if not isinstance(question, str) or not question.strip():
        raise QuestionFormatError(path, line, f"missing or empty field '{question_field}'")
    qid = next((obj[key] for key in ("id", "_id", "idx", "qid") if obj.get(key) is not None), position)
    if answer_field is not None:
        if answer_field not in obj:
            raise QuestionFormatError(path, line, f"missing field '{answer_field}'")
        answers = _as_list(obj[answer_field])
    else:
        answers = []
        for key in ("answer", "answers", "golden_answers", "answer_aliases"):
            answers.extend(_as_list(obj.get(key)))
    meta = {k: obj[k] for k in ("options", "answer_idx", "type", "level", "meta_info", "hops") if k in obj}
    return QARow(id=str(qid), question=question.strip(), answers=list(dict.fromkeys(answers)),
                 gold_titles=gold_titles_of(obj.get("supporting_facts")), meta=meta)


def read_questions(path: str | os.PathLike, *, limit: int | None = None, question_field: str = "question",
                   answer_field: str | None = None, format: str = "auto",  # noqa: A002 - the user-facing name
                   require_answers: bool = False) -> list[QARow]:
    """Read every question of ``path`` (see the module docstring); ``limit`` keeps the first N.

    ``format`` is ``auto`` (recognised from the first record), ``generic`` (the field rules above), or one
    of :data:`FORMATS`. Naming ``question_field`` / ``answer_field`` reads those fields (generic rules).
    """
    if format not in ("auto", "generic", *FORMATS):
        raise ValueError(f"unknown question format {format!r}; choose auto, generic or one of {', '.join(FORMATS)}")
    custom = question_field != "question" or answer_field is not None
    if os.path.isdir(path):
        raise QuestionFormatError(path, 0, "a folder, not a question file (JSONL, a JSON list, or CSV)")
    rows: list[QARow] = []
    reader: Callable[..., QARow] | None = None
    name = "generic"
    records = _any_records(path)
    while True:
        try:
            position = len(rows)
            item = next(records, None)
        except UnicodeDecodeError:
            raise QuestionFormatError(path, 0, "not UTF-8 text: save the question file as UTF-8") from None
        if item is None:
            break
        line, obj = item
        if reader is None and position == 0:
            name = "generic" if custom else (detect_format(obj, path) if format == "auto" else format)
            reader = _READERS.get(name)
        if reader is None:
            row = row_from_record(path, line, position, obj, question_field, answer_field)
        else:
            row = reader(path, line, position, obj)
        for key in GROUP_KEYS:  # every format keeps these, so evaluation can break its scores down by them
            if isinstance(obj, dict) and isinstance(obj.get(key), str) and key not in row.meta:
                row.meta[key] = obj[key]
        if require_answers and not row.answers:
            # the file's format (recognised from its first record), not this record's look: an NQ record that
            # lost its golden_answers no longer looks like NQ
            field_name = answer_field or _ANSWER_FIELD.get(name, "answer")
            raise QuestionFormatError(path, line, f"missing field '{field_name}' (no gold answer)")
        rows.append(row)
        if limit is not None and len(rows) >= limit:
            break
    return rows


# ----------------------------------------------------------------------------------------- named formats

FORMATS = ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle", "nq", "r1-searcher", "medqa")
_ANSWER_FIELD = {"hotpotqa": "answer", "2wikimultihopqa": "answer", "musique": "answer", "bamboogle": "Answer",
                 "nq": "golden_answers", "r1-searcher": "answer", "medqa": "answer_idx", "generic": "answer"}


def _any_records(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line, record)`` from a JSON list, a JSONL file, or a CSV/TSV file with a header row."""
    if str(path).lower().endswith((".csv", ".tsv")):
        with open(path, encoding="utf-8-sig", newline="") as f:
            reader = csv.DictReader(f, delimiter="\t" if str(path).lower().endswith(".tsv") else ",")
            if not reader.fieldnames:
                raise QuestionFormatError(path, 1, "the file is empty (a CSV needs a header row)")
            for record in reader:
                if any((v or "").strip() for v in record.values() if isinstance(v, str)):
                    yield reader.line_num, {k.strip(): (v or "").strip() for k, v in record.items() if k}
        return
    yield from _records(path)


def detect_format(obj: Any, path: str | os.PathLike = "") -> str:
    """The named format a record looks like, or ``generic``."""
    if not isinstance(obj, dict):
        return "generic"
    keys = set(obj)
    if {"options", "answer_idx"} <= keys:
        return "medqa"
    if "paragraphs" in keys or "question_decomposition" in keys:
        return "musique"
    if "golden_answers" in keys:
        return "nq"
    if "Question" in keys and "question" not in keys:
        return "bamboogle"
    if "level" in keys or ("_id" in keys and obj.get("type") in ("bridge", "comparison") and "evidences" not in keys):
        return "hotpotqa"
    if "evidences" in keys or "answer_aliases" in keys:
        return "2wikimultihopqa"
    if "idx" in keys and "question" in keys:
        return "r1-searcher"
    return "generic"


def _need(path: str | os.PathLike, line: int, obj: Any, key: str, kind: type | tuple[type, ...] = str) -> Any:
    if not isinstance(obj, dict):
        raise QuestionFormatError(path, line, "a record must be a JSON object")
    value = obj.get(key)
    if value is None or (isinstance(value, str) and not value.strip()):
        raise QuestionFormatError(path, line, f"missing or empty field '{key}'")
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise QuestionFormatError(path, line, f"field '{key}' must be a {names}, got {type(value).__name__}")
    return value


def _id(obj: dict, position: int, *keys: str) -> str:
    return str(next((obj[k] for k in keys if obj.get(k) not in (None, "")), position))


def _context_paragraphs(context: Any, gold: list[str]) -> list[dict[str, Any]]:
    """HotpotQA / 2Wiki ``context``: ``[title, [sentences]]`` pairs -> paragraphs."""
    out = []
    if isinstance(context, list):
        for item in context:
            if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
                sents = item[1] if isinstance(item[1], list) else [item[1]]
                out.append({"title": item[0], "text": "".join(str(x) for x in sents).strip(),
                            "is_supporting": item[0] in gold})
    return out


def _hotpotqa(path, line, position, obj) -> QARow:
    question = _need(path, line, obj, "question")
    gold = gold_titles_of(obj.get("supporting_facts"))
    meta: dict[str, Any] = {k: obj[k] for k in ("type", "level") if k in obj}
    paragraphs = _context_paragraphs(obj.get("context"), gold)
    meta["setting"] = "distractor" if paragraphs else "question-only"
    if paragraphs:
        meta["paragraphs"] = paragraphs
    return QARow(_id(obj, position, "_id", "id"), question.strip(), _as_list(obj.get("answer")), gold, meta)


def _2wiki(path, line, position, obj) -> QARow:
    question = _need(path, line, obj, "question")
    answers = list(dict.fromkeys(_as_list(obj.get("answer")) + _as_list(obj.get("answer_aliases"))))
    gold = gold_titles_of(obj.get("supporting_facts"))
    meta: dict[str, Any] = {k: obj[k] for k in ("type", "evidences") if k in obj}
    paragraphs = _context_paragraphs(obj.get("context"), gold)
    if paragraphs:
        meta["paragraphs"] = paragraphs
    return QARow(_id(obj, position, "_id", "id"), question.strip(), answers, gold, meta)


def _musique(path, line, position, obj) -> QARow:
    question = _need(path, line, obj, "question")
    raw = obj.get("paragraphs") or []
    if not isinstance(raw, list):
        raise QuestionFormatError(path, line, "field 'paragraphs' must be a list")
    paragraphs = []
    for i, p in enumerate(raw):
        if not isinstance(p, dict) or not isinstance(p.get("paragraph_text"), str):
            raise QuestionFormatError(path, line, f"paragraphs[{i}] needs a 'paragraph_text' string")
        paragraphs.append({"title": str(p.get("title", "")), "text": p["paragraph_text"],
                           "is_supporting": bool(p.get("is_supporting"))})
    gold = list(dict.fromkeys(p["title"] for p in paragraphs if p["is_supporting"]))
    answers = list(dict.fromkeys(_as_list(obj.get("answer")) + _as_list(obj.get("answer_aliases"))))
    meta: dict[str, Any] = {"paragraphs": paragraphs}
    if isinstance(obj.get("question_decomposition"), list):
        meta["question_decomposition"] = obj["question_decomposition"]
        meta["hops"] = len(obj["question_decomposition"])
    if "answerable" in obj:
        meta["answerable"] = obj["answerable"]
    return QARow(_id(obj, position, "id"), question.strip(), answers, gold, meta)


def _bamboogle(path, line, position, obj) -> QARow:
    if not isinstance(obj, dict):
        raise QuestionFormatError(path, line, "a record must be a JSON object")
    lower = {str(k).strip().lower(): v for k, v in obj.items()}
    question = lower.get("question")
    if not isinstance(question, str) or not question.strip():
        raise QuestionFormatError(path, line, "missing or empty field 'Question'")
    return QARow(_id(lower, position, "id"), question.strip(), _as_list(lower.get("answer")))


def _nq(path, line, position, obj) -> QARow:
    question = _need(path, line, obj, "question")
    answers = _as_list(obj.get("golden_answers")) or _as_list(obj.get("answer")) or _as_list(obj.get("answers"))
    return QARow(_id(obj, position, "id", "qid"), question.strip(), list(dict.fromkeys(answers)))


def _r1_searcher(path, line, position, obj) -> QARow:
    question = _need(path, line, obj, "question")
    return QARow(_id(obj, position, "idx", "id"), question.strip(), list(dict.fromkeys(_as_list(obj.get("answer")))))


def _medqa(path, line, position, obj) -> QARow:
    question = _need(path, line, obj, "question")
    options = _need(path, line, obj, "options", dict)
    letter = str(_need(path, line, obj, "answer_idx")).strip().upper()
    options = {str(k).strip().upper(): str(v).strip() for k, v in options.items()}
    if letter not in options:
        raise QuestionFormatError(path, line, f"field 'answer_idx' is {letter!r}, not one of the options "
                                              f"{', '.join(options)}")
    text = str(obj.get("answer") or options[letter]).strip()
    meta = {"options": options, "answer_idx": letter}
    if "meta_info" in obj:
        meta["meta_info"] = obj["meta_info"]
    return QARow(_id(obj, position, "id", "qid"), question.strip(), [letter, text], [], meta)


_READERS: dict[str, Callable[..., QARow]] = {
    "hotpotqa": _hotpotqa, "2wikimultihopqa": _2wiki, "musique": _musique, "bamboogle": _bamboogle, "nq": _nq,
    "r1-searcher": _r1_searcher, "medqa": _medqa}


def prompt_question(row: QARow) -> str:
    """The question as the model sees it: a multiple-choice question (``meta["options"]``) lists its options
    and asks for the letter; any other question is shown as it is."""
    options = row.meta.get("options")
    if not isinstance(options, dict) or not options:
        return row.question
    lines = "\n".join(f"{k}. {v}" for k, v in options.items())
    return f"{row.question}\n\nOptions:\n{lines}\n\nAnswer with the letter of the correct option."
