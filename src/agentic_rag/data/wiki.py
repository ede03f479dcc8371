"""The 2WikiMultiHopQA task (issue 31): its corpus, its train/validation split, and what each question needs.

Everything is built from the real files in ``../shared/data`` (``AGENTIC_RAG_SHARED_DATA`` names another place);
nothing is downloaded. Importing this module loads no torch.

**Corpus** (:func:`build_wiki_corpus`): the 6,119 passages of ``hipporag/2wikimultihopqa_corpus.json`` plus the
context paragraphs of ``tts-project/2wikimultihopqa_sampled480.json`` whose title the HippoRAG corpus lacks, one
passage a title (a title already there keeps the HippoRAG text; the 3,199 titles of sampled480's contexts never
disagree among themselves). A context paragraph's sentences are joined with one space, as the HippoRAG corpus
joins them (all 1,204 multi-sentence paragraphs the two files share read the same that way). Ids are stable:
``hipporag-N`` (N = position in the HippoRAG file), ``sampled480-N`` (N = order of first appearance). Counts:
6,119 + 2,532 = 8,651 passages, as the probe measured; every gold title of dev500 and sampled480 is in it.

**Split** (:func:`wiki_splits`): validation is the tail of dev500, cut where it holds ``min_validation`` (200)
questions once every question that repeats an earlier one is dropped (same 2Wiki id, or the same question after
SQuAD normalisation: sampled480 holds 16 of dev500's questions, 5 of them in its last 205); with the real files
the cut is dev500[295:], 205 questions of which 200 are kept. Training is all of sampled480 plus dev500[:295]
without the 11 that repeat a sampled480 question (sampled480's record is kept: it carries the type and the
evidence): 480 + 284 = 764. A row's id is the 2Wiki id (sampled480's ``_1``; its own ``id`` is kept in
``meta["sampled480_id"]``).

**Kinds** (:func:`answer_kind`): ``yes_no`` (the gold answer is yes or no), ``pick_one`` (the normalised gold
answer is named, as whole words, in the normalised question: the comparison questions' two candidates), and
``multi_hop`` (the rest: compositional and inference questions, answered only from a second passage). On the real
files the kinds follow the types but for one inference question whose answer the question names ("Who is the
paternal grandfather of Anton Fredrik Klaveness (1903–1981)?" -> "Anton Fredrik Klaveness": ``pick_one``).

**Types** (:func:`wiki_type`): sampled480 gives the 2Wiki type; for dev500 it is inferred from the question's form:

* a question that offers two candidates (``..., X or Y?`` after a Which/Who/What/When opening) or asks yes/no
  about two things (opens with Are/Were/Is/Was/Do/Does/Did and says ``same`` or ``both``) is a comparison; it is a
  ``bridge_comparison`` when it says ``director`` (2Wiki's bridge comparisons compare films by their directors),
  else a ``comparison``;
* ``Who is ...`` asking for a relative no single fact gives (grandparents, in-laws, uncles and aunts, step-parents,
  grandchildren, ...), or for a father, mother or spouse of a person named outright (no role such as "the director
  of film" in between: the answer is a relative of a relative), is ``inference``;
* anything else is ``compositional`` (a relation of an entity the question reaches through another relation).

Measured on sampled480 (types known): 480 of 480 right (1.000; the first rule without the "Was X or Y born first?"
and "Who was born first out of X and Y?" forms got 477); :func:`type_accuracy` recomputes it. dev500 comes out
207 compositional, 123 bridge_comparison, 116 comparison, 54 inference.

**Hops** (:func:`hops`, :func:`hop_queries`): the entities a gold trajectory searches, in chain order, each with
the title of its gold passage. sampled480: the subjects of the evidence triples, deduplicated in order (a
compositional question: the film, then its director; a comparison: both entities; a bridge comparison: both films,
then their directors); the i-th subject's gold passage is the i-th distinct ``supporting_facts`` title (the two
lists line up on every record). The query is the entity as the question names it when the question names its
gold title (case-insensitively, with or without a parenthesised disambiguator: "Barefoot In The Park (Film)", so
the model can copy it), else the evidence subject (the name the previous passage gives: "Gene Saks"; a subject the
question spells otherwise, "Adam Karl Wilhelm Nikolaus Paul Eugen von Württemberg" for "Duke Adam Of
Württemberg", is replaced by the question's words). dev500 has no evidence: its gold titles, those the question
names first (in the order it names them, as the question writes them), then the others, each after the first
named title whose passage mentions it (a bridge comparison's directors follow their films), searched by title
without its parenthesised disambiguator ("Thomas Davenport (inventor)" -> "Thomas Davenport", the name a passage
gives; the model cannot know the disambiguator).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..rewards.accuracy import normalize_answer
from .questions import QARow, read_questions

HIPPORAG_CORPUS = "hipporag/2wikimultihopqa_corpus.json"
SAMPLED480 = "tts-project/2wikimultihopqa_sampled480.json"
DEV500 = "tts-project/2wikimultihopqa_dev500.json"
TYPES = ("compositional", "inference", "comparison", "bridge_comparison")
KINDS = ("yes_no", "pick_one", "multi_hop")
MIN_VALIDATION = 200


def shared_data_dir() -> Path:
    """``AGENTIC_RAG_SHARED_DATA``, else ``../shared/data`` beside the project (where the real data lives)."""
    env = os.environ.get("AGENTIC_RAG_SHARED_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[3].parent / "shared" / "data"


def _data(rel: str, data_dir: str | os.PathLike | None) -> Path:
    path = Path(data_dir) / rel if data_dir is not None else shared_data_dir() / rel
    if not path.is_file():
        raise FileNotFoundError(f"missing {path}: the 2Wiki task is built from the real data in ../shared/data "
                                f"(set AGENTIC_RAG_SHARED_DATA to its folder)")
    return path


# ------------------------------------------------------------------------------------------------- corpus

def wiki_passages(data_dir: str | os.PathLike | None = None) -> tuple[list[dict[str, str]], dict[str, int]]:
    """The merged passages (``id``, ``title``, ``text``) and their counts (see the module docstring)."""
    hipporag = json.loads(_data(HIPPORAG_CORPUS, data_dir).read_text(encoding="utf-8"))
    sampled = json.loads(_data(SAMPLED480, data_dir).read_text(encoding="utf-8"))
    passages: list[dict[str, str]] = []
    seen: set[str] = set()
    for i, p in enumerate(hipporag):
        if p["title"] not in seen:
            seen.add(p["title"])
            passages.append({"id": f"hipporag-{i}", "title": p["title"], "text": p["text"]})
    n_hipporag = len(passages)
    context_titles: set[str] = set()
    for record in sampled:
        for title, sentences in record["context"]:
            context_titles.add(title)
            if title not in seen:
                seen.add(title)
                text = " ".join(s.strip() for s in sentences if s.strip())
                passages.append({"id": f"sampled480-{len(passages) - n_hipporag}", "title": title, "text": text})
    counts = {"hipporag": n_hipporag, "added_from_sampled480": len(passages) - n_hipporag, "total": len(passages),
              "sampled480_context_titles": len(context_titles),
              "sampled480_titles_already_in_hipporag": len(context_titles) - (len(passages) - n_hipporag)}
    return passages, counts


def build_wiki_corpus(out_path: str | os.PathLike, data_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """Write the merged corpus as passage JSONL (``id, title, text, contents``: what ``index build`` reads) to
    ``out_path``, atomically; returns the counts and the path. The inputs are never overwritten."""
    from ..outputs import atomic_write_text, check_output_file
    from ..search.corpus import Passage

    base = Path(data_dir) if data_dir is not None else shared_data_dir()
    out = check_output_file(out_path, {"the HippoRAG corpus": base / HIPPORAG_CORPUS,
                                       "sampled480": base / SAMPLED480, "the shared data": base})
    passages, counts = wiki_passages(data_dir)
    atomic_write_text(out, "".join(Passage(p["id"], p["title"], p["text"]).to_json() + "\n" for p in passages))
    return {**counts, "path": str(out)}


@lru_cache(maxsize=2)
def _default_texts(data_dir: str | None) -> dict[str, str]:
    return {p["title"]: p["text"] for p in wiki_passages(data_dir)[0]}


def wiki_texts(data_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Title -> text of the merged corpus (read once)."""
    return _default_texts(str(data_dir) if data_dir is not None else None)


