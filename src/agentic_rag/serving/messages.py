"""A chat request's conversation, checked and made into the messages the chat template takes.

The order a conversation may have: an optional system (or developer) message first, then a user message; a user
message is followed by an assistant message; an assistant message by a user message, unless it called the client's
tools (``tool_calls``): then one ``tool`` message per call follows at once (``tool_call_id`` naming the call, in any
order), and after them the assistant goes on or the user speaks. The last message is the user's, or the results of
the last assistant message's calls. What is refused, each with a 400 that says where: a tool message whose
``tool_call_id`` matches no earlier call (or one already answered, or a call of an earlier turn), a call left without
its result, two calls with one id, a function name that is not 1 to 64 letters, digits, ``_`` or ``-``.

The messages come out as the chat template takes them: text contents; an assistant message with calls has content
None unless it wrote text, and its calls' arguments as an object when they are a JSON object (what templates
serialise: Qwen's writes ``arguments | tojson``), else as the string the client sent; the tool messages of a turn
are put in the order of its calls (a Hermes template tells the results apart by their order only) and carry the
function's ``name``.

With a model that speaks a tag dialect, tool messages and assistant tool calls are refused with the reason
:func:`~.schema.check_request` gives (the model cannot call client tools).
"""

from __future__ import annotations

import json
import re
from typing import Any

from .config import ServeConfig
from .errors import bad_request

ROLES = ("system", "developer", "user", "assistant", "tool")
UNSUPPORTED_ROLES = ("function",)
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def text_of(content: Any, i: int) -> str:
    """A message's content as text: a string, or the joined text parts."""
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


def _checked_text(text: str, where: str, config: ServeConfig) -> str:
    if len(text) > config.server.max_message_chars:
        raise bad_request(f"{where} is {len(text)} characters; the limit is {config.server.max_message_chars}", where)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise bad_request(f"{where} is not valid Unicode (it holds a lone surrogate escape)", where) from None
    return text


def _shape(messages: list[Any], config: ServeConfig, refusal: str | None) -> None:
    if not messages:
        raise bad_request("messages is empty: send at least one user message", "messages")
    if len(messages) > config.server.max_messages:
        raise bad_request(f"{len(messages)} messages; the limit is {config.server.max_messages}", "messages")
    for i, m in enumerate(messages):
        if m.role in UNSUPPORTED_ROLES:
            raise bad_request(f"messages[{i}].role {m.role!r} is not supported (the legacy function role): declare "
                              "tools and send their results as role 'tool'", f"messages[{i}].role")
        if m.role not in ROLES:
            raise bad_request(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.role!r}",
                              f"messages[{i}].role")
        if refusal and m.role == "tool":
            raise bad_request(f"messages[{i}].role 'tool' is not supported: {refusal}", f"messages[{i}].role")
        if refusal and m.role == "assistant" and m.tool_calls:
            raise bad_request(f"messages[{i}].tool_calls are not supported: {refusal}", f"messages[{i}].tool_calls")


def _calls(m: Any, i: int, config: ServeConfig, seen: set[str]) -> list[dict[str, Any]]:
    """An assistant message's calls as the template takes them."""
    out = []
    for j, call in enumerate(m.tool_calls):
        where = f"messages[{i}].tool_calls[{j}]"
        if call.type != "function":
            raise bad_request(f"{where}.type must be 'function', got {call.type!r}", f"{where}.type")
        if not call.id or call.id in seen:
            reason = "is empty" if not call.id else "is the id of another call"
            raise bad_request(f"{where}.id {call.id!r} {reason}: every call needs its own id", f"{where}.id")
        seen.add(call.id)
        name = call.function.name
        if not FUNCTION_NAME.fullmatch(name):
            raise bad_request(f"{where}.function.name must be 1 to 64 letters, digits, underscores or dashes, got "
                              f"{name[:80]!r}", f"{where}.function.name")
        arguments: Any = call.function.arguments
        if isinstance(arguments, str):
            _checked_text(arguments, f"{where}.function.arguments", config)
            try:
                parsed = json.loads(arguments) if arguments.strip() else {}
            except (ValueError, RecursionError):
                parsed = None
            arguments = parsed if isinstance(parsed, dict) else arguments
        out.append({"id": call.id, "type": "function", "function": {"name": name, "arguments": arguments}})
    return out


