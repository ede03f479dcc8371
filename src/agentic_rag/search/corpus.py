"""Corpus readers and the passage chunker: real corpus formats in, one passage JSONL out.

The output has one ``{"id", "title", "text", "contents"}`` object per line, where ``contents`` is
``title + "\\n" + text`` (what BM25 indexes: title and text together, as the field's BM25 baselines do).

Input formats (all four occur in ``../shared/data``):

* ``json-list``: a JSON array of ``{"title", "text"}`` objects (HippoRAG's 2WikiMultiHopQA corpus);
* ``pyserini-jsonl``: one ``{"id", "contents"}`` per line, the title in quotes on the first line of
  ``contents`` (FlashRAG / DPR ``wiki-18``); lines that already carry ``title`` and ``text`` are read as is,
  so this tool's own output reads back;
* ``kilt``: one KILT Wikipedia page per line (``wikipedia_title``, ``text`` = list of paragraphs), split into
  ~100-word passages that keep the page title, as the R1-Searcher and RAG-R1 corpus builds do;
* ``hotpot``: a JSON object mapping title -> list of sentences (HotpotQA's corpus).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from ..jsonl import FileFormatError, decode, iter_json_container, jsonl_values

FORMATS = ("json-list", "pyserini-jsonl", "kilt", "hotpot")


@dataclass(frozen=True, slots=True)
class Passage:
    id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        return f"{self.title}\n{self.text}" if self.title else self.text

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "title": self.title, "text": self.text, "contents": self.contents},
                          ensure_ascii=False)


CorpusFormatError = FileFormatError  # a malformed record: says which file, which line and why


@dataclass
class CorpusStats:
    format: str
    records: int = 0
    passages: int = 0
    skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"format": self.format, "records": self.records, "passages": self.passages,
                "skipped": self.skipped}


# --------------------------------------------------------------------------------------------- detection


def detect_format(path: str | os.PathLike) -> str:
    """Guess the format from the first record (see the module docstring for the four formats)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        head = f.read(1 << 16)
    stripped = head.lstrip()
    if not stripped:
        raise CorpusFormatError(path, 1, "the file is empty")
    if stripped[0] == "[":
        return "json-list"
    if stripped[0] != "{":
        raise CorpusFormatError(path, 1, "not JSON: expected '[' (JSON list) or '{' (JSONL or JSON object)")
    first_line = stripped.split("\n", 1)[0]
    try:
        obj = json.loads(first_line)
    except json.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        if "wikipedia_title" in obj:
            return "kilt"
        if "contents" in obj or ("title" in obj and "text" in obj):
            return "pyserini-jsonl"
        if obj and all(isinstance(v, list) for v in obj.values()):
            return "hotpot"
        raise CorpusFormatError(
            path, 1, f"cannot tell the format from the first record's keys {sorted(obj)[:8]}; pass --format")
    return "hotpot"  # one JSON object spread over several lines: a title -> sentences mapping


# ------------------------------------------------------------------------------------------- readers


def _str_field(path: str | os.PathLike, line: int, obj: dict, key: str, *, required: bool = True) -> str:
    value = obj.get(key)
    if value is None:
        if required:
            raise CorpusFormatError(path, line, f"missing field '{key}'")
        return ""
    if not isinstance(value, str):
        raise CorpusFormatError(path, line, f"field '{key}' must be a string, got {type(value).__name__}")
    return value


def split_pyserini_contents(contents: str) -> tuple[str, str]:
    """``'"Title"\\ntext'`` -> ``("Title", "text")``; contents without a quoted title line -> ``("", contents)``."""
    first, sep, rest = contents.partition("\n")
    first = first.strip()
    if sep and len(first) >= 2 and first[0] == '"' and first[-1] == '"':
        return first[1:-1], rest.strip()
    return "", contents.strip()


def chunk_words(text: str, size: int = 100) -> list[str]:
    """Split text into passages of ``size`` words; a short tail (< size/4 words) joins the previous one."""
    words = text.split()
    chunks = [words[i:i + size] for i in range(0, len(words), size)]
    if len(chunks) > 1 and len(chunks[-1]) < size / 4:
        chunks[-2].extend(chunks.pop())
    return [" ".join(c) for c in chunks]


