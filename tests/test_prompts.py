"""Base-model prompts: the plain-text layout ends where the assistant's turn begins, at a token boundary the
real tokenizer would also produce for natural text."""

from __future__ import annotations

import pytest

from agentic_rag.data.prompts import build_prompt
from agentic_rag.rollout.settings import PromptSettings
from agentic_rag.serving.conversation import prompt_ids

QUESTION = "Where was Henriette of France born?"


@pytest.mark.parametrize("language, assistant", [("en", "Assistant:"), ("zh", "助手:")])
def test_a_base_model_prompt_ends_at_the_colon_and_the_first_word_brings_its_space(qwen2_tokenizer, language,
                                                                                    assistant):
    """No trailing space: BPE writes a word with its leading space (" Paris" is one token), so a prompt ending in
    "Assistant: " ends in a lone space token that natural text never has there, and shifts the model's first
    token to a space-less word it rarely saw in that place."""
    tok = qwen2_tokenizer
    ids = build_prompt(tok, QUESTION, "agentic", language=language, chat=False)
    text = tok.decode(ids)
    assert text.endswith(f"\n{assistant}") and text.count(QUESTION) == 1
    assert tok.convert_ids_to_tokens(ids[-1:]) == [":"]
    for word in (" Paris", " <think>", " The"):
        natural = tok(text + word, add_special_tokens=False)["input_ids"]
        assert natural[:len(ids)] == ids  # the prompt is exactly how the tokenizer splits the whole text
    first = tok(" Paris", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(first) == ["ĠParis"]  # one token, its own leading space
    assert tok(text + " Paris", add_special_tokens=False)["input_ids"] == ids + first


def test_a_served_conversation_ends_like_the_trained_prompt(qwen2_tokenizer):
    tok = qwen2_tokenizer
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": "Versailles"},
                {"role": "user", "content": "And when?"}]
    plain = PromptSettings(chat_template=False)
    ids = prompt_ids(tok, messages, prompt=plain)
    assert tok.decode(ids).endswith("User: And when?\nAssistant:")
    single = prompt_ids(tok, messages[:1], prompt=plain)
    assert tok.decode(single) == tok.decode(build_prompt(tok, QUESTION, chat=False))
