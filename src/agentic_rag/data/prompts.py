"""Prompt building for chat and base models, from a dialect's system prompt (English or Chinese).

Chat models get ``[system, user]`` through the tokenizer's chat template with the generation prompt
added. Base models (no chat template, or ``chat=False``), as R1-Searcher trains the Qwen base model, get a
plain-text prompt that ends where the assistant's turn begins: ``{system}\n\nUser: {question}\nAssistant:``,
with no space after the colon (the model's first token brings its own, as BPE splits natural text).
"""

from __future__ import annotations

from typing import Any

from ..rollout.protocol import LANGUAGES, Dialect, get_dialect


def system_prompt(dialect: Dialect | str, language: str = "en") -> str:
    """The dialect's own system prompt in ``language`` (the prompts live with the dialects:
    :mod:`agentic_rag.rollout.protocol`)."""
    return (get_dialect(dialect) if isinstance(dialect, str) else dialect).system_prompt(language)


def build_prompt(tokenizer: Any, question: str, dialect: Dialect | str = "agentic", *, language: str = "en",
                 chat: bool | None = None, system: str | None = None) -> list[int]:
    """Prompt token ids for ``question``; ``chat=None`` uses the chat template when the tokenizer has one."""
    system = system if system is not None else system_prompt(dialect, language)
    if chat is None:
        chat = bool(getattr(tokenizer, "chat_template", None))
    if chat:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    user, assistant = LANGUAGES[language]
    # no space after the colon: BPE tokenizers give a word its leading space (" Paris" is one token), so a
    # trailing space would end the prompt in a lone space token natural text never has there, and push the
    # model's first token off the split it was trained on; the model writes the space with its first word
    text = f"{system}\n\n{user}: {question}\n{assistant}:"
    return tokenizer(text, add_special_tokens=False)["input_ids"]