def kilt_paragraphs(paragraphs: list[str]) -> list[str]:
    """The body paragraphs of a KILT page: the title paragraph and ``Section::::`` headings dropped."""
    out = []
    for i, p in enumerate(paragraphs):
        p = p.strip()
        if i == 0 or not p or p.startswith("Section::::"):
            continue
        out.append(p.removeprefix("BULLET::::").lstrip("- ").strip())
    return out


class _Reader:
    """Yields ``(line, Passage list)`` per source record, raising CorpusFormatError on a bad one."""

    def __init__(self, path: str | os.PathLike, chunk_size: int):
        self.path, self.chunk_size = path, chunk_size

    def _jsonl(self, lines: Iterable[bytes]) -> Iterator[tuple[int, dict | None, CorpusFormatError | None]]:
        for lineno, obj in jsonl_values(lines, self.path):
            if isinstance(obj, FileFormatError):
                if lineno == 1 and "one JSON document" in obj.reason:
                    obj = CorpusFormatError(self.path, lineno, f"{obj.reason}: try --format auto")
                yield lineno, None, obj
            elif not isinstance(obj, dict):
                yield lineno, None, CorpusFormatError(self.path, lineno, "a record must be a JSON object")
            else:
                yield lineno, obj, None

    def pyserini_jsonl(self, f: Iterable[bytes]) -> Iterator[tuple[int, list[Passage] | CorpusFormatError]]:
        for lineno, obj, err in self._jsonl(f):
            if err is not None:
                yield lineno, err
                continue
            try:
                docid = obj.get("id", obj.get("docid"))
                if docid is None:
                    raise CorpusFormatError(self.path, lineno, "missing field 'id'")
                if "title" in obj and "text" in obj:
                    title = _str_field(self.path, lineno, obj, "title")
                    text = _str_field(self.path, lineno, obj, "text")
                else:
                    title, text = split_pyserini_contents(_str_field(self.path, lineno, obj, "contents"))
                yield lineno, [Passage(str(docid), title.strip(), text.strip())]
            except CorpusFormatError as exc:
                yield lineno, exc

    def kilt(self, f: Iterable[bytes]) -> Iterator[tuple[int, list[Passage] | CorpusFormatError]]:
        for lineno, obj, err in self._jsonl(f):
            if err is not None:
                yield lineno, err
                continue
            try:
                title = _str_field(self.path, lineno, obj, "wikipedia_title").strip()
                paragraphs = obj.get("text")
                if not isinstance(paragraphs, list) or not all(isinstance(p, str) for p in paragraphs):
                    raise CorpusFormatError(self.path, lineno, "field 'text' must be a list of paragraph strings")
                page_id = str(obj.get("wikipedia_id") or title)
                body = " ".join(kilt_paragraphs(paragraphs))
                chunks = chunk_words(body, self.chunk_size)
                yield lineno, [Passage(f"{page_id}-{i}", title, c) for i, c in enumerate(chunks)]
            except CorpusFormatError as exc:
                yield lineno, exc

    def json_list(self, text: str) -> Iterator[tuple[int, list[Passage] | CorpusFormatError]]:
        for n, (lineno, _, obj) in enumerate(iter_json_container(self.path, text, "[")):
            try:
                if not isinstance(obj, dict):
                    raise CorpusFormatError(self.path, lineno, "a record must be a JSON object")
                if "text" in obj:
                    title = _str_field(self.path, lineno, obj, "title", required=False)
                    body = _str_field(self.path, lineno, obj, "text")
                elif "contents" in obj:
                    title, body = split_pyserini_contents(_str_field(self.path, lineno, obj, "contents"))
                else:
                    raise CorpusFormatError(self.path, lineno, "missing field 'text'")
                docid = str(obj.get("id", obj.get("idx", n)))
                yield lineno, [Passage(docid, title.strip(), body.strip())]
            except CorpusFormatError as exc:
                yield lineno, exc

    def hotpot(self, text: str) -> Iterator[tuple[int, list[Passage] | CorpusFormatError]]:
        for n, (lineno, title, sentences) in enumerate(iter_json_container(self.path, text, "{")):
            if not isinstance(sentences, list) or not all(isinstance(s, str) for s in sentences):
                yield lineno, CorpusFormatError(self.path, lineno, f"'{title}': value must be a list of sentences")
                continue
            yield lineno, [Passage(str(n), str(title).strip(), "".join(sentences).strip())]