def missing_gold_titles(titles: Iterable[str], rows: Iterable[QARow]) -> dict[str, list[str]]:
    """Question id -> its gold titles that are not among ``titles`` (empty when the corpus holds them all)."""
    have = set(titles)
    return {r.id: miss for r in rows if (miss := [t for t in r.gold_titles if t not in have])}


# ------------------------------------------------------------------------------------------------- questions

def read_sampled480(data_dir: str | os.PathLike | None = None) -> list[QARow]:
    """sampled480 as unified rows, each with its 2Wiki id (``_1``) as its id and no context paragraphs in meta."""
    path = _data(SAMPLED480, data_dir)
    raw = json.loads(path.read_text(encoding="utf-8"))
    rows = read_questions(path, format="2wikimultihopqa")
    for row, record in zip(rows, raw, strict=True):
        row.meta.pop("paragraphs", None)
        row.meta.update(source="sampled480", sampled480_id=row.id)
        row.id = str(record["_1"])
    return rows


def read_dev500(data_dir: str | os.PathLike | None = None) -> list[QARow]:
    rows = read_questions(_data(DEV500, data_dir), format="2wikimultihopqa")
    for row in rows:
        row.meta["source"] = "dev500"
    return rows


def question_key(question: str) -> str:
    """A question as compared for duplicates: SQuAD-normalised."""
    return normalize_answer(question)


