"""The OpenAI-compatible chat server: ``POST /v1/chat/completions``, ``GET /v1/models``, ``GET /health``.

:func:`create_app` wires a :class:`~.agent.ChatAgent` to a :class:`~.scheduler.Scheduler` (one engine
thread, a bounded queue) behind FastAPI. The request path: authorise (bearer token, when configured) ->
read the body (size-limited) -> parse and check it (:mod:`.schema`; any problem is a 4xx with a reason,
never a 5xx) -> build the prompt ids off the event loop -> queue the job (full queue: 429 + Retry-After)
-> answer as one JSON body or as server-sent events (:mod:`.replies`).

A client that goes away is noticed in both modes: a stream's response ends when uvicorn reports the
disconnect, and a plain request polls for it while it waits. Either way the job is cancelled: dropped from
the queue, or its trajectory ends with finish_reason ``cancelled`` at the next decoding step, freeing its
row in the batch.

With ``api_token`` set every ``/v1`` route needs ``Authorization: Bearer <token>`` (compared in constant
time); ``/health`` answers without it but then reports only status and load.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .agent import ChatAgent
from .config import ServerConfig
from .conversation import prompt_ids
from .replies import ReplyIds, TurnText, agent_trace, model_turns, openai_finish_reason, pieces_to_chunks, reply_content
from .scheduler import Job, QueueFull, Scheduler
from .schema import APIError, ChatRequest, bad_request, check_request, parse_request

log = logging.getLogger(__name__)

DISCONNECT_POLL_S = 0.25


def max_body_bytes(config: ServerConfig) -> int:
    """Room for the largest allowed conversation, JSON-escaped (6 bytes per character at worst)."""
    return config.max_messages * (6 * config.max_message_chars + 1024) + 65536


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


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, default=str).encode() + b"\n\n"


def create_app(agent: ChatAgent, config: ServerConfig) -> FastAPI:
    """The app; the engine thread starts with the app's lifespan and stops (cancelling its jobs) with it."""
    scheduler = Scheduler(agent.engine(), max_batch=config.max_batch, queue_size=config.queue_size,
                          base_limits=agent.limits)
    model_id = config.served_name
    token = config.api_token.encode()
    body_limit = max_body_bytes(config)
    started = time.time()

    async def lifespan(app: FastAPI):
        scheduler.start()
        try:
            yield
        finally:
            await asyncio.to_thread(scheduler.stop)

    app = FastAPI(title="agentic-rag chat", lifespan=lifespan)
    app.state.scheduler = scheduler
    app.state.agent = agent

    def authorised(request: Request) -> bool:
        if not token:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token)

    def require_auth(request: Request) -> None:
        if authorised(request):
            return
        reason = "missing bearer token" if "authorization" not in request.headers else "invalid bearer token"
        raise APIError(401, f"{reason}: send 'Authorization: Bearer <token>'", code="invalid_api_key",
                       headers={"WWW-Authenticate": "Bearer"})

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
            out["limits"] = {"max_tokens": config.max_tokens, "max_tokens_limit": config.max_tokens_limit,
                             "max_prompt_tokens": config.max_prompt_tokens,
                             "max_message_chars": config.max_message_chars, "max_messages": config.max_messages,
                             "max_searches": config.max_searches, "max_turns": config.max_turns}
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
        req = check_request(parse_request(await _read_json(request, body_limit)), config)
        try:
            ids = await asyncio.to_thread(prompt_ids, agent.tokenizer, req.messages, agent.dialect.name,
                                          agent.language)
        except Exception as exc:  # noqa: BLE001 - text the tokenizer or the chat template refuses is bad input
            raise bad_request(f"the messages cannot be templated and tokenized: {type(exc).__name__}: "
                              f"{str(exc)[:200]}", "messages") from None
        _check_prompt(len(ids), req, config, agent.context_length)
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue = asyncio.Queue()

        def sink(kind: str, payload: Any) -> None:
            loop.call_soon_threadsafe(inbox.put_nowait, (kind, payload))

        job = Job(ids, req.question, req.sampling, sink, stream=req.stream)
        try:
            scheduler.submit(job)
        except QueueFull as exc:
            raise APIError(429, f"{exc}; the server is at capacity", code="queue_full",
                           headers={"Retry-After": str(exc.retry_after_s)}) from None
        reply = ReplyIds(model_id)
        if req.stream:
            return _JobStream(_stream(agent, req, job, inbox, reply), job)
        return await _wait(agent, request, job, inbox, reply)

    return app


