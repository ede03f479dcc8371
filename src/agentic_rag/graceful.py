"""Graceful shutdown for the two HTTP servers (``serve-search`` and the chat server): on SIGTERM or SIGINT a server
stops accepting connections, lets the requests in flight finish within a grace period, answers those it cannot
finish with an error its clients understand, logs one line when the shutdown starts and one when it ends, and
exits with status 0.

What uvicorn 0.54 does by itself (``Server.shutdown``), and why each step lost requests:

1. it closes the listening sockets: new connections are refused, as they should be;
2. it calls ``shutdown()`` on every open connection. An *idle* keep-alive connection is closed at once, but idle
   is the server's view: a client in a loop has usually already sent its next request on it, so the close meets
   unread data and the kernel answers with a reset (``ReadError``/``RemoteProtocolError`` at the client: the
   request was sent and is lost). A connection with a request in progress is closed after its response, but the
   response does not say ``Connection: close``, so a client that reuses it at once races the close the same way;
3. it waits for the requests in flight, with no limit or up to ``timeout_graceful_shutdown``; past that it
   cancels them, and uvicorn answers a cancelled plain request with a ``text/plain`` 500 and cuts a stream off
   without its last chunk or ``data: [DONE]``;
4. it runs the lifespan shutdown, then raises the signal again, so the process ends "killed by SIGTERM".

What this module changes:

* :class:`DrainingH11Protocol` (uvicorn's h11 protocol, with :mod:`agentic_rag.http_guard`'s deadline for slow
  clients) leaves an idle keep-alive connection open for :data:`DRAIN_IDLE_S` after its last response: a request
  the client sent meanwhile is answered (with ``Connection: close``) instead of reset; a connection idle that long
  is closed. A response already under way when the shutdown starts (a stream) cannot say ``Connection: close`` any
  more, so its connection is not closed when it ends but turns idle the same way.
* :class:`DrainMiddleware` counts the requests in flight and, once the shutdown has begun, marks every response
  ``Connection: close``, so no client reuses a connection the server is about to close.
* :class:`Drain` holds the grace period: :meth:`Drain.race` awaits a request's work unless the grace period ends
  first, and then raises :class:`ShuttingDown` so the app answers with its own error shape (the search server
  503 ``{"detail": "server shutting down"}``; the chat server an OpenAI error, or an error chunk and ``[DONE]``
  in a stream). uvicorn's own cancellation stays as a backstop :data:`BACKSTOP_S` later.
* :func:`run` runs the server in this process and returns normally after the shutdown, instead of dying by the
  re-raised signal.

An app wires it up by creating a :class:`Drain`, adding :class:`DrainMiddleware`, yielding ``{"drain": drain}``
(with its ``client_timeout_s``, :mod:`agentic_rag.http_guard`) from its lifespan (which is how the protocol finds
them) and calling :meth:`Drain.finish` when the lifespan ends; its server config takes :func:`uvicorn_options`. With
several worker processes (``serve-search --workers``) uvicorn's supervisor forwards SIGTERM to each worker, and each
worker drains the same way.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Awaitable
from typing import Any, TypeVar

import uvicorn

from .http_guard import GuardedH11Protocol

log = logging.getLogger(__name__)

T = TypeVar("T")

DRAIN_IDLE_S = 0.5  # an idle keep-alive connection gets this long after its last response to send one more request
BACKSTOP_S = 5.0  # uvicorn cancels what is still running this long after the grace period


class ShuttingDown(Exception):
    """The grace period of a shutdown ended before this request's work did."""


