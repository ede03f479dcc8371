"""A chat conversation -> the prompt token ids the agent continues.

A single user question gets exactly the prompt training and evaluation use (:func:`build_prompt`: the
system prompt the agent was trained with - the dialect's unless the server says otherwise - + the question). A
longer conversation keeps that system prompt unless the client sends its own system message, which then
replaces it (the client takes responsibility for telling the model its tags). Earlier assistant turns are the
answers the server gave (the ``content`` of its replies), so the history the model sees is short and clean.
Chat models get their chat template (unless ``chat=False``: a model trained without it); a model without one
gets the plain-text layout of base-model prompts.
"""

from __future__ import annotations

from typing import Any

from ..data.prompts import build_prompt, system_prompt


def prompt_ids(tokenizer: Any, messages: list[dict[str, str]], dialect: str = "agentic",
               language: str = "en", *, system: str | None = None, chat: bool | None = None) -> list[int]:
    """Token ids for ``messages`` (already checked: optional system first, user/assistant alternating,
    last from the user), ending where the assistant's turn begins. ``system``: the agent's system prompt
    (None: the dialect's); ``chat``: the chat template on or off (None: when the tokenizer has one)."""
    if chat is None:
        chat = bool(getattr(tokenizer, "chat_template", None))
    if len(messages) == 1:
        return build_prompt(tokenizer, messages[0]["content"], dialect, language=language, chat=chat, system=system)
    if messages[0]["role"] != "system":
        own = system if system is not None else system_prompt(dialect, language)
        messages = [{"role": "system", "content": own}, *messages]
    if chat:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    names = {"user": "User", "assistant": "Assistant"} if language == "en" else {"user": "用户", "assistant": "助手"}
    lines = [messages[0]["content"], ""]
    lines += [f"{names[m['role']]}: {m['content']}" for m in messages[1:]]
    return tokenizer("\n".join(lines) + f"\n{names['assistant']}:", add_special_tokens=False)["input_ids"]
