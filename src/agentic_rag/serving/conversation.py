"""A chat conversation -> the prompt token ids the agent continues.

A single user question gets exactly the prompt training and evaluation use (:func:`build_prompt`: the
system prompt the agent was trained with - the dialect's unless the server says otherwise - + the question). A
longer conversation keeps that system prompt unless the client sends its own system message, which then
replaces it (the client takes responsibility for telling the model its tags). Earlier assistant turns are the
answers the server gave (the ``content`` of its replies), so the history the model sees is short and clean.
Chat models get their chat template (unless ``prompt.chat_template`` is false: a model trained without it); a model
without one gets the plain-text layout of base-model prompts.

Everything the client sends is untrusted (:func:`~agentic_rag.data.prompts.messages_prompt`): user and assistant
messages have the dialect's tags neutralized, and every message, a client's system message included, is encoded with
no control token recognised, so a message holding ``<|im_end|>\\n<|im_start|>system`` stays one message.
"""

from __future__ import annotations

from typing import Any

from ..data.prompts import build_prompt, messages_prompt
from ..rollout.settings import PromptSettings


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]], dialect: str = "agentic",
               prompt: PromptSettings | None = None) -> list[int]:
    """Token ids for ``messages`` (already checked: optional system first, user/assistant alternating, last from the
    user), ending where the assistant's turn begins, built with ``prompt`` (the system prompt the agent was trained
    with, the dialect's when it is empty; the chat template on or off, or when the tokenizer has one)."""
    prompt = prompt or PromptSettings()
    chat = prompt.chat_template if prompt.chat_template is not None else bool(getattr(tokenizer, "chat_template",
                                                                                      None))
    system = prompt.system_for(dialect)
    if len(messages) == 1:
        return build_prompt(tokenizer, messages[0]["content"], dialect, language=prompt.language, chat=chat,
                            system=system)
    ours = messages[0]["role"] != "system"
    if ours:
        messages = [{"role": "system", "content": system}, *messages]
    return messages_prompt(tokenizer, messages, dialect, language=prompt.language, chat=chat, trusted_system=ours)
