"""The record every searcher returns, the protocol every searcher implements, and their errors.

Modelled on Pyserini's searcher API: one tiny ``Hit`` shared by BM25, dense, hybrid and the HTTP client;
``search(query, k)`` and ``batch_search(queries, k)``. Document text travels with the hit, so callers never
need a second lookup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class Hit:
    """One retrieved passage. ``score`` is the retriever's own (BM25, inner product, fused)."""

    docid: str
    title: str
    text: str
    score: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Hit:
        return cls(docid=str(d["docid"]), title=str(d.get("title", "")), text=str(d.get("text", "")),
                   score=float(d.get("score", 0.0)))


@runtime_checkable
class Searcher(Protocol):
    """Anything that answers queries with ranked hits."""

    def search(self, query: str, k: int = 10) -> list[Hit]: ...

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]: ...


class SearchError(RuntimeError):
    """A search could not be answered (backend failure, unreachable server, bad request)."""


class IndexMissingError(SearchError):
    """No usable index at the given place; the message says how to build one."""


class IndexMismatchError(SearchError):
    """The index on disk disagrees with its manifest or with what the caller asked for."""


MAX_QUERY_CHARS = 4096


def clean_query(query: str, max_chars: int = MAX_QUERY_CHARS) -> str:
    """Make any string safe to hand to a backend: valid Unicode, no control characters, bounded length.

    Lone surrogates (which cannot cross into Java's UTF-16 strings) are dropped, control characters become
    spaces, whitespace is collapsed, and the result is cut at ``max_chars``. The result may be empty; an
    empty query returns no hits rather than an error.
    """
    if not isinstance(query, str):
        raise TypeError(f"query must be a str, got {type(query).__name__}")
    query = query.encode("utf-8", "ignore").decode("utf-8", "ignore")  # drops lone surrogates
    query = "".join(ch if ch.isprintable() else " " for ch in query)
    return " ".join(query.split())[:max_chars]