def wiki_splits(data_dir: str | os.PathLike | None = None, *,
                min_validation: int = MIN_VALIDATION) -> tuple[list[QARow], list[QARow]]:
    """``(train_rows, validation_rows)``: the rule is in the module docstring. Deterministic."""
    sampled, dev = read_sampled480(data_dir), read_dev500(data_dir)
    ids, texts = {r.id for r in sampled}, {question_key(r.question) for r in sampled}
    repeats: list[bool] = []
    for r in dev:  # a repeat of sampled480 or of an earlier dev500 question
        key = question_key(r.question)
        repeats.append(r.id in ids or key in texts)
        ids.add(r.id)
        texts.add(key)
    cut, kept = len(dev), 0
    while kept < min_validation:
        if cut == 0:
            raise ValueError(f"dev500 has fewer than {min_validation} questions that repeat no other")
        cut -= 1
        kept += not repeats[cut]
    validation = [r for r, rep in zip(dev[cut:], repeats[cut:], strict=True) if not rep]
    train = sampled + [r for r, rep in zip(dev[:cut], repeats[:cut], strict=True) if not rep]
    return train, validation


def split_record(row: QARow, texts: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One line of a split file: ``id, question, answer, answer_aliases, supporting_facts`` (titles), ``type``
    (given, or inferred: ``type_source``), ``evidences`` (when known), ``kind``, ``hops`` and the gold
    trajectory's ``hop_queries`` / ``hop_titles``."""
    given = row.meta.get("type")
    record: dict[str, Any] = {"id": row.id, "question": row.question, "answer": row.answers[0] if row.answers else "",
                              "answer_aliases": row.answers[1:], "supporting_facts": list(row.gold_titles),
                              "type": wiki_type(row), "type_source": "given" if given else "inferred"}
    if row.meta.get("evidences"):
        record["evidences"] = row.meta["evidences"]
    chain = hops(row, texts)
    record.update(kind=answer_kind(row.question, row.answers), hops=len(chain), hop_queries=[q for q, _ in chain],
                  hop_titles=[t for _, t in chain], source=row.meta.get("source", ""))
    return record


def write_splits(out_dir: str | os.PathLike, data_dir: str | os.PathLike | None = None, *,
                 min_validation: int = MIN_VALIDATION) -> dict[str, Any]:
    """Write ``train.jsonl`` and ``validation.jsonl`` (one :func:`split_record` a line, atomically) into
    ``out_dir``; returns the counts (questions, by kind, by type, by source) of each."""
    from ..outputs import atomic_write_text, check_apart

    base = Path(data_dir) if data_dir is not None else shared_data_dir()
    check_apart(out_dir, {"the shared data": base})
    train, validation = wiki_splits(data_dir, min_validation=min_validation)
    texts = wiki_texts(data_dir)
    out: dict[str, Any] = {}
    for name, rows in (("train", train), ("validation", validation)):
        records = [split_record(r, texts) for r in rows]
        path = atomic_write_text(Path(out_dir) / f"{name}.jsonl",
                                 "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
        out[name] = {"questions": len(records), "path": str(path),
                     "by_kind": dict(Counter(r["kind"] for r in records)),
                     "by_type": dict(Counter(r["type"] for r in records)),
                     "by_source": dict(Counter(r["source"] for r in records))}
    return out


# ------------------------------------------------------------------------------------------------- kinds, types

def _named(needle: str, haystack: str) -> bool:
    """``needle`` occurs in ``haystack`` as whole words (both already normalised)."""
    return bool(needle) and re.search(rf"(?<!\w){re.escape(needle)}(?!\w)", haystack) is not None


def answer_kind(question: str, answers: Sequence[str] | str) -> str:
    """``yes_no``, ``pick_one`` or ``multi_hop`` by the gold answer (the first of ``answers``): see the module
    docstring."""
    gold = normalize_answer(answers if isinstance(answers, str) else (answers[0] if answers else ""))
    if gold in ("yes", "no"):
        return "yes_no"
    if _named(gold, normalize_answer(question)):
        return "pick_one"
    return "multi_hop"


_TWO_CANDIDATES = re.compile(r"^(?:which|who|what|when)\b[^,]*,.+\sor\s.+\?\s*$"
                             r"|^(?:which|who)\b.*\bout of\s.+\sand\s.+\?\s*$", re.I | re.S)
_YES_NO = re.compile(r"^(?:are|were|is|was|do|does|did)\b", re.I)
_SAME_OR_BOTH = re.compile(r"\b(?:same|both)\b", re.I)
_RELATIVE = re.compile(r"\b(?:grand(?:father|mother|parent|child|son|daughter)|(?:father|mother|son|daughter|brother|"
                       r"sister|sibling)-in-law|uncle|aunt|nephew|niece|cousin|step(?:mother|father|son|daughter))\b",
                       re.I)
_ONE_RELATION = re.compile(r"^who (?:is|was) (?:the (?:father|mother|spouse|husband|wife) of (?P<a>.+)|(?P<b>.+)'s "
                           r"(?:father|mother|spouse|husband|wife))\?\s*$", re.I | re.S)
_ROLE = re.compile(r"\b(?:director|composer|performer|producer|presenter|founder|author|writer|editor|publisher|"
                   r"creator|film|song|album|father|mother|spouse|husband|wife|child)\b", re.I)


def infer_type(question: str) -> str:
    """The 2Wiki type a question's form says (the rule is in the module docstring)."""
    q = question.strip()
    if _TWO_CANDIDATES.match(q) or (_YES_NO.match(q) and (_SAME_OR_BOTH.search(q) or re.search(r"\sor\s", q))):
        return "bridge_comparison" if re.search(r"\bdirectors?\b", q, re.I) else "comparison"
    if re.match(r"^who (?:is|was)\b", q, re.I) and _RELATIVE.search(q):
        return "inference"
    m = _ONE_RELATION.match(q)
    if m:
        subject = (m.group("a") or m.group("b")).strip()
        if not subject.lower().startswith("the ") and not _ROLE.search(subject):
            return "inference"
    return "compositional"


def wiki_type(row: QARow) -> str | None:
    """The row's 2Wiki type: given (sampled480's ``type``) or inferred from the question's form."""
    given = row.meta.get("type")
    if isinstance(given, str) and given in TYPES:
        return given
    return infer_type(row.question) if row.question else None


def type_accuracy(rows: Iterable[QARow]) -> dict[str, Any]:
    """How often :func:`infer_type` gives the type a row carries, overall and per type (rows with a type)."""
    right: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for r in rows:
        given = r.meta.get("type")
        if given in TYPES:
            total[given] += 1
            right[given] += infer_type(r.question) == given
    n = sum(total.values())
    return {"questions": n, "accuracy": sum(right.values()) / n if n else None,
            "by_type": {t: right[t] / total[t] for t in total}}


# ------------------------------------------------------------------------------------------------- hops

_DISAMBIGUATOR = re.compile(r"\s*\([^()]*\)\s*$")


def _stem(title: str) -> str:
    """A title without its parenthesised disambiguator: "Border (2018 film)" -> "Border"."""
    return _DISAMBIGUATOR.sub("", title).strip() or title


def named_span(question: str, name: str) -> tuple[int, str] | None:
    """Where the question names ``name`` (or its stem), case-insensitively and as whole words: ``(position, the
    question's own words)``, or None."""
    for candidate in dict.fromkeys((name, _stem(name))):
        words = candidate.split()
        if not words:
            continue
        pattern = r"(?<!\w)" + r"\s+".join(re.escape(w) for w in words) + r"(?!\w)"
        m = re.search(pattern, question, re.I)
        if m:
            return m.start(), m.group(0)
    return None


def _mentions(text: str, title: str) -> int | None:
    """Position at which ``text`` names ``title``'s stem (case-insensitively, whole words), or None."""
    m = re.search(r"(?<!\w)" + re.escape(_stem(title).lower()) + r"(?!\w)", text.lower())
    return m.start() if m else None


def hops(row: QARow, texts: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(query, gold title)`` of each hop of ``row``'s gold trajectory, in chain order (the rule is in the module
    docstring). ``texts`` (title -> passage text) orders a question without evidence (dev500) whose titles the
    question does not all name; by default the merged corpus's, when the real data is at hand."""
    titles = list(row.gold_titles)
    evidences = row.meta.get("evidences")
    if evidences:
        subjects = list(dict.fromkeys(str(e[0]).strip() for e in evidences if isinstance(e, (list, tuple)) and e))
        if len(subjects) != len(titles):
            raise ValueError(f"question {row.id}: {len(subjects)} evidence subjects but {len(titles)} gold titles")
        out = []
        for subject, title in zip(subjects, titles, strict=True):
            named = named_span(row.question, title) or named_span(row.question, subject)
            out.append((named[1] if named else subject, title))
        return out
    named = {t: span for t in titles if (span := named_span(row.question, t))}
    first = sorted(named, key=lambda t: named[t][0])
    rest = [t for t in titles if t not in named]
    if rest and first:
        if texts is None:
            try:
                texts = wiki_texts()
            except FileNotFoundError:
                texts = {}

        def after(title: str) -> tuple[int, int]:
            for i, n in enumerate(first):
                if _mentions(texts.get(n, ""), title) is not None:
                    return i, titles.index(title)
            return len(first), titles.index(title)

        rest.sort(key=after)
    return [(named[t][1], t) for t in first] + [(_stem(t), t) for t in rest]


def hop_queries(row: QARow, texts: Mapping[str, str] | None = None) -> list[str]:
    """The search queries of ``row``'s gold trajectory, one a hop, in chain order (see :func:`hops`)."""
    return [q for q, _ in hops(row, texts)]


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m agentic_rag.data.wiki --out DIR``: the corpus (``DIR/corpus.jsonl``) and the two split files."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("--out", required=True, help="output folder (corpus.jsonl, train.jsonl, validation.jsonl)")
    p.add_argument("--data", default=None, help="the shared data folder (default: ../shared/data)")
    p.add_argument("--min-validation", type=int, default=MIN_VALIDATION)
    args = p.parse_args(argv)
    corpus = build_wiki_corpus(Path(args.out) / "corpus.jsonl", args.data)
    splits = write_splits(args.out, args.data, min_validation=args.min_validation)
    print(json.dumps({"corpus": corpus, **splits, "type_inference": type_accuracy(read_sampled480(args.data))}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
