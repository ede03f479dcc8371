"""A Searcher over HTTP: talks to ``agentic-rag serve-search`` with timeouts, retries and an LRU cache.

* Timeouts on connect and read; transport errors, 429 and 5xx are retried with exponential backoff
  (``backoff * 2**attempt``, honouring ``Retry-After`` up to the request timeout, so a server asking for an
  hour cannot stall a rollout for an hour), at most ``retries`` times; a 4xx other than 429 is the caller's
  mistake and raises at once with the server's reason. A reply that is not the JSON object the server
  sends (a proxy's HTML page, say) raises :class:`SearchError`.
* The server's limits (``GET /health``, read once): ``k`` is capped at its ``max_k`` and batches are cut to
  its ``max_batch``, so a caller asking for more (the rollout engine asks ``passages + 20`` to skip passages
  already shown) gets at most ``max_k`` hits instead of a 422 on every search.
* A query the server could not answer (an ``"errors"`` entry) fails alone: :class:`PartialSearchError`
  carries the other queries' hits.
* ``TCP_NODELAY`` on the client socket. With Nagle's algorithm on, a message written in two pieces waits
  for the peer's delayed ACK (~40 ms): a standard-library ``http.server`` answering that way managed 22
  requests/s instead of 560. The server side is uvicorn (asyncio sets TCP_NODELAY on every connection);
  the client sets it too, so neither direction depends on how a library happens to split its writes.
* An LRU cache: GRPO sends each question's queries ``num_generations`` times.
"""

from __future__ import annotations

import logging
import random
import socket
import time
from collections.abc import Sequence
from typing import Any

import httpx

from .cache import LRUCache, cached_batch
from .types import MAX_QUERY_CHARS, Hit, PartialSearchError, SearchError

log = logging.getLogger(__name__)
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
        self.timeout, self.retries, self.backoff, self.max_batch = timeout, retries, backoff, max_batch
        self.cache = LRUCache(cache_size)
        self._client = http_client(timeout)
        self._limits: dict[str, Any] | None = None
        self._warned_k = False
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

    def server_limits(self) -> dict[str, Any]:
        """The server's ``limits`` from ``/health``: asked once, in one attempt. {} when the server does not
        say (an older server, a proxy); when it cannot be reached, {} now and asked again next time."""
        if self._limits is None:
            try:
                resp = self._client.get(self.url + "/health")
            except httpx.TransportError:
                return {}
            try:
                limits = resp.json().get("limits") if resp.status_code == 200 else None
            except (ValueError, AttributeError):
                limits = None
            self._limits = limits if isinstance(limits, dict) else {}
        return self._limits

    def search(self, query: str, k: int = 10) -> list[Hit]:
        return self.batch_search([query], k)[0]

    def batch_search(self, queries: Sequence[str], k: int = 10) -> list[list[Hit]]:
        return cached_batch(self.cache, queries, k, self._fetch)

    def _fetch(self, queries: list[str], k: int) -> list[list[Hit]]:
        # Queries arrive cleaned (cached_batch); an empty one has no hits and is never sent.
        out: list[list[Hit] | None] = [[] for _ in queries]
        errors: list[str | None] = [None] * len(queries)
        todo = [i for i, q in enumerate(queries) if q]
        if not todo:
            return out  # type: ignore[return-value]
        limits = self.server_limits()
        max_k, max_batch = _positive(limits.get("max_k")), _positive(limits.get("max_batch"))
        max_chars = _positive(limits.get("max_query_chars")) or MAX_QUERY_CHARS
        if max_k and k > max_k:
            if not self._warned_k:
                log.warning("%s serves at most k=%d hits per query; asked for %d, capped (raise serve-search "
                            "--max-k to get more)", self.url, max_k, k)
                self._warned_k = True
            k = max_k
        step = min(self.max_batch, max_batch or self.max_batch)
        for start in range(0, len(todo), step):
            chunk = todo[start:start + step]
            body = self._request("POST", "/batch_search",
                                 {"queries": [queries[i][:max_chars] for i in chunk], "k": k})
            results, chunk_errors = body.get("results"), body.get("errors") or [None] * len(chunk)
            if not isinstance(results, list) or len(results) != len(chunk) \
                    or not isinstance(chunk_errors, list) or len(chunk_errors) != len(chunk):
                raise SearchError(f"{self.url}/batch_search returned a malformed body: {str(body)[:200]}")
            for i, rows, error in zip(chunk, results, chunk_errors, strict=True):
                if error is not None:
                    out[i], errors[i] = None, str(error)
                else:
                    out[i] = [Hit.from_dict(r) for r in rows]
        if any(e is not None for e in errors):
            raise PartialSearchError(out, errors)
        return out  # type: ignore[return-value]

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
                    return _json_object(resp, url)
                reason = _reason(resp)
                if resp.status_code == 429 or resp.status_code >= 500:
                    last = f"HTTP {resp.status_code}: {reason}"
                    retry_after = resp.headers.get("retry-after")
                    if retry_after and retry_after.replace(".", "", 1).isdigit():
                        # honoured, but never longer than a request may take: the caller has a deadline too
                        delay = max(delay, min(float(retry_after), self.timeout))
                else:
                    raise SearchRequestError(f"{url} rejected the request (HTTP {resp.status_code}): {reason}")
            if attempt < self.retries:
                time.sleep(delay)
        raise SearchError(f"search server {url} failed after {self.retries + 1} attempts: {last}")


def _json_object(resp: httpx.Response, url: str) -> dict[str, Any]:
    """The reply's JSON object, or SearchError naming what came instead (not a bare ValueError)."""
    try:
        body = resp.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise SearchError(f"{url} answered HTTP {resp.status_code} with a body that is not a JSON object "
                          f"(content-type {resp.headers.get('content-type')!r}): {resp.text[:200]!r}")
    return body


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _reason(resp: httpx.Response) -> str:
    try:
        detail = resp.json().get("detail")
        return detail if isinstance(detail, str) else str(detail)
    except (ValueError, AttributeError):
        return resp.text[:200]