class Drain:
    """One server's shutdown: how many requests are in flight, when the shutdown began, and the grace period.

    Counters (event loop thread only): ``in_flight`` now; at the end, how many were in flight when it began, how
    many requests ended after it began (``finished``: answered normally), ``cut_off`` (answered with a shutdown
    error when the grace period ended) and ``refused`` (new work refused because the server was shutting down)."""

    def __init__(self, grace_s: float, name: str = "server"):
        if grace_s < 0:
            raise ValueError(f"the shutdown grace period must be >= 0 seconds, got {grace_s}")
        self.grace_s, self.name = float(grace_s), name
        self.in_flight = 0
        self.in_flight_at_start = 0
        self.ended = 0
        self.cut_off = 0
        self.refused = 0
        self.started_at: float | None = None
        self._over = False
        self._finished = False
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None

    @property
    def draining(self) -> bool:
        """The shutdown has begun: no new connections, every response closes its connection."""
        return self.started_at is not None

    @property
    def idle_s(self) -> float:
        return min(DRAIN_IDLE_S, self.grace_s)

    def _cutoff(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._event is None or self._loop is not loop:
            self._loop, self._event = loop, asyncio.Event()
            if self._over:
                self._event.set()
        return self._event

    def begin(self) -> None:
        """The shutdown starts (idempotent): log it and start the grace period. Called from the event loop."""
        if self.started_at is not None:
            return
        self.started_at = time.monotonic()
        self.in_flight_at_start = self.in_flight
        log.info("%s shutting down: %d request(s) in flight, %g s to finish them; new connections are refused",
                 self.name, self.in_flight, self.grace_s)
        self._timer = asyncio.get_running_loop().call_later(self.grace_s, self._end_grace)

    def _end_grace(self) -> None:
        self._over = True
        if self.in_flight:
            log.warning("%s: the %g s shutdown grace period is over; answering the %d request(s) still running "
                        "with a shutdown error", self.name, self.grace_s, self.in_flight)
        self._cutoff().set()

    async def race(self, work: Awaitable[T]) -> T:
        """``await work``, unless the grace period ends first: then ``work`` is cancelled, the request is counted
        as cut off and :class:`ShuttingDown` is raised."""
        task = asyncio.ensure_future(work)
        cutoff = self._cutoff()
        if not cutoff.is_set():
            waiter = asyncio.ensure_future(cutoff.wait())
            try:
                await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                task.cancel()
                raise
            finally:
                waiter.cancel()
        if task.done():
            return task.result()
        task.cancel()
        self.cut_off += 1
        raise ShuttingDown(f"{self.name} shutting down")

    def refuse(self) -> None:
        """Count a request refused because the server is shutting down."""
        self.refused += 1

    def finish(self) -> None:
        """The server has stopped serving (its lifespan ends): log how the shutdown went, once."""
        if self._finished:
            return
        self.begin()
        self._finished = True
        if self._timer is not None:
            self._timer.cancel()
        finished = max(0, self.ended - self.cut_off - self.refused)
        log.info("%s shut down in %.2f s: %d request(s) were in flight, %d finished, %d cut off, %d refused",
                 self.name, time.monotonic() - (self.started_at or time.monotonic()), self.in_flight_at_start,
                 finished, self.cut_off, self.refused)


class DrainMiddleware:
    """ASGI middleware: counts the HTTP requests in flight for ``drain`` and, once the shutdown has begun, answers
    every response with ``Connection: close`` (the client then never reuses a connection the server closes)."""

    def __init__(self, app: Any, drain: Drain):
        self.app, self.drain = app, drain

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        drain = self.drain

        async def send_closing(message: dict) -> None:
            if message["type"] == "http.response.start" and drain.draining:
                headers = [(k, v) for k, v in message.get("headers", []) if k.lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        drain.in_flight += 1
        try:
            await self.app(scope, receive, send_closing)
        finally:
            drain.in_flight -= 1
            if drain.draining:
                drain.ended += 1


class DrainingH11Protocol(GuardedH11Protocol):
    """uvicorn's h11 protocol (with :class:`~agentic_rag.http_guard.GuardedH11Protocol`'s deadline for a request
    head), except that the shutdown never closes a connection the client may be sending on.

    * An idle keep-alive connection stays open for ``drain.idle_s`` after its last response (instead of being
      closed at once), so a request the client has already sent on it is answered, not reset.
    * A request whose response has not started is answered with ``Connection: close`` (:class:`DrainMiddleware`)
      and the connection closed after it: the client knows not to reuse it.
    * A response already under way (a stream) went out without ``Connection: close``, so its client will reuse the
      connection as soon as the response ends: the connection is then treated as idle, as above, instead of being
      closed under the client's next request.

    It also starts the app's :class:`Drain` (found in the lifespan state)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._idle_since = self.loop.time()

    def _drain(self) -> Drain | None:
        drain = self.app_state.get("drain")
        return drain if isinstance(drain, Drain) else None

    def on_response_complete(self) -> None:
        self._idle_since = self.loop.time()
        super().on_response_complete()
        drain = self._drain()
        if drain is not None and drain.draining and self.timeout_keep_alive_task is not None:
            self._close_when_idle(drain)  # instead of the usual keep-alive timeout

    def _close_when_idle(self, drain: Drain) -> None:
        self._unset_keepalive_if_required()
        wait = max(0.0, self._idle_since + drain.idle_s - self.loop.time())
        self.timeout_keep_alive_task = self.loop.call_later(wait, self.timeout_keep_alive_handler)

    def shutdown(self) -> None:
        drain = self._drain()
        if drain is None:
            super().shutdown()
            return
        drain.begin()
        if self.cycle is not None and not self.cycle.response_complete:
            if not self.cycle.response_started:
                self.cycle.keep_alive = False  # its response says Connection: close; closed once it is sent
            return  # a response under way: the connection turns idle when it ends (on_response_complete)
        if not self.transport.is_closing():
            self._close_when_idle(drain)


def uvicorn_options(grace_s: float) -> dict[str, Any]:
    """The ``uvicorn.Config`` options of a draining server with a grace period of ``grace_s``."""
    return {"http": DrainingH11Protocol, "timeout_graceful_shutdown": grace_s + BACKSTOP_S}


def run(config: uvicorn.Config) -> list[int]:
    """Serve ``config`` in this (the main) thread until SIGTERM or SIGINT and the graceful shutdown after it; returns
    the signals received. uvicorn raises the signal again once it has shut down, which would end the process as
    killed by it; here that lands in a handler that only records it, so the caller can exit 0."""
    server = uvicorn.Server(config)
    received: list[int] = []

    def record(sig: int, frame: Any) -> None:
        received.append(sig)
        server.should_exit = True  # a signal before uvicorn installs its own handlers still stops it

    previous = {sig: signal.signal(sig, record) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return received
