"""What both HTTP servers (``serve-search`` and the chat server) do with untrusted clients: a client may send too
much, or send it too slowly, and neither may cost the server more than a bounded amount of memory or time.

* :class:`BodyGuard` (ASGI middleware) reads each request's body before the app sees it. A body over the limit is
  refused with 413 as soon as its content-length says so or, for a chunked upload without one, as soon as the
  bytes received pass the limit: at most the limit is ever held in memory (the chat server used to read a whole
  chunked body and then refuse it: +194 MiB peak for a 100 MiB upload). A body that has not fully arrived within
  ``client_timeout_s`` of the request head is answered 408. Both answers close the connection, and each server
  words them in its own error shape (``reject``).
* :class:`GuardedH11Protocol` (uvicorn's h11 protocol) drops a connection whose request head (request line and
  headers) has not fully arrived within ``client_timeout_s`` of the connection opening, or of the first byte of the
  next request on a keep-alive connection (a "slowloris" client, sending a byte now and then, used to hold a
  connection and its buffers for as long as it liked, and a connection that sent nothing was never closed). The
  time between a response and the next request's first byte is uvicorn's keep-alive timeout, as before.

Both deadlines are one setting, ``client_timeout_s`` (default :data:`DEFAULT_CLIENT_TIMEOUT_S`): the head and the
body must each arrive within it. The protocol reads it from the app's lifespan state (key
:data:`CLIENT_TIMEOUT_KEY`, next to ``drain``), as :mod:`agentic_rag.graceful` finds the app's drain there;
:class:`~agentic_rag.graceful.DrainingH11Protocol` extends :class:`GuardedH11Protocol`, so both servers get it.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from typing import Any

import h11
from starlette.responses import Response
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

DEFAULT_CLIENT_TIMEOUT_S = 20.0
CLIENT_TIMEOUT_KEY = "client_timeout_s"  # in the lifespan state an app yields

Reject = Callable[[int, str], Response]  # (status, reason) -> the response, in the app's own error shape


def check_timeout(seconds: float) -> float:
    """``seconds`` as a client deadline, or ValueError: it must be a finite number > 0."""
    if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"the client timeout must be a finite number of seconds > 0, got {seconds!r}")
    return float(seconds)


class _TooLarge(Exception):
    """The body passed the limit while it arrived."""


class BodyGuard:
    """ASGI middleware: reads each HTTP request's body, at most ``limit`` bytes of it and within ``timeout_s`` of the
    request head, then hands the app the body it read. 413 for a body over the limit (by its content-length header,
    or by the bytes received), 408 for one too slow; ``reject(status, reason)`` makes either response, and this adds
    ``Connection: close`` to it (the rest of the body is never read). ``admit(scope)``, when given, may answer a
    request before its body is read (an unauthorised one: a client without the token costs no body buffer). A
    client that goes away before its body is complete gets no answer and the app never sees the request."""

    def __init__(self, app: Any, *, limit: int, timeout_s: float, reject: Reject,
                 admit: Callable[[dict], Response | None] | None = None):
        if limit < 0:
            raise ValueError(f"the body limit must be >= 0 bytes, got {limit}")
        self.app, self.limit, self.timeout_s, self.reject = app, limit, check_timeout(timeout_s), reject
        self.admit = admit

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.admit(scope) if self.admit is not None else None
        if refusal is not None:  # e.g. no valid bearer token: answered before a byte of the body is read
            refusal.headers["connection"] = "close"
            await refusal(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            await self._refuse(413, f"request body over {self.limit} bytes", scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive)
        except _TooLarge:
            await self._refuse(413, f"request body over {self.limit} bytes", scope, receive, send)
            return
        except TimeoutError:
            await self._refuse(408, f"the request body did not arrive within {self.timeout_s:g} s", scope, receive,
                               send)
            return
        if body is None:  # the client went away: nobody to answer
            return
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the disconnect, when it comes

        await self.app(scope, replay, send)

    async def _read(self, receive: Any) -> bytes | None:
        """The whole body, or None when the client disconnected first; :class:`_TooLarge` past the limit."""
        buffer = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            buffer += message.get("body", b"")
            if len(buffer) > self.limit:
                raise _TooLarge
            if not message.get("more_body", False):
                return bytes(buffer)

    async def _refuse(self, status: int, reason: str, scope: dict, receive: Any, send: Any) -> None:
        response = self.reject(status, reason)
        response.headers["connection"] = "close"
        await response(scope, receive, send)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol, with a deadline for each request head: a connection is closed (nothing is answered)
    when the request line and headers have not fully arrived within ``client_timeout_s`` (the app's lifespan state,
    else :data:`DEFAULT_CLIENT_TIMEOUT_S`) of the connection opening, or of the first byte of the next request on a
    keep-alive connection, or of a response's end when the next request's first bytes had already come with the
    last one (pipelined). The body's deadline is :class:`BodyGuard`'s."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._head_timer: asyncio.TimerHandle | None = None

    @property
    def client_timeout_s(self) -> float:
        value = self.app_state.get(CLIENT_TIMEOUT_KEY)
        return float(value) if value else DEFAULT_CLIENT_TIMEOUT_S

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def data_received(self, data: bytes) -> None:
        if self._head_timer is None and self.conn.their_state is h11.IDLE:
            self._start_head_timer()  # the first bytes of the next request on a kept-alive connection
        super().data_received(data)
        self._stop_head_timer_once_read()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start on a next request that was already received, whole or in part
        self._stop_head_timer_once_read()
        if self._head_timer is None and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _start_head_timer(self) -> None:
        self._cancel_head_timer()
        self._head_timer = self.loop.call_later(self.client_timeout_s, self._head_too_slow)

    def _stop_head_timer_once_read(self) -> None:
        if self._head_timer is not None and self.conn.their_state is not h11.IDLE:
            self._cancel_head_timer()  # the head is in (h11 has moved on to the body), or the connection is done

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_slow(self) -> None:
        self._head_timer = None
        if self.conn.their_state is not h11.IDLE or self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        log.info("closed the connection of %s: no complete request head within %g s", client, self.client_timeout_s)
        self._unset_keepalive_if_required()
        self.transport.close()
