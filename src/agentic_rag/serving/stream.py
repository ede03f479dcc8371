"""From the model's token ids to the two text channels of a reply, incrementally.

:class:`IncrementalDecoder` turns ids into text deltas as they arrive. Byte-level BPE can split one
character over several tokens; until the rest arrives the decoded text ends in U+FFFD, so a delta ending
in a replacement character is held back. Only a window of recent ids is decoded each time (the text before
it is fixed), so the cost per token does not grow with the reply.

:class:`AnswerSplitter` routes that text: what the model writes inside the answer tags is the reply's
``content``; everything else it writes (thinking, search queries, the tags) is ``reasoning_content``. Tags
can arrive split over several deltas, so a suffix that could still become a tag is held back, and the
answer's leading and trailing whitespace is dropped as the engine strips it. Running the whole text through
one splitter or through many small deltas gives the same two strings, which is why a streamed reply and a
non-streamed one carry the same fields.

:class:`ReplyText` is the one place the engine's output becomes a reply's text: it joins the two per model turn
(a turn ends when the engine records an event: its search results follow) and settles the reply's ``content``
when the trajectory ends. In the native dialect :class:`CallHolder` holds a turn's text back from its first
``<tool_call>`` on until the turn ends: a turn whose calls go to the client (the reply's ``tool_calls``) loses its call
blocks, which the reply carries as calls, not text; any other turn's is released as reasoning, as a tag dialect's
search is. The streamed reply feeds it token by token, the non-streamed one a finished
trajectory's turns (:meth:`ReplyText.of_trajectory`); :mod:`.replies` wraps either in OpenAI's shapes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from ..rollout.protocol import Dialect
from ..rollout.trajectory import MODEL, Trajectory

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True, window: int = 8):
        self.tokenizer = tokenizer
        self.skip = skip_special_tokens
        self.window = window
        self.ids: list[int] = []
        self._fixed = 0  # ids before this index are already emitted as text
        self._pending = ""  # decoded text of ids[_fixed:] already emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip)

    def push(self, token_ids: int | Iterable[int]) -> str:
        """Add ids; returns the new text that is safe to show (possibly empty)."""
        self.ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        text = self._decode(self.ids[self._fixed:])
        if text.endswith(REPLACEMENT) or len(text) <= len(self._pending):
            return ""
        # byte-level BPE only appends; a tokenizer that rewrites earlier text (space clean-up) would make the
        # shown text differ slightly from the final one, never stall it
        delta = text[len(self._pending):]
        self._pending = text
        if len(self.ids) - self._fixed > self.window:
            # slide the window when the dropped ids' text and the rest's text join up to the same string
            cut = len(self.ids) - self.window // 2
            head, tail = self._decode(self.ids[self._fixed:cut]), self._decode(self.ids[cut:])
            if head + tail == text:
                self._fixed, self._pending = cut, tail
        return delta

    def flush(self) -> str:
        """Whatever is left, replacement characters included (the model really wrote invalid bytes)."""
        text = self._decode(self.ids[self._fixed:])
        delta = text[len(self._pending):]
        self._pending = text
        return delta


class AnswerSplitter:
    """Splits model text into ``(channel, text)`` pieces, channel ``"reasoning"`` or ``"content"``."""

    def __init__(self, answer_open: str = "<answer>", answer_close: str = "</answer>"):
        self.open, self.close = answer_open, answer_close
        self.inside = False
        self._buf = ""  # text not yet routed (a possible partial tag, or the answer's trailing whitespace)
        self._started = False  # the current answer has non-whitespace content
        self.reasoning = ""
        self.content = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        self._buf += text
        while self._buf:
            tag = self.close if self.inside else self.open
            at = self._buf.find(tag)
            if at >= 0:
                self._emit(out, self._buf[:at], final=True)
                self._buf = self._buf[at + len(tag):]
                self.inside, self._started = not self.inside, False
                continue
            keep = _partial_suffix(self._buf, tag)
            body, self._buf = self._buf[:len(self._buf) - keep], self._buf[len(self._buf) - keep:]
            if self.inside:  # hold trailing whitespace: it is dropped if the close tag follows
                stripped = body.rstrip()
                self._buf = body[len(stripped):] + self._buf
                body = stripped
            self._emit(out, body, final=False)
            break
        return out

    def end_turn(self) -> list[tuple[str, str]]:
        """A model turn ended (its search results follow): an unclosed answer is not an answer."""
        out = self.flush()
        self.inside, self._started = False, False
        return out

    def flush(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        rest, self._buf = self._buf, ""
        self._emit(out, rest, final=True)
        return out

    def _emit(self, out: list[tuple[str, str]], text: str, *, final: bool) -> None:
        if self.inside:
            if not self._started:
                text = text.lstrip()
            if final:
                text = text.rstrip()
            if text:
                self._started = True
                self.content += text
                out.append(("content", text))
        elif text:
            self.reasoning += text
            out.append(("reasoning", text))


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


def split_text(text: str, answer_open: str = "<answer>", answer_close: str = "</answer>") -> tuple[str, str]:
    """``(reasoning, content)`` of a whole text, exactly as streaming it piece by piece would give."""
    s = AnswerSplitter(answer_open, answer_close)
    s.feed(text)
    s.flush()
    return s.reasoning, s.content


class CallHolder:
    """Holds a native turn's text from its first ``<tool_call>`` on until the turn ends (see the module docstring);
    inactive (text passes through) in the tag dialects."""

    OPEN = "<tool_call>"
    BLOCK = re.compile(r"<tool_call>.*?(?:</tool_call>|$)", re.S)

    def __init__(self, active: bool):
        self.active = active
        self._buf = ""  # the held text, or a suffix that could still become the opening tag
        self._holding = False

    @property
    def holding(self) -> bool:
        """The turn wrote a call block, held until it is known whether its calls go to the client."""
        return self._holding

    def feed(self, text: str) -> str:
        """The part of ``text`` that may be shown now."""
        if not self.active:
            return text
        if self._holding:
            self._buf += text
            return ""
        text, self._buf = self._buf + text, ""
        at = text.find(self.OPEN)
        if at >= 0:
            self._holding, self._buf = True, text[at:]
            return text[:at]
        keep = _partial_suffix(text, self.OPEN)
        self._buf = text[len(text) - keep:]
        return text[:len(text) - keep]

    def end_turn(self, drop_calls: bool = False) -> str:
        """The held text, without its call blocks when ``drop_calls`` (whitespace left alone is dropped too)."""
        rest, self._buf, self._holding = self._buf, "", False
        if drop_calls:
            rest = self.BLOCK.sub("", rest)
            rest = rest if rest.strip() else ""
        return rest


class ReplyText:
    """One reply's ``reasoning`` and ``content``: model tokens -> text (:class:`IncrementalDecoder`) -> the two
    channels (:class:`AnswerSplitter`), turn by turn; every method returns the ``(channel, text)`` pieces that are
    new to show."""

    def __init__(self, tokenizer: Any, dialect: Dialect):
        self.tokenizer = tokenizer
        self.splitter = AnswerSplitter(dialect.answer_open, dialect.answer_close)
        self.calls = CallHolder(dialect.native)
        self._decoder = IncrementalDecoder(tokenizer)
        self.content: str | None = ""  # the reply's content, settled by finish() (None: the reply is tool calls)

    @property
    def reasoning(self) -> str:
        return self.splitter.reasoning

    def token(self, token_id: int) -> list[tuple[str, str]]:
        text = self.calls.feed(self._decoder.push(token_id))
        return self.splitter.feed(text) if text else []

    def end_turn(self, drop_calls: bool = False) -> list[tuple[str, str]]:
        """The model's turn ended (the engine recorded an event); ``drop_calls``: its calls go to the client."""
        text = self.calls.feed(self._decoder.flush()) + self.calls.end_turn(drop_calls)
        pieces = self.splitter.feed(text) + self.splitter.end_turn()
        self._decoder = IncrementalDecoder(self.tokenizer)
        return pieces

    def finish(self, t: Trajectory, calls: bool = False) -> list[tuple[str, str]]:
        """End the last turn and settle ``content``: None when the reply is the client's tool ``calls`` (the turn's
        call blocks are dropped from the text); else the agent's answer; else what the model wrote after an answer tag
        it never closed (already streamed as content); else its last turn, which is then sent now."""
        pieces = self.end_turn(drop_calls=calls)
        streamed = self.splitter.content
        if calls:
            self.content = None
            return pieces
        if t.answer is not None:
            self.content = t.answer
        elif streamed:
            self.content = streamed
        else:
            turns = model_turns(self.tokenizer, t)
            self.content = turns[-1].strip() if turns else ""
        if not streamed and self.content:
            pieces.append(("content", self.content))
        return pieces

    @classmethod
    def of_trajectory(cls, tokenizer: Any, dialect: Dialect, t: Trajectory, calls: bool = False) -> ReplyText:
        """The same text from a finished trajectory (each model turn decoded whole; the last one ended by
        :meth:`finish`)."""
        text = cls(tokenizer, dialect)
        turns = model_turns(tokenizer, t)
        for n, turn in enumerate(turns):
            text.splitter.feed(text.calls.feed(turn))
            if n < len(turns) - 1:
                text.end_turn()
        text.finish(t, calls)
        return text


def model_turns(tokenizer: Any, t: Trajectory) -> list[str]:
    """The text of each model turn, in order, without special tokens (as the stream shows it)."""
    return [tokenizer.decode(t.completion_ids[s.start:s.end], skip_special_tokens=True)
            for s in t.segments if s.source == MODEL]
