"""The tool calls a reply carries: the client's, handed over in OpenAI's shape, and the server's own, reported.

The client's calls (:func:`client_calls`) are those of the ``client_calls`` event with which the engine ended the run
(finish_reason ``tool_calls``). A run whose opening the server forced (``tool_choice`` ``required`` or a named
function, :mod:`.client_tools`) is one model turn; when that turn did not end in a clean call (an untrained model
writes its arguments badly or runs out of tokens before ``</tool_call>``), the call is read leniently from the turn's
text (:func:`salvage`): its function name (the one the server wrote, or the model's when it is a client tool) and the
arguments as far as they are a JSON object, else the text the model wrote for them (OpenAI's ``arguments`` is a string
the model wrote, not always valid JSON), ``{}`` when it wrote none. A forced turn that names no client tool gives no
call: the reply is that text.

Each call the client gets has an id ``call_<24 hex>`` and its arguments as a JSON string (:func:`openai_calls`).

The server's own tool calls, which ran inside the agent (its search), are listed in ``agent_trace.server_tool_calls``
(:func:`server_tool_calls`): ``{"name", "arguments", "turn", "failed"}`` each, from the trajectory's events.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from typing import Any

from ..rollout.events import CLIENT_CALLS, ERROR, SEARCH, TOOL, Event
from ..rollout.native import parse_calls
from ..rollout.trajectory import Trajectory
from .client_tools import ToolPlan
from .stream import model_turns

_NAME = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"')
_ARGUMENTS = re.compile(r'\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def client_calls(t: Trajectory, tokenizer: Any, plan: ToolPlan | None) -> list[dict[str, str]]:
    """The calls the reply hands to the client, each ``{"name", "arguments"}`` (a JSON string); [] when none."""
    if plan is None or not plan.handed_over:
        return []
    if t.finish_reason == "tool_calls":
        event = next((e for e in reversed(t.events) if e.get("type") == CLIENT_CALLS), None)
        if event is not None:
            return [{"name": c["name"], "arguments": json.dumps(c.get("arguments") or {}, ensure_ascii=False)}
                    for c in event["calls"]]
    if plan.single_turn:
        turns = model_turns(tokenizer, t)
        return salvage(turns[0], plan) if turns else []
    return []


def salvage(text: str, plan: ToolPlan) -> list[dict[str, str]]:
    """The client calls of a forced turn's ``text`` (see the module docstring): every clean call of a client tool, else
    the first call read leniently."""
    clean = [c for c in parse_calls(text) if not c.error and c.tool in plan.names]
    if clean:
        return [{"name": c.tool, "arguments": json.dumps(dict(c.arguments), ensure_ascii=False)} for c in clean]
    m = _NAME.search(text)
    if m is None:
        return []
    try:
        name = json.loads(f'"{m.group(1)}"')
    except ValueError:
        return []
    if name not in plan.names:
        return []
    rest = text[m.end():]
    head = _ARGUMENTS.match(rest)
    arguments = rest[head.end():] if head else ""
    arguments = arguments.split("</tool_call>", 1)[0].strip()
    try:
        obj, _ = json.JSONDecoder().raw_decode(arguments)
    except (ValueError, RecursionError):
        obj = None
    if isinstance(obj, dict):
        arguments = json.dumps(obj, ensure_ascii=False)
    return [{"name": name, "arguments": arguments or "{}"}]


def openai_calls(calls: list[dict[str, str]]) -> list[dict[str, Any]]:
    """``calls`` in OpenAI's ``tool_calls`` shape, each with a new id."""
    return [{"id": new_call_id(), "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in calls]


def stream_deltas(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The deltas that stream ``calls`` (OpenAI shape) as OpenAI does: per call, one with its index, id, type and name
    (arguments empty), then one with its arguments."""
    out: list[dict[str, Any]] = []
    for k, c in enumerate(calls):
        fn = c["function"]
        out.append({"tool_calls": [{"index": k, "id": c["id"], "type": "function",
                                    "function": {"name": fn["name"], "arguments": ""}}]})
        out.append({"tool_calls": [{"index": k, "function": {"arguments": fn["arguments"]}}]})
    return out


def server_tool_calls(events: Iterable[Event]) -> list[dict[str, Any]]:
    """The calls the server's own tools answered or failed, in order (see the module docstring)."""
    events = list(events)
    out: list[dict[str, Any]] = []
    for n, e in enumerate(events):
        kind = e.get("type")
        if kind == SEARCH or (kind == TOOL and e.get("queries") is not None):
            queries = list(e.get("queries") or [])
            arguments = {"query": queries[0]} if len(queries) == 1 else {"queries": queries}
            out.append({"name": e.get("tool") or "search", "arguments": arguments, "turn": e.get("turn"),
                        "failed": False})
        elif kind == TOOL:
            out.append({"name": e.get("tool"), "arguments": dict(e.get("arguments") or {}), "turn": e.get("turn"),
                        "failed": bool(e.get("failed"))})
        elif kind == ERROR and e.get("kind") == "search_failed" and not e.get("partial"):
            queries = list(e.get("queries") or [])
            arguments = {"query": queries[0]} if len(queries) == 1 else {"queries": queries}
            out.append({"name": e.get("tool") or "search", "arguments": arguments, "turn": e.get("turn"),
                        "failed": True})
        elif kind == ERROR and e.get("kind") == "tool_failed":
            following = events[n + 1] if n + 1 < len(events) else {}
            if following.get("type") == TOOL and following.get("tool") == e.get("tool"):
                continue  # the tool event that follows records this call (failed)
            out.append({"name": e.get("tool"), "arguments": {}, "turn": e.get("turn"), "failed": True})
    return out
