"""JSON Lines in, with the file and the line named when something is wrong: the one JSONL reader.

:func:`iter_jsonl` yields ``(line_number, value)`` for each non-blank line of a file (line numbers as an editor
shows them, counted on ``\\n``) and raises :class:`FileFormatError` on the first line that is not JSON.
:func:`jsonl_values` does the same over lines already opened (a progress bar's counting iterator) and yields a bad
line's error in place of its value, so a reader that skips bad records (``corpus build --skip-bad``) can go on.
A file that is not UTF-8 is an error in both, naming the line and the byte. A UTF-8 byte-order mark on the first
line is allowed. :func:`iter_json_container` reads one JSON document (an array of records, or an object) and
names the line each element starts on, for the formats that ship a corpus or questions as one JSON list.

:class:`FileFormatError` is the error of every input file's content (question files, corpora, prediction files):
``path:line: reason``, or ``path: reason`` for the file as a whole (line 0). It is a
:class:`~agentic_rag.errors.UserError`: the command line prints it as one line, exit code 2.

This module imports nothing of agentic_rag but :mod:`agentic_rag.errors`, so the search layer may use it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

from .errors import UserError

BOM = "\ufeff"


class FileFormatError(UserError):
    """A malformed input file: which file, which line (0: the whole file) and why."""

    def __init__(self, path: str | os.PathLike, line: int, reason: str):
        self.path, self.line, self.reason = str(path), line, reason
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")

    def __reduce__(self):  # picklable across processes (a worker's error re-raised in the parent)
        return type(self), (self.path, self.line, self.reason)


def not_utf8(path: str | os.PathLike, exc: UnicodeDecodeError, line: int = 0) -> FileFormatError:
    """The error for bytes that are not UTF-8: ``exc`` from decoding one line (``line``), or a whole file (``line``
    0: the line is counted in ``exc.object``)."""
    data, start = exc.object, exc.start
    if line:
        column = start + 1
    else:
        line = data.count(b"\n", 0, start) + 1
        column = start - data.rfind(b"\n", 0, start)
    return FileFormatError(path, line, f"not UTF-8 text (byte {data[start:start + 1]!r} at column {column}): save "
                                       f"the file as UTF-8")


def decode(path: str | os.PathLike, data: bytes) -> str:
    """A whole file's bytes as text (a UTF-8 byte-order mark dropped), or the error naming the first bad byte."""
    try:
        return data.decode("utf-8").removeprefix(BOM)
    except UnicodeDecodeError as exc:
        raise not_utf8(path, exc) from None


def parse_line(raw: str | bytes, path: str | os.PathLike, line: int) -> Any:
    """The JSON value of one line, or :class:`FileFormatError` naming the line (invalid JSON, not UTF-8)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise not_utf8(path, exc, line) from None
    if line == 1:
        raw = raw.removeprefix(BOM)
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        hint = ""
        text = raw.strip()
        if line == 1 and text.startswith(("[", "{")) and not text.endswith(("]", "}")):
            hint = ("; a JSONL file holds one JSON value a line, and its first line looks like the start of one JSON "
                    "document spread over several lines")
        raise FileFormatError(path, line, f"invalid JSON: {exc.msg}{hint}") from None


def jsonl_values(lines: Iterable[str | bytes], path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line_number, value)`` for each non-blank line of ``lines``; a line that is not JSON gives
    ``(line_number, FileFormatError)`` in place of the value (a JSON value is never an exception), and the reader
    goes on. Bytes that are not UTF-8 raise: the file's encoding is wrong, not one record."""
    for lineno, raw in enumerate(lines, start=1):
        if isinstance(raw, bytes):
            try:
                raw = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise not_utf8(path, exc, lineno) from None
        if not raw.strip():
            continue
        try:
            value = parse_line(raw, path, lineno)
        except FileFormatError as exc:
            value = exc
        yield lineno, value


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, Any]]:
    """``(line_number, value)`` for each non-blank line of the JSONL file ``path``; the first line that is not
    JSON (or not UTF-8) raises :class:`FileFormatError` naming it."""
    with open(path, "rb") as f:
        for lineno, value in jsonl_values(f, path):
            if isinstance(value, FileFormatError):
                raise value
            yield lineno, value


# ------------------------------------------------------------------------- one JSON document, with lines


def _line_of(text: str, offset: int, cache: list[int]) -> int:
    """1-based line number of ``offset``; ``cache`` holds [last_offset, last_line] to count incrementally."""
    last_offset, last_line = cache
    line = last_line + text.count("\n", last_offset, offset)
    cache[0], cache[1] = offset, line
    return line


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def iter_json_container(path: str | os.PathLike, text: str, opener: str) -> Iterator[tuple[int, Any, Any]]:
    """Yield ``(line, key, value)`` for each element of a top-level JSON array (key None) or object.

    Unlike ``json.load`` this knows the line each element starts on, so a bad record can be named exactly.
    """
    decoder = json.JSONDecoder()
    closer = "]" if opener == "[" else "}"
    cache = [0, 1]
    i = _skip_ws(text, 0)
    if i >= len(text) or text[i] != opener:
        raise FileFormatError(path, 1, f"expected a JSON {'array' if opener == '[' else 'object'}")
    i = _skip_ws(text, i + 1)
    if i < len(text) and text[i] == closer:
        return
    while True:
        line = _line_of(text, i, cache)
        key = None
        try:
            if opener == "{":
                key, i = decoder.raw_decode(text, i)
                i = _skip_ws(text, i)
                if i >= len(text) or text[i] != ":":
                    raise FileFormatError(path, line, "expected ':' after an object key")
                i = _skip_ws(text, i + 1)
            value, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError as exc:
            raise FileFormatError(path, _line_of(text, exc.pos, cache), f"invalid JSON: {exc.msg}") from None
        yield line, key, value
        i = _skip_ws(text, i)
        if i < len(text) and text[i] == ",":
            i = _skip_ws(text, i + 1)
            continue
        if i < len(text) and text[i] == closer:
            return
        raise FileFormatError(path, _line_of(text, i, cache), f"expected ',' or '{closer}'")