def _message(m: Any, i: int, config: ServeConfig, seen: set[str]) -> dict[str, Any]:
    role = "system" if m.role == "developer" else m.role
    if role == "system" and i > 0:
        raise bad_request(f"messages[{i}]: a system message may only come first", f"messages[{i}].role")
    if role == "assistant" and m.tool_calls:
        text = None if m.content is None else _checked_text(text_of(m.content, i), f"messages[{i}].content", config)
        return {"role": "assistant", "content": text if text and text.strip() else None,
                "tool_calls": _calls(m, i, config, seen)}
    text = _checked_text(text_of(m.content, i), f"messages[{i}].content", config)
    if role == "user" and not text.strip():
        raise bad_request(f"messages[{i}].content is empty", f"messages[{i}].content")
    if role == "tool":
        if not m.tool_call_id:
            raise bad_request(f"messages[{i}].tool_call_id is required: the id of the call this is the result of",
                              f"messages[{i}].tool_call_id")
        return {"role": "tool", "content": text, "tool_call_id": m.tool_call_id}
    return {"role": role, "content": text}


def normalise_messages(messages: list[Any], config: ServeConfig, *, refusal: str | None = None) -> list[dict[str, Any]]:
    """The checked conversation as the chat template takes it (see the module docstring). ``refusal``: why tool
    messages and calls are refused (the model speaks a tag dialect), or None when they are allowed."""
    _shape(messages, config, refusal)
    seen: set[str] = set()
    out = [_message(m, i, config, seen) for i, m in enumerate(messages)]
    offset = 1 if out[0]["role"] == "system" else 0
    if len(out) == offset:
        raise bad_request("messages has no user message", "messages")
    _check_order(out, offset)
    return _ordered_results(out)


def _check_order(out: list[dict[str, Any]], offset: int) -> None:
    """The order of the module docstring; the first problem is raised."""
    pending: dict[str, int] = {}  # the last assistant message's calls without a result -> index of that message
    called: set[str] = set()
    answered: set[str] = set()
    prev = None  # the role of the previous message; "calls" for an assistant message with calls
    for i in range(offset, len(out)):
        m = out[i]
        role = m["role"]
        if role == "tool":
            cid = m["tool_call_id"]
            where = f"messages[{i}].tool_call_id"
            if cid not in called:
                raise bad_request(f"messages[{i}] is the result of tool_call_id {cid!r}, but no earlier assistant "
                                  "message made a call with that id", where)
            if cid in answered:
                raise bad_request(f"messages[{i}] is a second result of tool_call_id {cid!r}", where)
            if cid not in pending:
                raise bad_request(f"messages[{i}] is the result of tool_call_id {cid!r}, a call of an earlier turn: "
                                  "the results of a message's calls come right after it", where)
            del pending[cid]
            answered.add(cid)
            prev = "tool"
            continue
        if pending:
            raise _unanswered(pending, f"messages[{i}]")
        expected = {None: ("user",), "user": ("assistant",), "assistant": ("user",), "tool": ("user", "assistant"),
                    "calls": ("tool",)}[prev]
        if role not in expected:
            raise bad_request(f"messages[{i}] is from {role!r} but {' or '.join(map(repr, expected))} was expected: "
                              "after an optional system message, user and assistant messages alternate (an assistant "
                              "message that calls tools is followed by their results)", f"messages[{i}].role")
        if role == "assistant" and m.get("tool_calls"):
            pending = {c["id"]: i for c in m["tool_calls"]}
            called.update(pending)
            prev = "calls"
        else:
            prev = role
    if pending:
        raise _unanswered(pending, "the end")
    if prev not in ("user", "tool"):
        raise bad_request("the last message must be from the user (or be the results of the last assistant "
                          "message's tool calls)", f"messages[{len(out) - 1}].role")


def _unanswered(pending: dict[str, int], before: str) -> Exception:
    ids = ", ".join(map(repr, pending))
    k = next(iter(pending.values()))
    return bad_request(f"the tool call(s) {ids} of messages[{k}] have no result before {before}: send one role 'tool' "
                       "message per call, with its tool_call_id, right after that message", "messages")


def _ordered_results(out: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each turn's tool messages in the order of its calls, each with its function's name."""
    result: list[dict[str, Any]] = []
    i = 0
    while i < len(out):
        m = out[i]
        result.append(m)
        i += 1
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            block = {r["tool_call_id"]: r for r in out[i:i + len(calls)]}
            result += [{**block[c["id"]], "name": c["function"]["name"]} for c in calls]
            i += len(calls)
    return result
