"""Untrusted text to token ids: the only control tokens in a context are the ones the template and the engine wrote.

A user's message, a retrieved passage or a tool's result may hold the text of a control token (``<|im_end|>``,
``<tool_call>``); tokenized the ordinary way, that text *becomes* the token, and one message can forge a system turn,
an assistant turn and an observation. Here every *added* token of the tokenizer (``tokenizer.added_tokens_decoder``,
special or not: Qwen's ``<tool_call>`` and ``<think>`` are non-special added tokens and control tokens all the same)
but the unknown token counts as a control token, and untrusted text is encoded with none of them recognised:

* :func:`encode_text`: ``text`` as text. When no added token's string occurs in it (every ordinary question, passage
  and tool result) that is exactly ``tokenizer(text, add_special_tokens=False)``, so ordinary prompts and
  observations keep the very ids they always had (trained adapters see the prompts they were trained on); otherwise
  the text is cut inside each occurrence (just after its first character), the pieces are encoded apart, and the
  result is checked to hold no added token's id.
* :func:`encode_pieces`: a text made of trusted pieces (the template's, the engine's own words: control tokens
  recognised) and untrusted ones. When every added token of the whole text lies inside a trusted piece, the whole
  text is encoded at once (again exactly the ordinary ids); otherwise it is cut at the trusted pieces' own control
  tokens, and the text between them goes through :func:`encode_text`. Cutting only where the tokenizer cuts anyway
  (at an added token) keeps the BPE merges at the untrusted text's edges as they were.
* :func:`encode_chat`: a chat template's prompt with the untrusted messages' contents kept apart from the template.
  The template is rendered with each untrusted content replaced by a placeholder (Private Use Area characters around
  an index, with the content's own leading and trailing whitespace around it, so a template that trims content trims
  it identically, and a template never branches on what an untrusted message says); the contents are put back as
  untrusted pieces.

The dialect's own tags inside untrusted text (a passage's ``</observation>``) are a separate matter, handled by
:meth:`~.protocol.Dialect.neutralize` before the text gets here: they are ordinary text to the tokenizer.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The placeholder of untrusted message content i in a rendered chat template: Private Use Area characters no
# template writes, adds or strips, around the index.
_OPEN, _CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{_OPEN}(\\d+){_CLOSE}")


@dataclass(frozen=True)
class _Added:
    """A tokenizer's added tokens: how many (to notice a tokenizer that gained some), a pattern that finds any of them
    (longest first, as the tokenizer matches them; None without added tokens), and their ids by string."""

    count: int
    pattern: re.Pattern[str] | None
    ids: Mapping[str, int]


_CACHE: weakref.WeakKeyDictionary[Any, _Added] = weakref.WeakKeyDictionary()


def _added(tokenizer: Any) -> _Added:
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    try:
        cached = _CACHE.get(tokenizer)
    except TypeError:  # not weak-referenceable: build it each time
        cached = None
    if cached is not None and cached.count == len(decoder):
        return cached
    # the unknown token is what the tokenizer makes of text it has no piece for (a word-level vocabulary's every
    # unseen word, the "[UNK]" a model wrote and a decoder spelled out): text, not a control token
    unk = getattr(tokenizer, "unk_token_id", None)
    ids = {str(getattr(tok, "content", tok)): int(i) for i, tok in decoder.items() if int(i) != unk}
    strings = sorted((s for s in ids if s), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
    added = _Added(len(decoder), pattern, ids)
    try:
        _CACHE[tokenizer] = added
    except TypeError:
        pass
    return added


def control_token_ids(tokenizer: Any) -> frozenset[int]:
    """The ids of every added token of ``tokenizer``: what untrusted text never encodes to."""
    return frozenset(_added(tokenizer).ids.values())


def _plain(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []


def _mid_text(tokenizer: Any, text: str) -> list[int]:
    """``text`` encoded as the middle of a longer text: after a newline that is then dropped, so a SentencePiece
    tokenizer adds no word-start marker a mid-text piece would not have (for byte-level BPE it changes nothing). When
    the newline merges with the text, the text is encoded on its own."""
    newline = _plain(tokenizer, "\n")
    ids = _plain(tokenizer, "\n" + text)
    return ids[len(newline):] if newline and ids[:len(newline)] == newline else _plain(tokenizer, text)


def _encode_text(tokenizer: Any, text: str, added: _Added, *, at_start: bool) -> list[int]:
    if added.pattern is None or not added.pattern.search(text):
        return _plain(tokenizer, text) if at_start else _mid_text(tokenizer, text)
    ids: list[int] = []
    rest, first = text, at_start
    while rest:
        m = added.pattern.search(rest)
        # the text before the occurrence with its first character (no added token can lie in it: the occurrence is
        # the leftmost), then the rest from its second character on, searched again
        cut = len(rest) if m is None else m.start() + 1
        piece, rest = rest[:cut], rest[cut:]
        ids += _plain(tokenizer, piece) if first else _mid_text(tokenizer, piece)
        first = False
    forged = set(ids) & set(added.ids.values())
    if forged:
        raise ValueError(f"cannot encode {text[:80]!r} as text: the tokenizer makes added token(s) "
                         f"{sorted(forged)} out of its pieces")
    return ids


def encode_text(tokenizer: Any, text: str) -> list[int]:
    """The ids of ``text`` with no added token recognised (see the module docstring): exactly
    ``tokenizer(text, add_special_tokens=False)["input_ids"]`` when no added token's string occurs in it."""
    return _encode_text(tokenizer, text, _added(tokenizer), at_start=True)


