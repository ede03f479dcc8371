"""What the client sees of a reply: :class:`ReplyWriter` turns the engine's output into OpenAI shapes, a
finished trajectory into a ``chat.completion`` and streamed tokens and events into ``chat.completion.chunk`` s
(server-sent events, :func:`sse`). The text itself comes from one :class:`~.stream.ReplyText` per reply, so both
modes carry the same fields; the app only passes the engine's output through.

What a reply carries (the same in both modes):

* ``choices[0].message.content``: the agent's final answer (the text inside its answer tag). A model that
  opens an answer tag and never closes it gets the text after the tag; one that writes no answer tag gets the
  text of its last turn.
* ``choices[0].message.reasoning_content``: everything else the model wrote (thinking, search queries,
  tags), the field several OpenAI-compatible servers use for reasoning. Retrieved passages are not in it:
  they are the environment's words, summarised in the trace.
* ``choices[0].message.tool_calls``: the calls of the client's tools (``tools`` in the request, native dialect only:
  :mod:`.client_tools`, :mod:`.reply_calls`), each ``{"id": "call_<hex>", "type": "function", "function": {"name",
  "arguments": <JSON string>}}``; ``content`` is then null and the calls' ``<tool_call>`` blocks are not in
  ``reasoning_content`` (a Llama 3 template's bare JSON call, which only the turn's end tells from text, stays there).
* ``agent_trace`` (top level): ``answer``, ``finish_reason`` (the agent's: answer, eos, max_searches, ...,
  cancelled, tool_calls), ``num_searches``, ``num_turns``, ``model_tokens``, ``observation_tokens``, ``reasoning``,
  ``events``: the engine's events in order (a search is
  ``{"type": "search", "turn": 1, "queries": [...], "results": [{"query": ..., "hits": [{"docid", "title"}]}]}``), and
  ``server_tool_calls``: the calls of the server's own tools that ran inside the agent,
  ``{"name": "search", "arguments": {"query": ...}, "turn": 1, "failed": false}`` each.
* ``usage``: ``prompt_tokens``, ``completion_tokens`` (tokens the model wrote, a forced call's opening included; the
  inserted search results are ``agent_trace.observation_tokens``), ``total_tokens``.
* ``finish_reason``: ``tool_calls`` when the reply hands the client calls, ``stop`` when the agent answered or ended by
  itself, ``length`` when a budget ran out.

Streaming sends the answer as ``delta.content`` and the rest of the model's text as
``delta.reasoning_content`` while they are generated; each event as it happens in a chunk with an empty delta
and a top-level ``agent_event`` (those of a native turn that wrote a call block wait until the run goes on or ends:
only then is it known whether its calls are the client's, whose text the reply drops, or the agent's own); the client's
calls as OpenAI streams them (per call a delta ``tool_calls: [{index, id, type, function: {name, arguments: ""}}]``,
then one with the whole ``arguments``); and a last chunk with ``finish_reason`` and the whole ``agent_trace``. A forced
call's opening (``tool_choice``) is fed to the reply's text first, as the model's own tokens.

A failed search shows the client ``{"type": "error", "kind": "search_failed", "message": "search failed", ...}``
(:func:`public_event`): the engine's message may name the search server's address or quote a backend's exception,
which are the operator's business (the server log has them), not the client's.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from ..rollout.protocol import Dialect
from ..rollout.trajectory import Trajectory
from .client_tools import ToolPlan
from .reply_calls import client_calls, openai_calls, server_tool_calls, stream_deltas
from .stream import ReplyText

STOP_REASONS = {"answer", "eos", "cancelled"}
SSE_DONE = b"data: [DONE]\n\n"


def openai_finish_reason(agent_reason: str) -> str:
    return "stop" if agent_reason in STOP_REASONS else "length"


SEARCH_FAILED = "search failed"


def public_event(event: dict[str, Any]) -> dict[str, Any]:
    """An engine event as the client sees it: a failed search's message is the generic :data:`SEARCH_FAILED`."""
    out = dict(event)
    if out.get("type") == "error" and out.get("kind") == "search_failed":
        out["message"] = SEARCH_FAILED
    return out


def agent_trace(t: Trajectory, reasoning: str) -> dict[str, Any]:
    return {"answer": t.answer, "finish_reason": t.finish_reason, "num_searches": t.num_searches,
            "num_turns": t.num_turns, "model_tokens": t.model_tokens, "observation_tokens": t.env_tokens,
            "reasoning": reasoning, "events": [public_event(e) for e in t.events],
            "server_tool_calls": server_tool_calls(t.events)}


