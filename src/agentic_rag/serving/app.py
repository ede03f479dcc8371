"""The OpenAI-compatible chat server: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``.

:func:`create_app` wires a :class:`~.agent.ChatAgent` to a :class:`~.scheduler.Scheduler` (one engine thread, a
bounded queue) behind FastAPI. The request path: authorise (bearer token, when configured; before a byte of the
body is read) -> read the body (:class:`~agentic_rag.http_guard.BodyGuard`: at most :func:`max_body_bytes`, else
413, and within ``client_timeout_s``, else 408) -> parse and check it (:mod:`.schema`; any problem is a 4xx with a
reason, never a 5xx) -> build the prompt ids off the event loop (the server's tools and the client's listed in the
native dialect; :mod:`.conversation`) and the forced opening of a ``tool_choice`` call (:mod:`.client_tools`) -> queue
the job (full queue: 429 + Retry-After) ->
answer as one JSON body or as server-sent events, both made by one :class:`~.replies.ReplyWriter` per request (the
app passes the engine's output through; it holds no reply text logic). A connection whose request head has not
arrived within ``client_timeout_s`` is closed (:mod:`agentic_rag.http_guard`).

A client that goes away is noticed in both modes: a stream's response ends when uvicorn reports the
disconnect, and a plain request polls for it while it waits. Either way the job is cancelled: dropped from
the queue, or its trajectory ends with finish_reason ``cancelled`` at the next decoding step, freeing its
row in the batch.

With ``api_token`` set every ``/v1`` route needs ``Authorization: Bearer <token>`` (compared in constant
time); ``/health`` answers without it but then reports only status and load.

Shutdown (SIGTERM or SIGINT, :mod:`agentic_rag.graceful`): new connections are refused; a request that arrives on
an open connection gets 503 (code ``server_shutting_down``); the replies in flight get ``shutdown_grace_s`` to
finish, and one still running then has its job cancelled and is answered with the same 503 error, or, for a stream
that has begun, with an error chunk and ``data: [DONE]``. Every response says ``Connection: close`` meanwhile.

What an engine failure shows the client is generic ("the agent failed"); the detail (a search server's address,
an exception's text) goes to the server log only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..graceful import Drain, DrainMiddleware, ShuttingDown
from ..http_guard import CLIENT_TIMEOUT_KEY, BodyGuard
from .agent import ChatAgent
from .config import ServeConfig
from .conversation import prompt_ids
from .replies import SSE_DONE, ReplyWriter, sse
from .scheduler import Job, QueueFull, Scheduler
from .schema import APIError, ChatRequest, bad_request, check_request, parse_request

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25


def max_body_bytes(config: ServeConfig) -> int:
    """Room for the largest allowed conversation, JSON-escaped (6 bytes per character at worst)."""
    return config.server.max_messages * (6 * config.server.max_message_chars + 1024) + 65536


class _JobStream(StreamingResponse):
    """A streaming response that cancels its job whenever it ends: finished (harmless), or cut off because
    the client disconnected."""

    def __init__(self, content: AsyncIterator[bytes], job: Job):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


def create_app(agent: ChatAgent, config: ServeConfig) -> FastAPI:
    """The app; the engine thread starts with the app's lifespan and stops (cancelling its jobs) with it."""
    scheduler = Scheduler(agent.engine(), max_batch=config.server.max_batch, queue_size=config.server.queue_size,
                          base_settings=agent.settings)
    model_id = config.served_name
    token = config.server.api_token.encode()
    body_limit = max_body_bytes(config)
    started = time.time()
    server_tools = agent.tools.names()
    server_schemas = agent.tools.schemas()  # listed with the client's tools in the native dialect
    drain = Drain(config.server.shutdown_grace_s, "chat server")

    async def lifespan(app: FastAPI):
        scheduler.start()
        try:
            # the lifespan state: how the draining protocol finds the drain and the request head's deadline
            yield {"drain": drain, CLIENT_TIMEOUT_KEY: config.server.client_timeout_s}
        finally:
            drain.finish()  # every request has been answered by now (uvicorn waits for them)
            await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="agentic-rag chat", lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.agent = agent
    app.state.drain = drain

    def authorised(request: Request) -> bool:
        if not token:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)

    def unauthorised(request: Request) -> APIError | None:
        if authorised(request):
            return None
        reason = "missing bearer token" if "authorization" not in request.headers else "invalid bearer token"
        return APIError(401, f"{reason}: send 'Authorization: Bearer <token>'", code="invalid_api_key",
                        headers={"WWW-Authenticate": "Bearer"})

    def require_auth(request: Request) -> None:
        if (err := unauthorised(request)) is not None:
            raise err

    def admit(scope: dict) -> JSONResponse | None:
        """A /v1 request without the token is answered 401 before its body is read."""
        err = unauthorised(Request(scope)) if scope["path"].startswith("/v1") else None
        return None if err is None else JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    app.add_middleware(BodyGuard, limit=body_limit, timeout_s=config.server.client_timeout_s, reject=_refuse_body,
                       admit=admit)
    app.add_middleware(DrainMiddleware, drain=drain)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        err = APIError(exc.status_code, str(exc.detail))
        return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        load = scheduler.describe()
        out: dict[str, Any] = {"status": "ok", "uptime_s": round(time.time() - started, 1),
                               "queue_depth": load["queue_depth"], "active": load["active"]}
        if authorised(request):
            out.update(agent.info)
            out["scheduler"] = load
            srv = config.server
            out["rollout"] = dataclasses.asdict(agent.settings)
            out["limits"] = {"max_tokens": agent.settings.max_completion_tokens,
                             "max_tokens_limit": srv.max_tokens_limit, "max_prompt_tokens": srv.max_prompt_tokens,
                             "max_message_chars": srv.max_message_chars, "max_messages": srv.max_messages,
                             "context_length": agent.context_length, "client_timeout_s": srv.client_timeout_s}
        return out

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        require_auth(request)
        return {"object": "list", "data": [{"id": model_id, "object": "model", "created": int(started),
                                            "owned_by": "agentic-rag"}]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str, request: Request) -> dict[str, Any]:
        require_auth(request)
        if name != model_id:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {model_id!r}",
                           param="model", code="model_not_found")
        return {"id": model_id, "object": "model", "created": int(started), "owned_by": "agentic-rag"}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        require_auth(request)
        if drain.draining:  # a reply would not be done before the process exits: let the client go elsewhere now
            drain.refuse()
            raise shutting_down()
        req = check_request(parse_request(await _read_json(request, body_limit)), config,
                            dialect=agent.settings.dialect, server_tools=server_tools)
        listed = server_schemas + req.tools.listed if agent.dialect.native else None
        try:
            ids = await asyncio.to_thread(prompt_ids, agent.tokenizer, req.messages, agent.settings.dialect,
                                          agent.prompt, tools=listed)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - text the tokenizer or the chat template refuses is bad input
            raise bad_request(f"the messages cannot be templated and tokenized: {type(exc).__name__}: "
                              f"{str(exc)[:200]}", "messages") from None
        req = _fit_context(len(ids), req, config, agent.context_length)
        forced = req.tools.forced_ids(agent.tokenizer)
        room = min(req.sampling.max_tokens, agent.settings.max_tokens_per_turn)
        if forced and len(forced) >= room:
            raise bad_request(f"the tool call that tool_choice makes the server open is {len(forced)} tokens, and the "
                              f"reply may have {room}: ask for a larger max_tokens", "max_tokens")
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()

        def sink(kind: str, payload: Any) -> None:
            loop.call_soon_threadsafe(inbox.put_nowait, (kind, payload))

        job = Job(ids, req.question, req.sampling, sink, stream=req.stream, client_tools=req.tools.handed_over,
                  forced=forced, single_turn=req.tools.single_turn)
        try:
            scheduler.submit(job)
        except QueueFull as exc:
            raise APIError(429, f"{exc}; the server is at capacity", code="queue_full",
                           headers={"Retry-After": str(exc.retry_after_s)}) from None
        reply = ReplyWriter(model_id, agent.tokenizer, agent.dialect, include_usage=req.include_usage,
                            tools=req.tools, forced=forced)
        if req.stream:
            return _JobStream(_stream(job, inbox, reply, drain), job)
        return await _wait(request, job, inbox, reply, drain)

    return app


