"""Question files in -> unified rows (id, question, answers, gold titles, meta).

One reader for the question formats of the field, recognised by their fields, so every command takes
any of them: a JSON list or JSONL of objects with

* ``question`` (required);
* an id from ``id`` / ``_id`` / ``idx`` / ``qid`` (else the record's position);
* answers from ``answer`` (string or list), ``answers``, ``golden_answers`` (NQ / FlashRAG) and
  ``answer_aliases`` (2WikiMultiHopQA), in that order, deduplicated;
* gold titles from ``supporting_facts``: a list of titles (2Wiki dev500), of ``[title, sentence_id]``
  pairs (HotpotQA), or of ``[title, ...]`` lists (the AMOR HotpotQA dev file);
* MedQA's ``options`` (letter -> text) and ``answer_idx`` (the gold letter) kept in ``meta``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class QuestionFormatError(ValueError):
    def __init__(self, path: str | os.PathLike, line: int, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}")


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
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if not stripped:
        raise QuestionFormatError(path, 1, "the file is empty")
    if stripped[0] == "[":
        from ..search.corpus import CorpusFormatError, iter_json_container

        try:
            for line, _, value in iter_json_container(path, text, "["):
                yield line, value
        except CorpusFormatError as exc:
            raise QuestionFormatError(exc.path, exc.line, exc.reason) from None
        return
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            yield lineno, json.loads(raw)
        except json.JSONDecodeError as exc:
            raise QuestionFormatError(path, lineno, f"invalid JSON: {exc.msg}") from None


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
    meta = {k: obj[k] for k in ("options", "answer_idx", "type", "level", "meta_info") if k in obj}
    return QARow(id=str(qid), question=question.strip(), answers=list(dict.fromkeys(answers)),
                 gold_titles=gold_titles_of(obj.get("supporting_facts")), meta=meta)


def read_questions(path: str | os.PathLike, *, limit: int | None = None, question_field: str = "question",
                   answer_field: str | None = None) -> list[QARow]:
    """Read every question of ``path`` (see the module docstring); ``limit`` keeps the first N."""
    rows: list[QARow] = []
    for position, (line, obj) in enumerate(_records(path)):
        rows.append(row_from_record(path, line, position, obj, question_field, answer_field))
        if limit is not None and len(rows) >= limit:
            break
    return rows
