"""The OpenAI chat-completions request, its checks, and the errors the server answers with.

A request body is parsed in two steps: pydantic checks the shape and the types strictly (:class:`ChatCompletionRequest`:
a count must be a JSON integer and a flag a JSON boolean; ``"5"``, ``true`` or ``5.0`` for ``max_tokens`` is refused
naming what came, never read as a number),
then :func:`check_request` checks the meaning against the server's limits (roles and their order, sizes,
ranges, the model id) and returns a :class:`ChatRequest` with every default filled in. Every failure is an
:class:`APIError` carrying the HTTP status and a reason, answered in OpenAI's error shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

Status codes follow OpenAI: 400 for a bad request, 401 for a missing or wrong token, 404 (code
``model_not_found``) for a model id the server does not serve, 413 for an oversized body, 429 (with
Retry-After) when the queue is full.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from .config import ServeConfig

ROLES = ("system", "developer", "user", "assistant")
UNSUPPORTED_ROLES = ("tool", "function")


class APIError(Exception):
    """An error answered to the client: status, reason, and the offending parameter when there is one."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.kind = kind or {401: "authentication_error", 404: "invalid_request_error",
                             429: "rate_limit_error"}.get(status, "invalid_request_error" if status < 500
                                                          else "server_error")
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None


StrictNumber = Annotated[float, Field(strict=True)]  # a JSON number (an integer too), not a string or a boolean


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class ChatCompletionRequest(BaseModel):
    """The fields the server reads; any other OpenAI field is accepted and ignored unless it is one the
    server cannot honour (``n`` > 1, ``stop``, ``tools``, ``logprobs``), which is refused."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[Message]
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: StrictNumber | None = None
    top_p: StrictNumber | None = None
    n: StrictInt | None = None
    stop: str | list[str] | None = None
    tools: list[Any] | None = None
    logprobs: StrictBool | None = None


@dataclass(frozen=True)
class Sampling:
    """What a batch must share: requests with different sampling settings run in different engine runs."""

    temperature: float
    top_p: float
    max_tokens: int


@dataclass
class ChatRequest:
    """A request that passed every check, with the server's defaults filled in."""

    model: str
    messages: list[dict[str, str]]  # roles system/user/assistant, content as text
    sampling: Sampling
    stream: bool
    include_usage: bool
    max_tokens_given: bool = False  # the client asked for max_tokens (else the server's default, cut to fit)

    @property
    def question(self) -> str:
        return self.messages[-1]["content"]


STRICT_TYPE_ERRORS = ("int_type", "bool_type", "float_type", "string_type")


