"""The record every searcher returns, the protocol every searcher implements, and their errors.

Modelled on Pyserini's searcher API: one tiny ``Hit`` shared by BM25, dense, hybrid and the HTTP client;
``search(query, k)`` and ``batch_search(queries, k)``. Document text travels with the hit, so callers never
need a second lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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


class QueryError(SearchError):
    """The backend cannot answer this one query (Lucene rejects it, say); other queries still work."""


class PartialSearchError(SearchError):
    """Some queries of a batch failed, each retried alone; the others were answered.

    ``results[i]`` holds query i's hits, or None where it failed; ``errors[i]`` the reason it failed, or
    None. Callers that can use the answered queries (the search server, a tool) catch this; for everyone
    else it is a :class:`SearchError` that names the failed queries.
    """

    def __init__(self, results: list[list[Hit] | None], errors: list[str | None]):
        if len(results) != len(errors):
            raise ValueError(f"{len(results)} results but {len(errors)} error entries")
        self.results, self.errors = results, errors
        failed = [i for i, e in enumerate(errors) if e is not None]
        first = f"; queries[{failed[0]}]: {errors[failed[0]]}" if failed else ""
        super().__init__(f"{len(failed)} of {len(errors)} queries could not be answered{first}")


def isolate_failures(batch_fn: Callable[[list[str], int], list[list[Hit]]], queries: Sequence[str],
                     k: int) -> list[list[Hit]]:
    """``batch_fn(queries, k)``, but one query the backend cannot answer no longer fails the whole batch.

    If the batch call fails, each query is retried alone: when some succeed (or a failure is a
    :class:`QueryError`), :class:`PartialSearchError` carries the answers and a reason per failed query.
    When every query fails alone with another error, the backend itself is down: that error is raised.
    A :class:`PartialSearchError` from ``batch_fn`` is already isolated and passes through.
    """
    queries = list(queries)
    try:
        return batch_fn(queries, k)
    except PartialSearchError:
        raise
    except Exception as exc:
        if len(queries) < 2:
            raise
        batch_exc = exc
    results: list[list[Hit] | None] = []
    failures: list[Exception | None] = []
    for q in queries:
        try:
            results.append(batch_fn([q], k)[0])
            failures.append(None)
        except Exception as exc:  # noqa: BLE001 - recorded per query and reported below
            results.append(None)
            failures.append(exc)
    failed = [e for e in failures if e is not None]
    if not failed:
        return results  # type: ignore[return-value]  # the batch failed, every query alone did not
    if len(failed) == len(queries) and not any(isinstance(e, QueryError) for e in failed):
        raise failed[0] from batch_exc
    raise PartialSearchError(results, [None if e is None else _reason(e) for e in failures])


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, SearchError) else f"{type(exc).__name__}: {exc}"
