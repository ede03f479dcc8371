"""A thread-safe LRU cache in front of any searcher.

GRPO samples ``num_generations`` rollouts per question, so the same query arrives many times per step;
a cache answers the repeats without touching the backend. Keys are ``(query, k)`` after the same
cleaning the backends apply, so trivially different spellings of one query share an entry.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from .types import Hit, PartialSearchError, Searcher, clean_query


class LRUCache:
    def __init__(self, maxsize: int):
        if maxsize < 0:
            raise ValueError(f"cache size must be >= 0, got {maxsize}")
        self.maxsize = maxsize
        self._data: OrderedDict[tuple[str, int], list[Hit]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, int]) -> list[Hit] | None:
        with self._lock:
            value = self._data.get(key)
            if value is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: tuple[str, int], value: list[Hit]) -> None:
        if self.maxsize == 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.maxsize:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()
            self.hits = self.misses = 0

    def stats(self) -> dict[str, int]:
        return {"size": len(self._data), "maxsize": self.maxsize, "hits": self.hits, "misses": self.misses}


def cached_batch(cache: LRUCache, queries: Sequence[str], k: int,
                 fetch: callable) -> list[list[Hit]]:
    """Answer ``queries`` from ``cache``; only the misses (each distinct one once) go to ``fetch``.

    When ``fetch`` answers only some queries (:class:`PartialSearchError`), the answers are cached and the
    error is raised again with every position of ``queries`` filled in (a failed query is never cached).
    """
    keys = [(clean_query(q), k) for q in queries]
    out: list[list[Hit] | None] = [cache.get(key) for key in keys]
    missing = list(dict.fromkeys(key for key, hit in zip(keys, out, strict=True) if hit is None))
    if not missing:
        return out  # type: ignore[return-value]
    failed: dict[tuple[str, int], str] = {}
    try:
        fetched: list[list[Hit] | None] = list(fetch([q for q, _ in missing], k))
    except PartialSearchError as exc:
        fetched = list(exc.results)
        failed = {key: e for key, e in zip(missing, exc.errors, strict=True) if e is not None}
    by_key = dict(zip(missing, fetched, strict=True))
    for key, hits in by_key.items():
        if key not in failed and hits is not None:
            cache.put(key, hits)
    out = [by_key[key] if hit is None else hit for key, hit in zip(keys, out, strict=True)]
    if failed:
        raise PartialSearchError([None if key in failed else hits for key, hits in zip(keys, out, strict=True)],
                                 [failed.get(key) for key in keys])
    return out  # type: ignore[return-value]


class CachedSearcher:
    """Wraps a searcher with an LRU cache of ``maxsize`` entries."""

    def __init__(self, inner: Searcher, maxsize: int = 10000):
        self.inner = inner
        self.cache = LRUCache(maxsize)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        return cached_batch(self.cache, queries, k, self.inner.batch_search)