def usage(t: Trajectory) -> dict[str, int]:
    prompt, completion = len(t.prompt_ids), t.model_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse(chunks: list[dict[str, Any]]) -> bytes:
    """Server-sent events, one ``data:`` line per chunk."""
    return b"".join(b"data: " + json.dumps(c, ensure_ascii=False, default=str).encode() + b"\n\n" for c in chunks)


class ReplyWriter:
    """One reply. Streamed: :meth:`opening`, then :meth:`feed` with each ``(kind, payload)`` the scheduler sends
    (``("token", id)``, ``("event", dict)``, at last ``("done", Trajectory)``), each call returning the chunks to
    send. Whole: :meth:`completion` of the finished trajectory. Every chunk shares the reply's id, time and model.
    ``tools``: the request's client tools (:class:`~.client_tools.ToolPlan`); ``forced``: the ids of the call opening
    the server forced, which the engine does not stream."""

    def __init__(self, model: str, tokenizer: Any, dialect: Dialect, *, include_usage: bool = False,
                 tools: ToolPlan | None = None, forced: list[int] | None = None):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model
        self.tokenizer, self.dialect, self.include_usage = tokenizer, dialect, include_usage
        self.tools, self.forced = tools, list(forced or ())
        self.text = ReplyText(tokenizer, dialect)
        self.finished = False
        self._deferred: list[dict[str, Any]] = []  # events of a turn whose call blocks are held

    def completion(self, t: Trajectory) -> dict[str, Any]:
        calls = openai_calls(client_calls(t, self.tokenizer, self.tools))
        text = ReplyText.of_trajectory(self.tokenizer, self.dialect, t, calls=bool(calls))
        message: dict[str, Any] = {"role": "assistant", "content": text.content, "reasoning_content": text.reasoning}
        if calls:
            message["tool_calls"] = calls
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": "tool_calls" if calls else openai_finish_reason(t.finish_reason)}],
                "usage": usage(t), "agent_trace": agent_trace(t, text.reasoning)}

    def opening(self) -> list[dict[str, Any]]:
        out = [self.chunk({"role": "assistant", "content": ""})]
        for token in self.forced:  # the forced opening is the start of the model's first turn
            out += self._deltas(self.text.token(token))
        return out

    def feed(self, kind: str, payload: Any) -> list[dict[str, Any]]:
        if kind == "token":  # a turn with held calls was not the last: its calls were the agent's own
            return self._release() + self._deltas(self.text.token(payload))
        if kind == "event":
            if self.text.calls.holding or self._deferred:  # the run going on or ending will say what the calls were
                self._deferred.append(payload)
                return []
            # the model's turn is over: what it wrote is shown before the event
            return self._deltas(self.text.end_turn()) + [self.chunk(agent_event=public_event(payload))]
        if kind == "done":
            calls = openai_calls(client_calls(payload, self.tokenizer, self.tools))
            out = self._deltas(self.text.finish(payload, calls=bool(calls)))
            out += [self.chunk(agent_event=public_event(e)) for e in self._deferred]
            out += [self.chunk(delta) for delta in stream_deltas(calls)]
            out.append(self.chunk(finish_reason="tool_calls" if calls else openai_finish_reason(payload.finish_reason),
                                  agent_trace=agent_trace(payload, self.text.reasoning)))
            if self.include_usage:
                out.append({"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                            "model": self.model, "choices": [], "usage": usage(payload)})
            self.finished = True
            return out
        raise ValueError(f"unknown engine output {kind!r}")

    def _release(self) -> list[dict[str, Any]]:
        """The held turn's text (as reasoning) and its deferred events, once the next turn begins."""
        if not self._deferred:
            return []
        events, self._deferred = self._deferred, []
        return self._deltas(self.text.end_turn()) + [self.chunk(agent_event=public_event(e)) for e in events]

    def chunk(self, delta: dict[str, Any] | None = None, finish_reason: str | None = None,
              **extra: Any) -> dict[str, Any]:
        out = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}]}
        out.update(extra)
        return out

    def _deltas(self, pieces: list[tuple[str, str]]) -> list[dict[str, Any]]:
        """Consecutive pieces of one channel become one delta."""
        out: list[dict[str, Any]] = []
        for channel, text in pieces:
            key = "content" if channel == "content" else "reasoning_content"
            last = out[-1]["choices"][0]["delta"] if out else None
            if last is not None and key in last:
                last[key] += text
            else:
                out.append(self.chunk({key: text}))
        return out
