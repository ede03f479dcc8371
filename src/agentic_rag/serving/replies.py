"""A finished trajectory -> an OpenAI ``chat.completion``; streamed tokens and events -> ``chat.completion.chunk`` s.

What a reply carries (the same in both modes):

* ``choices[0].message.content``: the agent's final answer (the text inside its answer tag). A model that
  ends without an answer tag gets the text of its last turn instead.
* ``choices[0].message.reasoning_content``: everything else the model wrote (thinking, search queries,
  tags), the field several OpenAI-compatible servers use for reasoning. Retrieved passages are not in it:
  they are the environment's words, summarised in the trace.
* ``agent_trace`` (top level): ``answer``, ``finish_reason`` (the agent's: answer, eos, max_searches, ...,
  cancelled), ``num_searches``, ``num_turns``, ``model_tokens``, ``observation_tokens``, ``reasoning``, and
  ``events``: the engine's events in order; a search is
  ``{"type": "search", "turn": 1, "queries": [...], "results": [{"query": ..., "hits": [{"docid", "title"}]}]}``.
* ``usage``: ``prompt_tokens``, ``completion_tokens`` (tokens the model wrote; the inserted search results are
  ``agent_trace.observation_tokens``), ``total_tokens``.
* ``finish_reason``: ``stop`` when the agent answered or ended by itself, ``length`` when a budget ran out.

Streaming sends the answer as ``delta.content`` and the rest of the model's text as
``delta.reasoning_content`` while they are generated; each event as it happens in a chunk with an empty delta
and a top-level ``agent_event``; and a last chunk with ``finish_reason`` and the whole ``agent_trace``.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..rollout.protocol import Dialect
from ..rollout.trajectory import MODEL, Trajectory
from .stream import AnswerSplitter, IncrementalDecoder

STOP_REASONS = {"answer", "eos", "cancelled"}


def openai_finish_reason(agent_reason: str) -> str:
    return "stop" if agent_reason in STOP_REASONS else "length"


class TurnText:
    """Model tokens -> ``(channel, text)`` pieces, turn by turn (a turn ends when an event arrives)."""

    def __init__(self, tokenizer: Any, dialect: Dialect):
        self.tokenizer = tokenizer
        self.splitter = AnswerSplitter(dialect.answer_open, dialect.answer_close)
        self._decoder = IncrementalDecoder(tokenizer)

    def token(self, token_id: int) -> list[tuple[str, str]]:
        text = self._decoder.push(token_id)
        return self.splitter.feed(text) if text else []

    def text(self, text: str) -> list[tuple[str, str]]:
        return self.splitter.feed(text)

    def end_turn(self) -> list[tuple[str, str]]:
        pieces = self.splitter.feed(self._decoder.flush()) + self.splitter.end_turn()
        self._decoder = IncrementalDecoder(self.tokenizer)
        return pieces


def model_turns(tokenizer: Any, t: Trajectory) -> list[str]:
    """The text of each model turn, in order, without special tokens (as the stream shows it)."""
    return [tokenizer.decode(t.completion_ids[s.start:s.end], skip_special_tokens=True)
            for s in t.segments if s.source == MODEL]


def split_trajectory(tokenizer: Any, dialect: Dialect, t: Trajectory) -> tuple[str, str, str]:
    """``(reasoning, streamed_answer, content)``: content is the answer, or the last turn without one."""
    turns = model_turns(tokenizer, t)
    tt = TurnText(tokenizer, dialect)
    for text in turns:
        tt.text(text)
        tt.end_turn()
    return tt.splitter.reasoning, tt.splitter.content, reply_content(t, turns)


def reply_content(t: Trajectory, turns: list[str]) -> str:
    if t.answer is not None:
        return t.answer
    return turns[-1].strip() if turns else ""


def agent_trace(t: Trajectory, reasoning: str) -> dict[str, Any]:
    return {"answer": t.answer, "finish_reason": t.finish_reason, "num_searches": t.num_searches,
            "num_turns": t.num_turns, "model_tokens": t.model_tokens, "observation_tokens": t.env_tokens,
            "reasoning": reasoning, "events": [dict(e) for e in t.events]}


def usage(t: Trajectory) -> dict[str, int]:
    prompt, completion = len(t.prompt_ids), t.model_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class ReplyIds:
    """The id, creation time and model name shared by every chunk of one reply."""

    def __init__(self, model: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def completion(self, tokenizer: Any, dialect: Dialect, t: Trajectory) -> dict[str, Any]:
        reasoning, _, content = split_trajectory(tokenizer, dialect, t)
        return {"id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": content,
                                                     "reasoning_content": reasoning},
                             "logprobs": None, "finish_reason": openai_finish_reason(t.finish_reason)}],
                "usage": usage(t), "agent_trace": agent_trace(t, reasoning)}

    def chunk(self, delta: dict[str, Any] | None = None, finish_reason: str | None = None,
              **extra: Any) -> dict[str, Any]:
        out = {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
               "choices": [{"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}]}
        out.update(extra)
        return out

    def usage_chunk(self, t: Trajectory) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                "choices": [], "usage": usage(t)}


def pieces_to_chunks(ids: ReplyIds, pieces: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Consecutive pieces of one channel become one delta."""
    out: list[dict[str, Any]] = []
    for channel, text in pieces:
        key = "content" if channel == "content" else "reasoning_content"
        last = out[-1]["choices"][0]["delta"] if out else None
        if last is not None and key in last:
            last[key] += text
        else:
            out.append(ids.chunk({key: text}))
    return out
