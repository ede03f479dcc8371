"""System prompts (English and Chinese) for each dialect, and prompt building for chat and base models.

Chat models get ``[system, user]`` through the tokenizer's chat template with the generation prompt
added. Base models (no chat template, or ``chat=False``), as R1-Searcher trains the Qwen base model, get a
plain-text prompt that ends where the assistant's turn begins: ``{system}\n\nUser: {question}\nAssistant:``,
with no space after the colon (the model's first token brings its own, as BPE splits natural text).
"""

from __future__ import annotations

from typing import Any

from ..rollout.protocol import Dialect

LANGUAGES = ("en", "zh")

_EN = {
    "agentic": (
        "You answer questions by searching a document collection. Think inside <think> </think>. "
        "To search, write <search> query </search>; several queries may go on separate lines. "
        "The results come back inside <observation> </observation>; never write that tag yourself. "
        "You may plan in <plan> </plan>, reason in <reasoning> </reasoning>, abandon your last search step "
        "with <backtrack> why </backtrack>, condense what you know with <summary> </summary>, and conclude in "
        "<conclusion> </conclusion>. Give the final answer, a short phrase, once inside <answer> </answer>, "
        "and write nothing after it."),
    "search-r1": (
        "Answer the question. Reason inside <think> </think> whenever you receive new information. When you "
        "lack knowledge, search with <search> query </search>; the top results come back between <information> "
        "and </information>. Search as often as you need. When you know enough, give the answer inside "
        "<answer> </answer>, briefly, without explanations."),
    "r1-searcher": (
        "The user asks a question and the assistant answers it. The assistant first thinks about the reasoning "
        "process and then gives the answer. During thinking, the assistant can search for information by "
        "writing <|begin_of_query|> keywords <|end_of_query|>; the system then returns the results inside "
        "<|begin_of_documents|> ... <|end_of_documents|>. The reasoning is enclosed in <think> </think> and the "
        "final answer in <answer> </answer>."),
}

_ZH = {
    "agentic": (
        "你通过检索文档库来回答问题。在 <think> </think> 中思考。检索时写 <search> 查询 </search>，多个查询可分行书写。"
        "检索结果会出现在 <observation> </observation> 中，你自己绝不能写这个标签。你可以在 <plan> </plan> 中规划，"
        "在 <reasoning> </reasoning> 中推理，用 <backtrack> 原因 </backtrack> 放弃上一步检索，用 <summary> </summary> "
        "总结已知信息，在 <conclusion> </conclusion> 中给出结论。最终答案用简短的短语写在 <answer> </answer> 中，"
        "只写一次，之后不要再写任何内容。"),
    "search-r1": (
        "回答给定的问题。每次获得新信息时，先在 <think> 和 </think> 中推理。如果发现缺少知识，可以用 <search> 查询 "
        "</search> 调用搜索引擎，结果会出现在 <information> 和 </information> 之间。可以多次搜索。"
        "如果不再需要外部知识，直接在 <answer> 和 </answer> 中给出答案，不要详细解释。"),
    "r1-searcher": (
        "用户提出问题，助手回答。助手先思考推理过程再给出答案。思考时，助手可以写 <|begin_of_query|> 关键词 "
        "<|end_of_query|> 检索信息，系统会在 <|begin_of_documents|> ... <|end_of_documents|> 中返回结果。推理写在 "
        "<think> </think> 中，最终答案写在 <answer> </answer> 中。"),
}


def system_prompt(dialect: Dialect | str, language: str = "en") -> str:
    name = dialect if isinstance(dialect, str) else dialect.name
    if language not in LANGUAGES:
        raise ValueError(f"unknown prompt language {language!r}; choose one of {', '.join(LANGUAGES)}")
    table = _EN if language == "en" else _ZH
    if name not in table:
        raise ValueError(f"no system prompt for dialect {name!r}")
    return table[name]


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
    user, assistant = ("User", "Assistant") if language == "en" else ("用户", "助手")
    # no space after the colon: BPE tokenizers give a word its leading space (" Paris" is one token), so a
    # trailing space would end the prompt in a lone space token natural text never has there, and push the
    # model's first token off the split it was trained on; the model writes the space with its first word
    text = f"{system}\n\n{user}: {question}\n{assistant}:"
    return tokenizer(text, add_special_tokens=False)["input_ids"]