def iter_passages(path: str | os.PathLike, fmt: str = "auto", *, skip_bad: bool = False,
                  chunk_size: int = 100, stats: CorpusStats | None = None,
                  progress: bool = False) -> Iterator[Passage]:
    """Stream the passages of a corpus file in any supported format.

    A malformed record raises :class:`CorpusFormatError` (file, line, reason), or with ``skip_bad`` is
    skipped and counted in ``stats.skipped``. Empty passages and repeated ids are malformed too: an index
    needs every passage to have text and a unique id.
    """
    if fmt == "auto":
        fmt = detect_format(path)
    if fmt not in FORMATS:
        raise ValueError(f"unknown corpus format {fmt!r}; choose one of auto, {', '.join(FORMATS)}")
    stats = stats if stats is not None else CorpusStats(fmt)
    stats.format = fmt
    reader = _Reader(path, chunk_size)
    size = os.path.getsize(path)
    bar = tqdm(total=size, unit="B", unit_scale=True, desc=f"reading {Path(path).name}", disable=not progress)
    seen: set[str] = set()
    yield from _passages(path, fmt, reader, bar, stats, seen, skip_bad, size)


def _passages(path, fmt: str, reader, bar, stats: CorpusStats, seen: set[str], skip_bad: bool,
              size: int) -> Iterator[Passage]:
    with open(path, "rb") as f:
        if fmt in ("pyserini-jsonl", "kilt"):
            records = getattr(reader, fmt.replace("-", "_"))(_counting(f, bar))
        else:
            text = decode(path, f.read())
            bar.update(size)
            records = reader.json_list(text) if fmt == "json-list" else reader.hotpot(text)
        try:
            for lineno, item in records:
                stats.records += 1
                if not isinstance(item, CorpusFormatError):
                    item = _check_passages(path, lineno, item, seen)
                if isinstance(item, CorpusFormatError):
                    if not skip_bad:
                        raise item
                    stats.skipped += 1
                    continue
                for passage in item:
                    seen.add(passage.id)
                    stats.passages += 1
                    yield passage
        finally:
            bar.close()


def _check_passages(path: str | os.PathLike, line: int, passages: list[Passage],
                    seen: set[str]) -> list[Passage] | CorpusFormatError:
    for p in passages:
        if not p.text:
            return CorpusFormatError(path, line, f"passage {p.id!r} has no text")
        if p.id in seen:
            return CorpusFormatError(path, line, f"duplicate passage id {p.id!r}")
    return passages


def _counting(f: Iterable[bytes], bar: tqdm) -> Iterator[bytes]:
    for line in f:
        bar.update(len(line))
        yield line


def build_corpus(input_path: str | os.PathLike, out_path: str | os.PathLike, fmt: str = "auto", *,
                 skip_bad: bool = False, chunk_size: int = 100, progress: bool = True) -> CorpusStats:
    """Normalise ``input_path`` into a passage JSONL at ``out_path`` (written atomically)."""
    from ..errors import input_file
    from ..outputs import check_output_file, temp_beside

    input_file(input_path, "--input", what="corpus file")
    out_path = check_output_file(out_path, {"--input": input_path})
    stats = CorpusStats(fmt)
    with temp_beside(out_path) as tmp:  # a fresh name: a file of the user's beside the output is never touched
        with open(tmp, "w", encoding="utf-8") as out:
            for passage in iter_passages(input_path, fmt, skip_bad=skip_bad, chunk_size=chunk_size,
                                         stats=stats, progress=progress):
                out.write(passage.to_json() + "\n")
        if stats.passages == 0:
            raise CorpusFormatError(input_path, 1, "no passages were read")
        os.replace(tmp, out_path)
    return stats
