"""The search layer: one ``Hit`` record and one ``Searcher`` protocol, implemented by BM25 (Pyserini),
dense (FAISS), hybrid (fusion by composition) and an HTTP client of the retrieval server.

This package knows no model; everything above it (tools, rollout, evaluation, service) talks to a
``Searcher``.
"""

from .cache import CachedSearcher
from .index import RETRIEVERS, open_searcher
from .types import (
    Hit,
    IndexMismatchError,
    IndexMissingError,
    PartialSearchError,
    QueryError,
    Searcher,
    SearchError,
    clean_query,
)

__all__ = ["RETRIEVERS", "CachedSearcher", "Hit", "IndexMismatchError", "IndexMissingError", "PartialSearchError",
           "QueryError", "SearchError", "Searcher", "clean_query", "open_searcher"]
