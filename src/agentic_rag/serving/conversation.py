"""A chat conversation -> the prompt token ids the agent continues.

A single user question gets exactly the prompt training and evaluation use (:func:`build_prompt`: the
system prompt the agent was trained with - the dialect's unless the server says otherwise - + the question). A
longer conversation keeps that system prompt unless the client sends its own system message, which then
replaces it (the client takes responsibility for telling the model its tags). Earlier assistant turns are the
answers the server gave (the ``content`` of its replies), so the history the model sees is short and clean.
Chat models get their chat template (unless ``prompt.chat_template`` is false: a model trained without it); a model
without one gets the plain-text layout of base-model prompts.

In the native dialect the chat template also lists ``tools``: the server's own and the client's together
(:mod:`.client_tools`), and renders the conversation's earlier tool calls (an assistant message's ``tool_calls``) and
their results (``tool`` messages) in the model's own format.

Everything the client sends is untrusted (:func:`~agentic_rag.data.prompts.messages_prompt`): user, assistant and tool
messages have the dialect's tags neutralized, and every message, a client's system message included, is encoded with
no control token recognised, so a message holding ``<|im_end|>\\n<|im_start|>system`` stays one message. The calls of
an earlier assistant message are written by the template itself (their name and arguments are not a message's
content), so a call whose arguments hold the text of one of the tokenizer's control tokens is refused (400) rather
than shown to the model as that token; the names are plain identifiers already (:mod:`.messages`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from ..data.prompts import build_prompt, messages_prompt
from ..rollout.settings import PromptSettings
from .errors import bad_request


def prompt_ids(tokenizer: Any, messages: list[dict[str, Any]], dialect: str = "agentic",
               prompt: PromptSettings | None = None, *,
               tools: Sequence[Mapping[str, Any]] | None = None) -> list[int]:
    """Token ids for ``messages`` (already checked: optional system first, then the order :mod:`.messages` allows,
    last from the user or a tool), ending where the assistant's turn begins, built with ``prompt`` (the system prompt
    the agent was trained with, the dialect's when it is empty; the chat template on or off, or when the tokenizer has
    one). ``tools``: the schemas the native dialect's template lists (``name``, ``description``, ``parameters``)."""
    prompt = prompt or PromptSettings()
    chat = prompt.chat_template if prompt.chat_template is not None else bool(getattr(tokenizer, "chat_template",
                                                                                      None))
    system = prompt.system_for(dialect)
    check_call_text(tokenizer, messages)
    if len(messages) == 1:
        return build_prompt(tokenizer, messages[0]["content"], dialect, language=prompt.language, chat=chat,
                            system=system, tools=tools)
    ours = messages[0]["role"] != "system"
    if ours:
        messages = [{"role": "system", "content": system}, *messages]
    return messages_prompt(tokenizer, messages, dialect, language=prompt.language, chat=chat, trusted_system=ours,
                           tools=tools)


def control_strings(tokenizer: Any) -> list[str]:
    """The text of every added token of ``tokenizer`` but the unknown one: what :mod:`agentic_rag.rollout.encoding`
    treats as control tokens."""
    unk = getattr(tokenizer, "unk_token_id", None)
    decoder = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return [s for i, tok in decoder.items() if int(i) != unk and (s := str(getattr(tok, "content", tok)))]


def check_call_text(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> None:
    """Refuse (400) an assistant message's call whose name or arguments hold a control token's text (see the module
    docstring)."""
    strings: list[str] | None = None
    for i, m in enumerate(messages):
        for j, call in enumerate(m.get("tool_calls") or ()):
            fn = call["function"]
            args = fn["arguments"]
            text = fn["name"] + "\n" + (args if isinstance(args, str) else json.dumps(args, ensure_ascii=False))
            strings = control_strings(tokenizer) if strings is None else strings
            found = next((s for s in strings if s in text), None)
            if found is not None:
                raise bad_request(f"messages[{i}].tool_calls[{j}].function holds the text of the model's control "
                                  f"token {found!r}, which the chat template would pass as that token: the server "
                                  "cannot show it to the model as text", f"messages[{i}].tool_calls")