def shutting_down() -> APIError:
    """The answer to a request the shutdown does not let run or finish: 503 in OpenAI's error shape."""
    return APIError(503, "the server is shutting down; send the request again (to another server, or to this one "
                         "once it is back)", code="server_shutting_down")


def _refuse_body(status: int, reason: str) -> JSONResponse:
    """:class:`~agentic_rag.http_guard.BodyGuard`'s answer to a body too large (413) or too slow (408), in OpenAI's
    error shape."""
    return JSONResponse(APIError(status, reason).body(), status_code=status)


async def _read_json(request: Request, limit: int) -> Any:
    """The request's JSON body. :class:`~agentic_rag.http_guard.BodyGuard` has already read it, at most ``limit``
    bytes (it refuses a longer one while it arrives), so ``request.body()`` holds no more than that; without the
    guard a chunked body would be read whole. The content-length check repeats the guard's early refusal."""
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise APIError(413, f"request body over {limit} bytes")
    body = await request.body()
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise bad_request(f"malformed JSON body: {str(exc)[:200] or type(exc).__name__}") from None


def _fit_context(n: int, req: ChatRequest, config: ServeConfig, context_length: int | None) -> ChatRequest:
    """The request with its completion budget inside the model's context: the server's default max_tokens is cut
    to what the context leaves after the ``n`` prompt tokens; a max_tokens the client asked for that does not fit
    is refused, saying how much fits."""
    if n > config.server.max_prompt_tokens:
        raise bad_request(f"the conversation is {n} tokens; the limit is {config.server.max_prompt_tokens}",
                          "messages")
    if not context_length or n + req.sampling.max_tokens <= context_length:
        return req
    room = context_length - n
    if room < 1:
        raise bad_request(f"the conversation ({n} tokens) fills the model's context of {context_length} tokens: "
                          "shorten it", "messages")
    if req.max_tokens_given:
        raise bad_request(f"the conversation ({n} tokens) plus max_tokens ({req.sampling.max_tokens}) exceeds the "
                          f"model's context of {context_length} tokens: ask for at most {room}", "max_tokens")
    return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, max_tokens=room))


