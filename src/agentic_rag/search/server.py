"""The retrieval server: any Searcher behind ``POST /search``, ``POST /batch_search`` and ``GET /health``.

Requests that arrive together are answered together: a background task collects whatever is queued
(up to ``max_batch`` queries) and makes one ``batch_search`` call, which for BM25 is one Lucene batch over
its own threads. Under load this turns many small requests into few large ones; alone, a request waits
for nothing. A bad request (malformed JSON, empty or oversized query, k out of range, too many queries,
oversized body, with or without a content-length header) is answered 4xx with a reason, and the server
keeps serving. A slow client is not waited for (:mod:`agentic_rag.http_guard`): a connection whose request head
has not arrived within ``client_timeout_s`` (default 20 s) is closed, and a body that has not is answered 408.

Request and response bodies::

    POST /search        {"query": "...", "k": 5}        -> {"hits": [{"docid","title","text","score"}, ...]}
    POST /batch_search  {"queries": ["...", ...], "k": 5} -> {"results": [[hit, ...], ...]}
    GET  /health                                          -> {"status": "ok", "limits": {"max_k", ...}, "pid", ...}

With :func:`serve_workers` several spawned processes answer on one port, each with its own searcher.

One query must not fail the requests batched with it. A request whose queries break a limit (empty, too
long) is rejected whole with 422 naming the first bad one, before any search. A query the backend cannot
answer (found by retrying each query of a failed batch alone) fails alone: ``/search`` answers 422 with the
reason; ``/batch_search`` answers 200 with ``[]`` for that query and an ``"errors"`` list (the reason at its
position, ``null`` elsewhere), present only when some query failed. When every query fails, the backend is
down: 500 with the reason. ``/health`` advertises the limits; the HTTP client caps ``k`` at ``max_k``.

Strict inputs: a POST without a JSON content type is answered 415; ``k`` must be a JSON integer (``true``, ``5.0``
and ``"5"`` are 422, not read as counts), the queries JSON strings, and a field the API does not have is 422 (a
misspelt ``"K"`` is not silently replaced by the default).

Shutdown (SIGTERM or SIGINT; :mod:`agentic_rag.graceful`): new connections are refused, the requests in flight are
answered within ``shutdown_grace_s`` (default 10 s), each response closing its connection, and whatever is still
waiting for the backend then gets 503 ``{"detail": "server shutting down"}``; the process exits 0. The backend runs
on a daemon thread, so a search that hangs cannot hold the exit.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import threading
import time
import types
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr
from starlette.exceptions import HTTPException as StarletteHTTPException
from uvicorn.supervisors import Multiprocess

from ..graceful import Drain, DrainMiddleware, ShuttingDown, run, uvicorn_options
from ..http_guard import CLIENT_TIMEOUT_KEY, DEFAULT_CLIENT_TIMEOUT_S, BodyGuard
from .types import MAX_QUERY_CHARS, Hit, PartialSearchError, QueryError, Searcher, isolate_failures

log = logging.getLogger(__name__)


@dataclass
class ServerLimits:
    max_k: int = 100
    max_query_chars: int = MAX_QUERY_CHARS
    max_batch: int = 256
    max_body_bytes: int = 4 << 20
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S  # a request's head, and then its body, must arrive within it


DEFAULT_SHUTDOWN_GRACE_S = 10.0


class SearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    query: StrictStr
    k: StrictInt = 10


class BatchSearchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    queries: list[StrictStr]
    k: StrictInt = 10


FIELDS = {"/search": "query and k", "/batch_search": "queries and k"}


def _require_json(request: Request) -> None:
    """415 for a body that does not say it is JSON (before pydantic would call a form body a bad object)."""
    kind = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if kind != "application/json" and not (kind.startswith("application/") and kind.endswith("+json")):
        raise HTTPException(status_code=415, detail=f"the body must be JSON: send Content-Type: application/json "
                                                    f"(got {kind or 'no content type'!r})")


def _json_kind(value: Any) -> str:
    """How a JSON value reads in an error message: ``boolean true``, ``string '5'``, ``number 5.0``."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    return "null" if value is None else type(value).__name__