def encode_pieces(tokenizer: Any, pieces: Sequence[tuple[str, bool]]) -> list[int]:
    """The ids of the concatenation of ``pieces``, each ``(text, trusted)``: the control tokens of trusted pieces are
    recognised, untrusted ones are encoded as text (see the module docstring). Exactly the ordinary encoding of the
    whole text when no added token's string touches an untrusted piece."""
    added = _added(tokenizer)
    text = "".join(p for p, _ in pieces)
    if added.pattern is None:
        return _plain(tokenizer, text)
    spans, pos = [], 0
    for piece, trusted in pieces:
        if trusted:
            spans.append((pos, pos + len(piece)))
        pos += len(piece)
    if all(any(a <= m.start() and m.end() <= b for a, b in spans) for m in added.pattern.finditer(text)):
        return _plain(tokenizer, text)
    return _encode_split(tokenizer, pieces, added)


def _encode_split(tokenizer: Any, pieces: Sequence[tuple[str, bool]], added: _Added) -> list[int]:
    """:func:`encode_pieces`' slow path: cut at the trusted pieces' own control tokens (where the tokenizer cuts
    anyway), each one its id; the text between two of them (trusted and untrusted text alike) as text."""
    assert added.pattern is not None
    ids: list[int] = []
    pending, at_start = "", True
    for piece, trusted in pieces:
        if not trusted:
            pending += piece
            continue
        last = 0
        for m in added.pattern.finditer(piece):
            pending += piece[last:m.start()]
            ids += _encode_text(tokenizer, pending, added, at_start=at_start) if pending else []
            ids.append(added.ids[m.group()])
            pending, at_start, last = "", False, m.end()
        pending += piece[last:]
    if pending:
        ids += _encode_text(tokenizer, pending, added, at_start=at_start)
    return ids


def encode_chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]], *, trusted: Sequence[bool] | None = None,
                add_generation_prompt: bool = True, tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """``tokenizer``'s chat template over ``messages``, with the contents of the untrusted messages encoded as text.

    ``trusted[i]``: message i's content is the operator's (a configured system prompt): it goes through the template
    as it is and its control tokens are recognised. Every other content is replaced by a placeholder while the
    template renders (see the module docstring) and encoded by :func:`encode_text`. A template that drops or repeats
    an untrusted content is refused (ValueError): its output cannot be told apart from the content. ``tools``: the
    tool schemas the template lists (OpenAI function shape; the operator's, trusted)."""
    trusted = list(trusted) if trusted is not None else [False] * len(messages)
    if len(trusted) != len(messages):
        raise ValueError(f"{len(trusted)} trust flags for {len(messages)} messages")
    shown: list[dict[str, Any]] = []
    cores: list[str] = []
    for message, ok in zip(messages, trusted, strict=True):
        content = message.get("content")
        if ok or not isinstance(content, str):
            shown.append(dict(message))
            continue
        core = content.strip()
        lead = content[:len(content) - len(content.lstrip())] if core else content
        trail = content[len(content.rstrip()):] if core else ""
        shown.append({**message, "content": f"{lead}{_OPEN}{len(cores)}{_CLOSE}{trail}"})
        cores.append(core)
    extra = {"tools": list(tools)} if tools else {}
    rendered = tokenizer.apply_chat_template(shown, add_generation_prompt=add_generation_prompt, tokenize=False,
                                             **extra)
    parts = _PLACEHOLDER.split(rendered)  # template, index, template, index, ..., template
    found = [int(i) for i in parts[1::2]]
    if sorted(found) != list(range(len(cores))):
        missing = sorted(set(range(len(cores))) - set(found))
        repeated = sorted({i for i in found if found.count(i) > 1})
        raise ValueError(f"the chat template must write each message's content exactly once (missing: {missing}, "
                         f"repeated: {repeated}); untrusted content could not be kept apart from the template")
    return encode_pieces(tokenizer, [(part, True) if k % 2 == 0 else (cores[int(part)], False)
                                     for k, part in enumerate(parts)])