async def _read_json(request: Request, limit: int) -> Any:
    length = request.headers.get("content-length")
    if length is not None and (not length.isdigit() or int(length) > limit):
        raise APIError(413, f"request body over {limit} bytes")
    body = await request.body()
    if len(body) > limit:
        raise APIError(413, f"request body over {limit} bytes")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise bad_request(f"malformed JSON body: {str(exc)[:200] or type(exc).__name__}") from None


def _check_prompt(n: int, req: ChatRequest, config: ServerConfig, context_length: int | None) -> None:
    if n > config.max_prompt_tokens:
        raise bad_request(f"the conversation is {n} tokens; the limit is {config.max_prompt_tokens}", "messages")
    if context_length and n + req.sampling.max_tokens > context_length:
        raise bad_request(f"the conversation ({n} tokens) plus max_tokens ({req.sampling.max_tokens}) exceeds the "
                          f"model's context of {context_length} tokens", "max_tokens")


async def _wait(agent: ChatAgent, request: Request, job: Job, inbox: asyncio.Queue, reply: ReplyIds):
    """A plain request: wait for the result, cancelling the job if the client goes away meanwhile."""
    while True:
        try:
            kind, payload = await asyncio.wait_for(inbox.get(), DISCONNECT_POLL_S)
            break
        except TimeoutError:
            if await request.is_disconnected():
                job.cancel()
                return JSONResponse(APIError(499, "client closed the request").body(), status_code=499)
    if kind == "error":
        return _failure(job, payload)
    return JSONResponse(reply.completion(agent.tokenizer, agent.dialect, payload))


def _failure(job: Job, exc: Exception) -> JSONResponse:
    if job.cancelled:
        return JSONResponse(APIError(499, "client closed the request").body(), status_code=499)
    err = APIError(500, f"the agent failed: {type(exc).__name__}: {str(exc)[:300]}")
    return JSONResponse(err.body(), status_code=500)


async def _stream(agent: ChatAgent, req: ChatRequest, job: Job, inbox: asyncio.Queue,
                  reply: ReplyIds) -> AsyncIterator[bytes]:
    """Server-sent events: role, then reasoning/content deltas and agent events as they come, then the last
    chunk with finish_reason and the trace, optional usage, and ``[DONE]``."""
    yield _sse(reply.chunk({"role": "assistant", "content": ""}))
    turn = TurnText(agent.tokenizer, agent.dialect)
    while True:
        items = [await inbox.get()]
        while not inbox.empty():
            items.append(inbox.get_nowait())
        out: list[dict[str, Any]] = []
        finished = False
        for kind, payload in items:
            if kind == "token":
                out += pieces_to_chunks(reply, turn.token(payload))
            elif kind == "event":
                out += pieces_to_chunks(reply, turn.end_turn())
                out.append(reply.chunk(agent_event=payload))
            elif kind == "done":
                out += pieces_to_chunks(reply, turn.end_turn())
                out += _final_chunks(agent, req, reply, turn, payload)
                finished = True
            else:  # error
                err = _failure(job, payload)
                out.append(json.loads(err.body))
                finished = True
        if out:
            yield b"".join(_sse(c) for c in out)
        if finished:
            yield b"data: [DONE]\n\n"
            return


def _final_chunks(agent: ChatAgent, req: ChatRequest, reply: ReplyIds, turn: TurnText, t) -> list[dict[str, Any]]:
    out = []
    streamed = turn.splitter.content
    content = reply_content(t, model_turns(agent.tokenizer, t))
    if not streamed and content:  # no answer tag was streamed: the reply is the last turn (or the answer)
        out.append(reply.chunk({"content": content}))
    out.append(reply.chunk(finish_reason=openai_finish_reason(t.finish_reason),
                           agent_trace=agent_trace(t, turn.splitter.reasoning)))
    if req.include_usage:
        out.append(reply.usage_chunk(t))
    return out