def _validate(queries: list[str], k: int, limits: ServerLimits, batch: bool = False) -> None:
    """Raise a 422 naming the first problem with a request's queries or k."""
    problem = None
    if not 1 <= k <= limits.max_k:
        problem = f"k must be between 1 and {limits.max_k}, got {k}"
    elif not queries:
        problem = "queries is empty"
    elif len(queries) > limits.max_batch:
        problem = f"{len(queries)} queries; the limit is {limits.max_batch} per request"
    else:
        for i, q in enumerate(queries):
            where = f"queries[{i}]" if batch else "query"
            if not q.strip():
                problem = f"{where} is empty"
            elif len(q) > limits.max_query_chars:
                problem = f"{where} is {len(q)} characters; the limit is {limits.max_query_chars}"
            if problem:
                break
    if problem:
        raise HTTPException(status_code=422, detail=problem)


@dataclass
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future


Answer = tuple[list[list[Hit]], list[str | None]]  # hits per query ([] where it failed), reason or None


class _SearchThread:
    """One daemon thread that runs the batcher's ``batch_search`` calls in turn (the batcher awaits each before the
    next). A daemon, unlike the event loop's default executor, whose threads the interpreter joins at exit: a
    backend that hangs would hold a shutting-down server past its grace period."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def call(self, fn: Any, *args: Any) -> asyncio.Future:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="search-batches", daemon=True)
            self._thread.start()
        self._jobs.put((loop, future, fn, args))
        return future

    def _work(self) -> None:
        while True:
            loop, future, fn, args = self._jobs.get()
            try:
                outcome, failed = fn(*args), False
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                outcome, failed = exc, True
            try:
                loop.call_soon_threadsafe(_settle, future, outcome, failed)
            except RuntimeError:  # the loop is closed: the server has exited
                pass


def _settle(future: asyncio.Future, outcome: Any, failed: bool) -> None:
    if future.done():
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


@dataclass
class _Batcher:
    """Collects concurrent requests into one ``batch_search`` call on its own thread."""

    searcher: Searcher
    max_batch: int
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    thread: _SearchThread = field(default_factory=_SearchThread)
    batches: int = 0
    queries: int = 0
    query_errors: int = 0

    async def submit(self, queries: list[str], k: int) -> Answer:
        fut = asyncio.get_running_loop().create_future()
        await self.queue.put(_Pending(queries, k, fut))
        return await fut

    async def run(self) -> None:
        while True:
            first = await self.queue.get()
            if first.future.done():  # its request was answered already (cut off by a shutdown, or gone)
                continue
            group = [first]
            n = len(first.queries)
            while not self.queue.empty() and n < self.max_batch:
                item = self.queue.get_nowait()
                if not item.future.done():
                    group.append(item)
                    n += len(item.queries)
            k = max(p.k for p in group)
            flat = [q for p in group for q in p.queries]
            errors: list[str | None] = [None] * len(flat)
            try:
                results = await self.thread.call(isolate_failures, self.searcher.batch_search, flat, k)
            except PartialSearchError as exc:  # some queries failed alone; the others are answered
                results = [hits or [] for hits in exc.results]
                errors = list(exc.errors)
            except QueryError as exc:  # the batch's only query (isolate_failures splits larger ones) is to blame
                results, errors = [[] for _ in flat], [str(exc)] * len(flat)
            except Exception as exc:  # every query failed: a backend failure, each waiting request gets it
                log.exception("batch_search failed")
                for p in group:
                    if not p.future.done():
                        p.future.set_exception(exc)
                continue
            self.batches += 1
            self.queries += len(flat)
            self.query_errors += sum(e is not None for e in errors)
            i = 0
            for p in group:
                if not p.future.done():  # the client may have gone away
                    j = i + len(p.queries)
                    p.future.set_result(([r[:p.k] for r in results[i:j]], errors[i:j]))
                i += len(p.queries)


class _CountRequests:
    """ASGI middleware: counts the HTTP requests (``/health``'s ``requests``)."""

    def __init__(self, app: Any, state: dict[str, Any]):
        self.app, self.state = app, state

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.state["requests"] += 1
        await self.app(scope, receive, send)


def create_app(searcher: Searcher, *, limits: ServerLimits | None = None, info: dict[str, Any] | None = None,
               shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S) -> FastAPI:
    """The FastAPI application serving ``searcher``; ``info`` is added to ``/health``. A shutdown answers the
    requests in flight within ``shutdown_grace_s`` (see the module docstring)."""
    limits = limits or ServerLimits()
    state: dict[str, Any] = {"started": time.time(), "requests": 0, "errors_4xx": 0}
    batcher = _Batcher(searcher, limits.max_batch)
    drain = Drain(shutdown_grace_s, "search server")

    async def lifespan(app: FastAPI):
        task = asyncio.create_task(batcher.run())
        try:
            # the lifespan state: how the draining protocol finds the drain and the request head's deadline
            yield {"drain": drain, CLIENT_TIMEOUT_KEY: limits.client_timeout_s}
        finally:
            drain.finish()  # every request has been answered by now (uvicorn waits for them)
            task.cancel()

    app = FastAPI(title="agentic-rag search", lifespan=lifespan)
    app.state.drain = drain

    def refuse(status: int, reason: str) -> JSONResponse:
        state["errors_4xx"] += 1
        return JSONResponse({"detail": reason}, status_code=status)

    app.add_middleware(BodyGuard, limit=limits.max_body_bytes, timeout_s=limits.client_timeout_s, reject=refuse)
    app.add_middleware(_CountRequests, state=state)
    app.add_middleware(DrainMiddleware, drain=drain)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: HTTPException):
        if 400 <= exc.status_code < 500:
            state["errors_4xx"] += 1
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError):
        state["errors_4xx"] += 1
        reasons = []
        for err in exc.errors():
            if err.get("type") == "json_invalid":
                reasons.append(f"malformed JSON body: {err.get('ctx', {}).get('error', 'cannot parse')}")
                continue
            where = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
            msg = str(err.get("msg", "invalid"))
            if err.get("type") in ("int_type", "string_type", "list_type"):  # strict: say what came instead
                msg += f", got {_json_kind(err.get('input'))}"
            elif err.get("type") == "extra_forbidden":
                msg = f"not a field of this request (it takes {FIELDS.get(request.url.path, 'other fields')})"
            reasons.append(f"{where}: {msg}" if where else msg)
        return JSONResponse({"detail": "; ".join(reasons)}, status_code=422)

    async def answer(queries: list[str], k: int) -> Answer:
        try:
            return await drain.race(batcher.submit(queries, k))
        except ShuttingDown:
            raise HTTPException(status_code=503, detail="server shutting down") from None
        except Exception as exc:  # the backend failed on every query: 500 with the reason, not a bare page
            raise HTTPException(status_code=500,
                                detail=f"the search backend failed: {type(exc).__name__}: {exc}") from exc

    @app.post("/search", dependencies=[Depends(_require_json)])
    async def search(req: SearchRequest) -> dict[str, Any]:
        _validate([req.query], req.k, limits)
        results, errors = await answer([req.query], req.k)
        if errors[0] is not None:
            raise HTTPException(status_code=422, detail=f"query: {errors[0]}")
        return {"hits": [h.to_dict() for h in results[0]]}

    @app.post("/batch_search", dependencies=[Depends(_require_json)])
    async def batch_search(req: BatchSearchRequest) -> dict[str, Any]:
        _validate(req.queries, req.k, limits, batch=True)
        results, errors = await answer(list(req.queries), req.k)
        out: dict[str, Any] = {"results": [[h.to_dict() for h in hits] for hits in results]}
        if any(e is not None for e in errors):
            out["errors"] = errors
        return out

    @app.get("/health")
    async def health() -> dict[str, Any]:
        out = {"status": "ok", "uptime_s": round(time.time() - state["started"], 1),
               "requests": state["requests"], "errors_4xx": state["errors_4xx"],
               "batches": batcher.batches, "queries": batcher.queries, "query_errors": batcher.query_errors,
               "limits": {"max_k": limits.max_k, "max_query_chars": limits.max_query_chars,
                          "max_batch": limits.max_batch, "max_body_bytes": limits.max_body_bytes,
                          "client_timeout_s": limits.client_timeout_s}}
        cache = getattr(searcher, "cache", None)
        if cache is not None:
            out["cache"] = cache.stats()
        out.update(info or {})
        out["pid"] = os.getpid()
        return out

    return app