async def _wait(request: Request, job: Job, inbox: asyncio.Queue, reply: ReplyWriter, drain: Drain):
    """A plain request: wait for the result, cancelling the job if the client goes away meanwhile, or if a shutdown's
    grace period ends first (then the answer is 503 ``server_shutting_down``)."""
    while True:
        try:
            kind, payload = await drain.race(asyncio.wait_for(inbox.get(), DISCONNECT_POLL_S))
            break
        except TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                return JSONResponse(APIError(499, "client closed the request").body(), status_code=499)
        except ShuttingDown:
            job.cancel()
            err = shutting_down()
            return JSONResponse(err.body(), status_code=err.status)
    if kind == "error":
        err = _failure(job, payload)
        return JSONResponse(err.body(), status_code=err.status)
    return JSONResponse(reply.completion(payload))


def _failure(job: Job, exc: Exception) -> APIError:
    """The client's view of an engine failure: generic (the scheduler has logged the exception, which may name a
    search server's address or hold a backend's message)."""
    if job.cancelled:
        return APIError(499, "client closed the request")
    return APIError(500, "the agent failed on this request (internal error; the server log has the details)",
                    code="agent_failed")


async def _stream(job: Job, inbox: asyncio.Queue, reply: ReplyWriter, drain: Drain) -> AsyncIterator[bytes]:
    """Server-sent events: the reply's chunks as the engine's output arrives (role first; reasoning and content
    deltas and agent events; the last chunk with finish_reason and the trace, optional usage), then ``[DONE]``.
    An engine failure, or a shutdown's grace period ending first, ends the stream with an error object and
    ``[DONE]``."""
    yield sse(reply.opening())
    while not reply.finished:
        try:
            items = [await drain.race(inbox.get())]
        except ShuttingDown:
            job.cancel()
            yield sse([shutting_down().body()])
            break
        while not inbox.empty():
            items.append(inbox.get_nowait())
        out: list[dict[str, Any]] = []
        failed = False
        for kind, payload in items:
            if kind == "error":
                out.append(_failure(job, payload).body())
                failed = True
                break
            out += reply.feed(kind, payload)
        if out:
            yield sse(out)
        if failed:
            break
    yield SSE_DONE
