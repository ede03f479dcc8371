"""A Searcher over HTTP: talks to ``agentic-rag serve-search`` with timeouts, retries and an LRU cache.

* Timeouts on connect and read; transport errors, 429 and 5xx are retried with exponential backoff
  (``backoff * 2**attempt``, honouring ``Retry-After``), at most ``retries`` times; a 4xx other than 429
  is the caller's mistake and raises at once with the server's reason.
* ``TCP_NODELAY`` on the client socket. With Nagle's algorithm on, a message written in two pieces waits
  for the peer's delayed ACK (~40 ms): a standard-library ``http.server`` answering that way managed 22
  requests/s instead of 560. The server side is uvicorn (asyncio sets TCP_NODELAY on every connection);
  the client sets it too, so neither direction depends on how a library happens to split its writes.
* An LRU cache: GRPO sends each question's queries ``num_generations`` times.
"""

from __future__ import annotations

import random
import socket
import time
from collections.abc import Sequence
from typing import Any

import httpx

from .cache import LRUCache, cached_batch
from .types import MAX_QUERY_CHARS, Hit, SearchError

NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]


class SearchRequestError(SearchError):
    """The server rejected a request (4xx): retrying would not help."""


def http_client(timeout: float, *, pool: int = 32) -> httpx.Client:
    """An httpx client with TCP_NODELAY sockets and keep-alive, shared by this module and the tools."""
    transport = httpx.HTTPTransport(socket_options=NODELAY, retries=0,
                                    limits=httpx.Limits(max_connections=pool, max_keepalive_connections=pool))
    return httpx.Client(transport=transport, timeout=httpx.Timeout(timeout, connect=min(timeout, 5.0)))


class HTTPSearcher:
    """``search`` / ``batch_search`` against a retrieval server at ``url``."""

    def __init__(self, url: str, *, timeout: float = 10.0, retries: int = 3, backoff: float = 0.2,
                 cache_size: int = 10000, max_batch: int = 256):
        self.url = url.rstrip("/")
        self.retries, self.backoff, self.max_batch = retries, backoff, max_batch
        self.cache = LRUCache(cache_size)
        self._client = http_client(timeout)
        self.requests = 0
        self.retried = 0

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HTTPSearcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/health", None)

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        return cached_batch(self.cache, queries, k, self._fetch)

    def _fetch(self, queries: list[str], k: int) -> list[list[Hit]]:
        # Queries arrive cleaned (cached_batch); an empty one has no hits and is never sent.
        out: list[list[Hit]] = [[] for _ in queries]
        todo = [i for i, q in enumerate(queries) if q]
        for start in range(0, len(todo), self.max_batch):
            chunk = todo[start:start + self.max_batch]
            body = self._request("POST", "/batch_search",
                                 {"queries": [queries[i][:MAX_QUERY_CHARS] for i in chunk], "k": k})
            results = body.get("results")
            if not isinstance(results, list) or len(results) != len(chunk):
                raise SearchError(f"{self.url}/batch_search returned a malformed body: {str(body)[:200]}")
            for i, rows in zip(chunk, results, strict=True):
                out[i] = [Hit.from_dict(r) for r in rows]
        return out

    def _request(self, method: str, path: str, payload: dict | None) -> dict[str, Any]:
        url = self.url + path
        last: str = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self.retried += 1
            self.requests += 1
            delay = self.backoff * (2 ** attempt) * (1 + 0.25 * random.random())
            try:
                resp = self._client.request(method, url, json=payload)
            except httpx.TransportError as exc:  # connect/read timeout, refused, reset
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code < 400:
                    return resp.json()
                reason = _reason(resp)
                if resp.status_code == 429 or resp.status_code >= 500:
                    last = f"HTTP {resp.status_code}: {reason}"
                    retry_after = resp.headers.get("retry-after")
                    if retry_after and retry_after.replace(".", "", 1).isdigit():
                        delay = max(delay, float(retry_after))
                else:
                    raise SearchRequestError(f"{url} rejected the request (HTTP {resp.status_code}): {reason}")
            if attempt < self.retries:
                time.sleep(delay)
        raise SearchError(f"search server {url} failed after {self.retries + 1} attempts: {last}")


def _reason(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
        return detail if isinstance(detail, str) else str(detail)
    except (ValueError, AttributeError):
        return resp.text[:200]