def serve(searcher: Searcher, host: str = "127.0.0.1", port: int = 8000, *, limits: ServerLimits | None = None,
          info: dict[str, Any] | None = None, log_level: str = "warning",
          shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully and return (uvicorn, one process: the searcher and
    its JVM are not forked)."""
    app = create_app(searcher, limits=limits, info=info, shutdown_grace_s=shutdown_grace_s)
    run(uvicorn.Config(app, host=host, port=port, log_level=log_level, workers=1, access_log=False,
                       **uvicorn_options(shutdown_grace_s)))


WORKER_ENV = "AGENTIC_RAG_SEARCH_WORKER"
WORKER_STARTUP_S = 600  # a worker may take this long to open its searcher before the supervisor gives up on it


class TCPNoDelayConfig(uvicorn.Config):
    """A ``uvicorn.Config`` whose listening socket declares its protocol, so that every connection accepted from it
    gets TCP_NODELAY.

    uvicorn 0.54 binds the socket it hands to its worker processes with ``proto`` 0 (uvicorn issue #3149, open);
    asyncio turns Nagle's algorithm off only on accepted sockets whose ``proto`` is IPPROTO_TCP, so each keep-alive
    response (headers, then body) waited for the client's delayed ACK: a lone client of two workers measured
    64 ms a query against 22 ms from one process (experiments/retrieval/SCALE.md). The same descriptor wrapped
    again reads its real protocol (6) from the kernel, and that survives the pickling into the spawned workers.
    (A class at module level: the supervisor pickles its config into every worker.)"""

    def bind_socket(self) -> socket.socket:
        sock = super().bind_socket()
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return sock
        return socket.socket(fileno=sock.detach())  # family, type and proto read from the descriptor


def serve_workers(options: dict[str, Any], host: str = "127.0.0.1", port: int = 8000, *, workers: int = 2,
                  limits: ServerLimits | None = None, info: dict[str, Any] | None = None,
                  log_level: str = "warning", shutdown_grace_s: float = DEFAULT_SHUTDOWN_GRACE_S) -> int:
    """Serve with ``workers`` processes on one listening socket until interrupted; returns the exit status.

    The socket is bound here (:class:`TCPNoDelayConfig`) and uvicorn's supervisor *spawns* (never forks) the
    workers; each one opens its own searcher from ``options`` (:func:`~agentic_rag.search.index.open_searcher`'s
    keyword arguments): its own JVM and read-only Lucene searcher (pyjnius is neither thread- nor fork-safe, so
    there is no sharing to get wrong), and the FAISS files memory-mapped, so N workers share one copy of the index
    in the page cache (an index FAISS cannot map is held N times). Each worker gets ``cpu_count // workers``
    threads (at least one) for Lucene, FAISS and torch, so N workers do not oversubscribe the cores. The kernel
    hands each new connection to one worker; ``/health`` answers for the worker that got it (its ``pid``).

    A worker that cannot open its searcher writes why to a file this process reads and exits at once with uvicorn's
    start-up failure code; the supervisor then stops, the reason is logged and the status is 1.

    On SIGTERM or SIGINT the supervisor closes its copy of the listening socket (so new connections are refused
    rather than left in the backlog of a socket no worker accepts from any more) and forwards SIGTERM to every
    worker; each drains as :func:`serve` does, and the status is 0.
    """
    import json
    import tempfile

    if workers < 1:
        raise ValueError(f"--workers must be >= 1, got {workers}")
    from .index import is_url

    if not is_url(options["index"]):  # fail here, once, on a missing index rather than in every worker
        from .manifest import IndexManifest

        IndexManifest.load(options["index"])
    fd, failure_file = tempfile.mkstemp(prefix="agentic-rag-search-worker-", suffix=".txt")
    os.close(fd)
    config = {"options": options, "limits": asdict(limits or ServerLimits()), "info": {**(info or {}),
              "workers": workers}, "workers": workers, "failure_file": failure_file,
              "shutdown_grace_s": shutdown_grace_s, "log_level": logging.getLevelName(logging.getLogger().level)}
    os.environ[WORKER_ENV] = json.dumps(config)
    try:
        # what uvicorn.run does for workers > 1, with a listening socket whose accepted connections get TCP_NODELAY
        server_config = TCPNoDelayConfig(f"{__name__}:app_from_environment", factory=True, host=host, port=port,
                                         workers=workers, log_level=log_level, access_log=False,
                                         timeout_worker_healthcheck=WORKER_STARTUP_S,
                                         **uvicorn_options(shutdown_grace_s))
        try:
            _Supervisor(server_config, sockets=[server_config.bind_socket()]).run()
        except KeyboardInterrupt:
            pass
        with open(failure_file, encoding="utf-8") as f:
            failure = f.read().strip()
    finally:
        os.environ.pop(WORKER_ENV, None)
        os.unlink(failure_file)
    if failure:
        log.error("a search worker could not start: %s", failure)
        return 1
    return 0


class _Supervisor(Multiprocess):
    """uvicorn's worker supervisor, closing its own copy of the listening socket before it forwards SIGTERM to the
    workers: each worker closes its copy as its shutdown starts, and once none is open the kernel refuses new
    connections instead of queueing them on a socket nobody accepts from (to be reset when the last copy closes).
    (A class at module level, like :class:`TCPNoDelayConfig`.)"""

    def terminate_all(self) -> None:
        for sock in self.sockets:
            sock.close()
        super().terminate_all()

    def keep_subprocess_alive(self) -> None:
        for process in self.processes:  # restarted workers are new objects: wrap each before its health check
            process._healthcheck = types.MethodType(healthcheck_while_alive, process)
        super().keep_subprocess_alive()


def healthcheck_while_alive(process: Any, timeout: float) -> bool | None:
    """uvicorn's worker health check (``Process._healthcheck``: ping, then the worker's started flag, or None when it
    does not answer within ``timeout``), except that it stops waiting once the worker has died. uvicorn waits on the
    pipe for the whole timeout (here WORKER_STARTUP_S, 600 s) and the supervisor keeps the worker's end of the pipe
    open, so a worker that exits between the ping and its answer (one that could not open its searcher does so at
    once) held the supervisor, and a user's Ctrl-C, for ten minutes. Waits in half-second slices instead."""
    import pickle

    try:
        process.parent_conn.send(b"ping")
        deadline = time.monotonic() + timeout
        while True:
            if process.parent_conn.poll(max(0.0, min(0.5, deadline - time.monotonic()))):
                return process.parent_conn.recv()
            if not process.process.is_alive() or time.monotonic() >= deadline:
                return None
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def app_from_environment() -> FastAPI:
    """The application of one worker of :func:`serve_workers` (uvicorn calls this in each spawned process)."""
    import json
    import sys

    config = json.loads(os.environ[WORKER_ENV])
    from ..logs import configure_logging

    configure_logging(config.get("log_level") or "WARNING")  # a spawned worker starts with logging unconfigured
    threads = max(1, (os.cpu_count() or 1) // config["workers"])
    try:
        options = dict(config["options"])
        if options.get("retriever") != "bm25":
            import faiss
            import torch

            faiss.omp_set_num_threads(threads)
            torch.set_num_threads(threads)
        from .index import open_searcher

        if options.get("threads") is None:
            options["threads"] = threads
        searcher = open_searcher(**options)
    except Exception as exc:
        with open(config["failure_file"], "a", encoding="utf-8") as f:
            f.write(f"{type(exc).__name__}: {exc}\n")
        from uvicorn.config import STARTUP_FAILURE

        # at once, without the interpreter's shutdown (seconds with torch and a JVM loaded): the supervisor pings
        # each worker every half second and waits up to WORKER_STARTUP_S for the answer, and a worker that stops
        # answering while it shuts down would hold the supervisor, and a user's Ctrl-C, that long
        sys.stderr.flush()
        os._exit(STARTUP_FAILURE)
    return create_app(searcher, limits=ServerLimits(**config["limits"]), info=config["info"],
                      shutdown_grace_s=config.get("shutdown_grace_s", DEFAULT_SHUTDOWN_GRACE_S))


def hits_from_json(rows: Sequence[dict[str, Any]]) -> list[Hit]:
    return [Hit.from_dict(r) for r in rows]
