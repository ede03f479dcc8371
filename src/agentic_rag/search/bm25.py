"""BM25 over a Lucene index through Pyserini, with every JVM call on the process's JVM thread."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from .docstore import passage_from_record
from .jvm import run_in_jvm
from .types import Hit, IndexMismatchError, QueryError, SearchError, clean_query, isolate_failures

# Java exceptions that blame the query, not the index or the JVM.
_QUERY_FAULTS = ("TooManyClauses", "TooManyNestedClauses", "ParseException")


def _hit_from_lucene(docid: str, score: float, document) -> Hit:
    """A Hit from a Lucene document: the stored raw JSON if there is one, else the stored contents."""
    raw = document.get("raw") if document is not None else None
    if raw:
        try:
            p = passage_from_record(json.loads(raw))
            return Hit(docid, p.title, p.text, float(score))
        except (json.JSONDecodeError, AttributeError):
            pass
    contents = document.get("contents") if document is not None else None
    if contents:
        p = passage_from_record({"id": docid, "contents": contents})
        return Hit(docid, p.title, p.text, float(score))
    return Hit(docid, "", "", float(score))


def _java_reason(exc: BaseException) -> str:
    """The first line of a Java exception ('org...IndexSearcher$TooManyClauses: maxClauseCount is ...')."""
    text = str(exc).removeprefix("JVM exception occurred: ").strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _short_java(line: str) -> str:
    """``org.apache.lucene.index.CorruptIndexException: why`` -> ``CorruptIndexException: why``."""
    head, sep, rest = line.strip().partition(": ")
    return head.rsplit(".", 1)[-1] + sep + rest


def java_summary(exc: BaseException) -> str:
    """One line for a Java exception: its first line and its innermost cause's, class names without packages
    (pyjnius puts the whole Java stack, 15 lines or more, in the message)."""
    lines = [ln.strip() for ln in str(exc).removeprefix("JVM exception occurred: ").strip().splitlines()]
    if not lines:
        return type(exc).__name__
    first = _short_java(lines[0])
    causes = [lines[i + 1] for i, ln in enumerate(lines[:-1]) if ln == "Caused by:"]
    return first + (f" (caused by {_short_java(causes[-1])})" if causes else "")


class BM25Searcher:
    """Lucene BM25 (Pyserini ``LuceneSearcher``).

    ``threads`` is the number of Lucene threads used by :meth:`batch_search`; Python-side calls are
    serialised onto the JVM thread because pyjnius is not thread-safe.
    """

    def __init__(self, lucene_dir: str | os.PathLike, *, k1: float = 0.9, b: float = 0.4, language: str = "en",
                 threads: int | None = None):
        self.lucene_dir = Path(lucene_dir)
        self.threads = threads or min(8, os.cpu_count() or 1)
        self.k1, self.b, self.language = k1, b, language
        self._searcher = run_in_jvm(self._open)

    def _open(self):
        from pyserini.search.lucene import LuceneSearcher

        try:
            searcher = LuceneSearcher(str(self.lucene_dir))
        except Exception as exc:  # a Java exception: wrong path, corrupt index, newer Lucene version...
            raise IndexMismatchError(f"cannot open the Lucene index at {self.lucene_dir}: {java_summary(exc)}") \
                from None
        searcher.set_bm25(self.k1, self.b)
        if self.language != "en":
            searcher.set_language(self.language)
        return searcher

    @property
    def num_docs(self) -> int:
        return run_in_jvm(lambda: int(self._searcher.num_docs))

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        """Hits per query, in order. A query Lucene cannot answer fails alone (:class:`PartialSearchError`
        carries the others' hits); Lucene's own batch call would otherwise fail every query with it."""
        cleaned = [clean_query(q) for q in queries]
        return isolate_failures(lambda qs, k_: run_in_jvm(self._batch_search, qs, k_), cleaned, k)

    def _batch_search(self, queries: list[str], k: int) -> list[list[Hit]]:
        results: list[list[Hit]] = [[] for _ in queries]
        todo = [i for i, q in enumerate(queries) if q]
        if len(todo) == 1:
            i = todo[0]
            try:
                hits = self._searcher.search(queries[i], k)
            except Exception as exc:  # jnius.JavaException: say which query and why, in one line
                reason = _java_reason(exc)
                error = QueryError if any(f in reason for f in _QUERY_FAULTS) else SearchError
                shown = queries[i] if len(queries[i]) <= 80 else queries[i][:80] + "..."
                raise error(f"Lucene could not answer the query {shown!r}: {reason}") from None
            results[i] = [_hit_from_lucene(h.docid, h.score, h.lucene_document) for h in hits]
        elif todo:
            qids = [str(i) for i in todo]
            out = self._searcher.batch_search([queries[i] for i in todo], qids, k, self.threads)
            for i in todo:
                results[i] = [_hit_from_lucene(h.docid, h.score, h.lucene_document) for h in out.get(str(i), [])]
        return results

    def doc(self, docid: str) -> Hit | None:
        """The stored passage with this docid (score 0), or None."""

        def fetch():
            d = self._searcher.doc(docid)
            return None if d is None else _hit_from_lucene(docid, 0.0, d.lucene_document())

        return run_in_jvm(fetch)