def json_kind(value: Any) -> str:
    """How a JSON value reads in an error message: ``boolean true``, ``string '5'``, ``number 5.0``."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"string {value[:40]!r}"
    if isinstance(value, int | float):
        return f"number {value!r}"
    return "null" if value is None else {"dict": "an object", "list": "an array"}.get(type(value).__name__, "a value")


def parse_request(data: Any) -> ChatCompletionRequest:
    """Shape and types; a failure names every bad field."""
    if not isinstance(data, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(data).__name__}")
    try:
        return ChatCompletionRequest.model_validate(data)
    except ValidationError as exc:
        reasons, params = [], []
        for err in exc.errors():
            where = ".".join(str(x) for x in err.get("loc", ()))
            params.append(where)
            if err.get("type") == "missing":
                reasons.append(f"{where} is required")
            elif err.get("type") in STRICT_TYPE_ERRORS:
                reasons.append(f"{where}: {err.get('msg', 'invalid')}, got {json_kind(err.get('input'))}")
            else:
                reasons.append(f"{where}: {err.get('msg', 'invalid')}")
        raise bad_request("; ".join(dict.fromkeys(reasons)), params[0] if params else None) from None


def _text(content: str | list[ContentPart] | None, i: int) -> str:
    if content is None:
        raise bad_request(f"messages[{i}].content is missing", f"messages[{i}].content")
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(f"messages[{i}].content[{j}] is of type {part.type!r}; only text parts are supported",
                              f"messages[{i}].content")
        texts.append(part.text)
    return "".join(texts)


def check_request(req: ChatCompletionRequest, config: ServeConfig) -> ChatRequest:
    """Meaning and limits; raises the first problem as an :class:`APIError`."""
    if req.model != config.served_name:
        raise APIError(404, f"the model {req.model!r} does not exist; this server serves {config.served_name!r}",
                       param="model", code="model_not_found")
    _check_messages_shape(req, config)
    messages = _normalise(req, config)
    if req.n not in (None, 1):
        raise bad_request(f"n must be 1 (one choice per request), got {req.n}", "n")
    if req.stop:
        raise bad_request("stop sequences are not supported: the agent stops at its own answer tag", "stop")
    if req.tools:
        raise bad_request("tools are not supported: the agent's only tool is its search", "tools")
    if req.logprobs:
        raise bad_request("logprobs are not supported", "logprobs")
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    if max_tokens is None:
        max_tokens = config.rollout.max_completion_tokens
    elif not 1 <= max_tokens <= config.server.max_tokens_limit:
        raise bad_request(f"{param} must be between 1 and {config.server.max_tokens_limit}, got {max_tokens}", param)
    temperature = config.server.temperature if req.temperature is None else req.temperature
    if not 0 <= temperature <= 2:
        raise bad_request(f"temperature must be between 0 and 2, got {temperature}", "temperature")
    top_p = 1.0 if req.top_p is None else req.top_p
    if not 0 < top_p <= 1:
        raise bad_request(f"top_p must be in (0, 1], got {top_p}", "top_p")
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    if req.stream_options is not None and not req.stream:
        raise bad_request("stream_options is only allowed with stream: true", "stream_options")
    return ChatRequest(req.model, messages, Sampling(float(temperature), float(top_p), int(max_tokens)),
                       req.stream, include_usage,
                       max_tokens_given=req.max_completion_tokens is not None or req.max_tokens is not None)


def _check_messages_shape(req: ChatCompletionRequest, config: ServeConfig) -> None:
    if not req.messages:
        raise bad_request("messages is empty: send at least one user message", "messages")
    if len(req.messages) > config.server.max_messages:
        raise bad_request(f"{len(req.messages)} messages; the limit is {config.server.max_messages}", "messages")
    for i, m in enumerate(req.messages):
        if m.role in UNSUPPORTED_ROLES:
            raise bad_request(f"messages[{i}].role {m.role!r} is not supported (the server runs its own tools)",
                              f"messages[{i}].role")
        if m.role not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.role!r}",
                              f"messages[{i}].role")


def _normalise(req: ChatCompletionRequest, config: ServeConfig) -> list[dict[str, str]]:
    """Texts, sizes, and the order: an optional system message first, then user and assistant alternating,
    beginning and ending with user."""
    out: list[dict[str, str]] = []
    for i, m in enumerate(req.messages):
        text = _text(m.content, i)
        if len(text) > config.server.max_message_chars:
            raise bad_request(f"messages[{i}].content is {len(text)} characters; the limit is "
                              f"{config.server.max_message_chars}", f"messages[{i}].content")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request(f"messages[{i}].content is not valid Unicode (it holds a lone surrogate escape)",
                              f"messages[{i}].content") from None
        role: Literal["system", "user", "assistant"] = "system" if m.role == "developer" else m.role  # type: ignore
        if role == "system" and i > 0:
            raise bad_request(f"messages[{i}]: a system message may only come first", f"messages[{i}].role")
        if role == "user" and not text.strip():
            raise bad_request(f"messages[{i}].content is empty", f"messages[{i}].content")
        out.append({"role": role, "content": text})
    turns = out[1:] if out[0]["role"] == "system" else out
    if not turns:
        raise bad_request("messages has no user message", "messages")
    for j, m in enumerate(turns):
        expected = "user" if j % 2 == 0 else "assistant"
        if m["role"] != expected:
            i = j + (len(out) - len(turns))
            raise bad_request(f"messages[{i}] is from {m['role']!r} but {expected!r} was expected: after an optional "
                              "system message, user and assistant messages alternate", f"messages[{i}].role")
    if turns[-1]["role"] != "user":
        raise bad_request("the last message must be from the user", f"messages[{len(out) - 1}].role")
    return out
