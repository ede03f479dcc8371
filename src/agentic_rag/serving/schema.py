"""The OpenAI chat-completions request and its checks.

A request body is parsed in two steps: pydantic checks the shape and the types strictly (:class:`ChatCompletionRequest`:
a count must be a JSON integer and a flag a JSON boolean; ``"5"``, ``true`` or ``5.0`` for ``max_tokens`` is refused
naming what came, never read as a number),
then :func:`check_request` checks the meaning against the server's limits (the conversation's roles, order and sizes in
:mod:`.messages`; the client's ``tools`` and ``tool_choice`` in :mod:`.client_tools`; ranges, the model id here) and
returns a :class:`ChatRequest` with every default filled in. Every failure is an :class:`~.errors.APIError` carrying
the HTTP status and a reason, answered in OpenAI's error shape::

    {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}

Status codes follow OpenAI: 400 for a bad request, 401 for a missing or wrong token, 404 (code
``model_not_found``) for a model id the server does not serve, 413 for an oversized body, 429 (with
Retry-After) when the queue is full.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, ValidationError

from ..rollout.protocol import get_dialect
from .client_tools import ToolPlan, plan_tools
from .config import ServeConfig
from .errors import APIError, bad_request
from .messages import normalise_messages

__all__ = ["APIError", "ChatCompletionRequest", "ChatRequest", "Message", "Sampling", "ToolDef", "bad_request",
           "check_request", "parse_request"]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class FunctionCall(BaseModel):
    """A call's function as an assistant message carries it back: the name, and the arguments as the JSON string the
    server gave (an object is taken too)."""

    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: str = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant message: the client's tools it called
    tool_call_id: str | None = None  # a tool message: the call whose result it is


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(BaseModel):
    """A tool the client declares (OpenAI's function tool); :mod:`.client_tools` checks what it means."""

    model_config = ConfigDict(extra="allow")
    type: str
    function: FunctionDef


StrictNumber = Annotated[float, Field(strict=True)]  # a JSON number (an integer too), not a string or a boolean


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False


class ChatCompletionRequest(BaseModel):
    """The fields the server reads; any other OpenAI field is accepted and ignored unless it is one the
    server cannot honour (``n`` > 1, ``stop``, ``logprobs``; ``tools`` when the model speaks a tag dialect), which is
    refused."""

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
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None
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
    messages: list[dict[str, Any]]  # as the chat template takes them (:func:`~.messages.normalise_messages`)
    sampling: Sampling
    stream: bool
    include_usage: bool
    max_tokens_given: bool = False  # the client asked for max_tokens (else the server's default, cut to fit)
    tools: ToolPlan = field(default_factory=ToolPlan)  # the client's tools and tool_choice

    @property
    def question(self) -> str:
        """The last user message: the trajectory's question, and what per-rollout tools are reset with."""
        return next(m["content"] for m in reversed(self.messages) if m["role"] == "user")


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


def check_request(req: ChatCompletionRequest, config: ServeConfig, *, dialect: str | None = None,
                  server_tools: Sequence[str] = ()) -> ChatRequest:
    """Meaning and limits; raises the first problem as an :class:`APIError`. ``dialect``: the served model's
    (``config.rollout.dialect`` by default); only the native dialect takes the client's tools. ``server_tools``: the
    names of the agent's own tools, which a client tool may not take."""
    if req.model != config.served_name:
        raise APIError(404, f"the model {req.model!r} does not exist; this server serves {config.served_name!r}",
                       param="model", code="model_not_found")
    dialect = dialect or config.rollout.dialect
    native = get_dialect(dialect).native
    refusal = None if native else (f"the served model speaks the {dialect} tag dialect and cannot call client tools "
                                   "(serve an adapter trained with rollout.dialect: native for that)")
    messages = normalise_messages(req.messages, config, refusal=refusal)
    if req.n not in (None, 1):
        raise bad_request(f"n must be 1 (one choice per request), got {req.n}", "n")
    if req.stop:
        raise bad_request("stop sequences are not supported: the agent stops at its own answer tag", "stop")
    tools = plan_tools(req.tools, req.tool_choice, refusal=refusal, server_tools=server_tools)
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
                       max_tokens_given=req.max_completion_tokens is not None or req.max_tokens is not None,
                       tools=tools)
