"""Prompt building for chat and base models, from a dialect's system prompt (English or Chinese).

Chat models get ``[system, user]`` through the tokenizer's chat template with the generation prompt
added. Base models (no chat template, or ``chat=False``), as R1-Searcher trains the Qwen base model, get a
plain-text prompt that ends where the assistant's turn begins: ``{system}\n\nUser: {question}\nAssistant:``,
with no space after the colon (the model's first token brings its own, as BPE splits natural text).

What a user (or a client, or a data set) wrote is untrusted: the dialect's tags in it are made ordinary text
(:meth:`~agentic_rag.rollout.protocol.Dialect.neutralize`) and it is encoded with no control token recognised
(:mod:`agentic_rag.rollout.encoding`), so a question holding ``<|im_end|>`` cannot forge a turn. The system prompt the
operator configured is the template's own text. An ordinary question keeps exactly the ids it always had.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..rollout.encoding import encode_chat, encode_pieces
from ..rollout.protocol import LANGUAGES, Dialect, get_dialect


def system_prompt(dialect: Dialect | str, language: str = "en") -> str:
    """The dialect's own system prompt in ``language`` (the prompts live with the dialects:
    :mod:`agentic_rag.rollout.protocol`)."""
    return (get_dialect(dialect) if isinstance(dialect, str) else dialect).system_prompt(language)


def build_prompt(tokenizer: Any, question: str, dialect: Dialect | str = "agentic", *, language: str = "en",
                 chat: bool | None = None, system: str | None = None,
                 tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """Prompt token ids for ``question``; ``chat=None`` uses the chat template when the tokenizer has one.
    ``system`` (the operator's; the dialect's own by default) is trusted, ``question`` is not. ``tools``: the tools'
    schemas (:meth:`~agentic_rag.tools.base.ToolRegistry.schemas`), listed by the chat template in the native
    dialect."""
    system = system if system is not None else system_prompt(dialect, language)
    return messages_prompt(tokenizer, [{"role": "system", "content": system}, {"role": "user", "content": question}],
                           dialect, language=language, chat=chat, tools=tools)


def messages_prompt(tokenizer: Any, messages: Sequence[Mapping[str, Any]], dialect: Dialect | str = "agentic", *,
                    language: str = "en", chat: bool | None = None, trusted_system: bool = True,
                    tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """Prompt token ids for a conversation: a system message first, then user and assistant messages, the last from
    the user; the ids end where the assistant's turn begins. Every message but the system one (user, assistant,
    tool) is untrusted: its dialect tags are neutralized and it is encoded as text. The system message is the
    operator's with ``trusted_system`` (its control tokens are the template's); otherwise (a chat client sent it)
    it is encoded as text too, its tags left as they are, since it is there to teach the model its tags.

    Base models (``chat`` false, or no chat template) get the plain-text layout: ``{system}\n\n`` then
    ``User: {content}\n`` / ``Assistant: {content}\n`` per message, ending in ``Assistant:``.

    The native dialect prompts through the chat template with the ``tools`` listed (a template that knows no tools
    gets the package's ChatML tool template installed on the tokenizer: :func:`~agentic_rag.rollout.native.
    prepare_tokenizer`)."""
    d = get_dialect(dialect) if isinstance(dialect, str) else dialect
    if chat is None:
        chat = bool(getattr(tokenizer, "chat_template", None))
    if d.native:
        if not chat:
            raise ValueError("the native dialect prompts through the chat template (prompt.chat_template must not "
                             "be false)")
        from ..rollout.native import openai_tools, prepare_tokenizer

        prepare_tokenizer(tokenizer)
    shown = [dict(m) if m["role"] == "system" or not isinstance(m.get("content"), str)
             else {**m, "content": d.neutralize(m["content"])} for m in messages]
    if chat:
        return encode_chat(tokenizer, shown, trusted=[m["role"] == "system" and trusted_system for m in shown],
                           tools=openai_tools(tools) if d.native and tools else None)
    if not shown or shown[0]["role"] != "system":
        raise ValueError("a plain-text prompt starts with the system message")
    user, assistant = LANGUAGES[language]
    names = {"user": user, "assistant": assistant}
    # no space after the final colon: BPE tokenizers give a word its leading space (" Paris" is one token), so a
    # trailing space would end the prompt in a lone space token natural text never has there, and push the
    # model's first token off the split it was trained on; the model writes the space with its first word
    pieces: list[tuple[str, bool]] = [(shown[0]["content"], trusted_system), ("\n\n", True)]
    for m in shown[1:]:
        pieces += [(f"{names[m['role']]}: ", True), (m["content"], False), ("\n", True)]
    pieces[-1] = (f"\n{assistant}:", True)
    return encode_pieces(tokenizer, pieces)
