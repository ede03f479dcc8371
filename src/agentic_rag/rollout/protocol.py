"""The protocol: which tags the model writes, which the environment writes, and what each action means.

A :class:`Dialect` is data, not code: tag names, the tags the environment alone may write, how
observations are laid out, and how several queries share one search action. The engine asks the dialect
for its stop strings, for the action that ended a turn (:meth:`Dialect.parse_turn`), and for the text of an
observation (:meth:`Dialect.format_observation`). Three dialects ship:

* ``agentic`` (default): ``<think>``, ``<search>``, ``<observation>`` (environment only), ``<answer>``, and
  the memory actions of the Agentic RAG-R1 / TC-RAG design: ``<plan>``, ``<reasoning>``, ``<backtrack>``,
  ``<summary>``, ``<conclusion>``. Several queries in one ``<search>`` (RAG-R1's multi-query), one per line
  or separated by ``|``, run in one batch call.
* ``search-r1``: ``<think>``, ``<search>``, ``<information>`` (environment), ``<answer>`` - the format of
  Search-R1's released models.
* ``r1-searcher``: ``<|begin_of_query|>...<|end_of_query|>`` and
  ``<|begin_of_documents|>...<|end_of_documents|>`` (environment), ``<answer>`` - R1-Searcher's format.
* ``native``: the model's own tool-call format, from its chat template (:mod:`.native`): the tools are listed by
  the template, a call is ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5/Qwen3, Hermes, and
  the ChatML tool template the package ships for models whose template knows no tools) or a Llama 3.x JSON
  object ``{"name": ..., "parameters": {...}}``; several calls in one turn run together; results come back
  through the template's tool role. The final answer is still written inside ``<answer> </answer>``.

A turn's action may call tools (:attr:`Action.calls`, one :class:`Call` each): ``search`` when every call is to a
retrieval tool (the tag dialects' search tags), ``tool`` otherwise. Which tools retrieve is the tools' business
(:mod:`agentic_rag.tools`); the dialect only says which tool a tag or a call names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ..search.types import Hit


class ActionKind(StrEnum):
    SEARCH = "search"  # call the search tool (a retrieval tool) with the queries
    TOOL = "tool"  # call tools (any tool; some calls may be searches): see Action.calls
    ANSWER = "answer"  # final answer: the trajectory ends
    BACKTRACK = "backtrack"  # abandon the last step: it leaves the visible context
    SUMMARY = "summary"  # summarise: earlier observations may leave the visible context
    NONE = "none"  # the turn ended without an action (EOS or budget)


@dataclass(frozen=True)
class Call:
    """One tool call the model wrote: the tool's name and its arguments (a tag dialect's tag content is the
    ``query``, or the queries of a multi-query search), or ``error``: why the call could not be read (bad JSON, no
    name), which the engine answers with an error observation the model sees."""

    tool: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    queries: tuple[str, ...] = ()  # what a retrieval tool searches for (a tag's queries, or arguments["query"])
    error: str = ""
    raw: str = ""  # the call as written (for the error's message)


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    content: str = ""  # the text inside the action's tags
    queries: tuple[str, ...] = ()
    tool: str = ""  # for SEARCH: the tool the tag maps to
    calls: tuple[Call, ...] = ()  # for SEARCH and TOOL: every call of the turn, in order


@dataclass(frozen=True)
class ToolTag:
    """A model-written tag pair that calls a tool, e.g. ``<search>...</search>`` -> tool ``search``."""

    open: str
    close: str
    tool: str


@dataclass
class Dialect:
    name: str
    tool_tags: list[ToolTag]
    answer_open: str = "<answer>"
    answer_close: str = "</answer>"
    observation_open: str = "<observation>"
    observation_close: str = "</observation>"
    think_open: str = "<think>"
    think_close: str = "</think>"
    # memory actions: None disables them
    backtrack: tuple[str, str] | None = None
    summary: tuple[str, str] | None = None
    # tags with no environment effect that the format reward still checks for balance
    content_tags: list[tuple[str, str]] = field(default_factory=list)
    query_separators: tuple[str, ...] = ("\n", "|")
    max_queries_per_search: int = 4
    # observation layout: "{i}" (1-based), "{title}", "{text}"
    passage_template: str = "({i}) {title}\n{text}"
    passage_joiner: str = "\n"
    # the system prompt that teaches the dialect, per language (LANGUAGES)
    prompts: dict[str, str] = field(default_factory=dict)
    # native: calls are the chat template's format, a turn with calls ends at end-of-turn (EOS), results come back
    # through the template's tool role (:mod:`.native`); False: the tag dialects' layout
    native: bool = False

    def system_prompt(self, language: str = "en") -> str:
        """The dialect's own system prompt in ``language``."""
        if language not in LANGUAGES:
            raise ValueError(f"unknown prompt language {language!r}; choose one of {', '.join(LANGUAGES)}")
        if language not in self.prompts:
            raise ValueError(f"dialect {self.name!r} has no system prompt in {language!r}")
        return self.prompts[language]

    # ------------------------------------------------------------------------------------- derived

    @property
    def stop_strings(self) -> list[str]:
        """Where generation pauses: the close of every action tag."""
        stops = [t.close for t in self.tool_tags] + [self.answer_close]
        for pair in (self.backtrack, self.summary):
            if pair:
                stops.append(pair[1])
        return list(dict.fromkeys(stops))

    @property
    def tags(self) -> list[str]:
        """Every tag of the dialect, as it parses and writes them: tool, answer, observation, think, memory and
        content tags."""
        tags = [tag for t in self.tool_tags for tag in (t.open, t.close)]
        tags += [self.answer_open, self.answer_close, self.observation_open, self.observation_close,
                 self.think_open, self.think_close]
        for pair in (self.backtrack, self.summary, *self.content_tags):
            if pair:
                tags += list(pair)
        return [t for t in dict.fromkeys(tags) if t]

    @property
    def environment_tags(self) -> list[str]:
        """Tags only the environment may write; the model writing one is a forgery."""
        return [self.observation_open, self.observation_close]

    # ------------------------------------------------------------------------------------- parsing

    def parse_turn(self, text: str) -> Action:
        """The action that ends a turn's text: the earliest complete action whose close tag appears.

        Generation stops at the first close tag, so the earliest close is the action; anything a model
        writes after it in the same token is ignored.
        """
        best: tuple[int, Action] | None = None
        candidates: list[tuple[str, str, ActionKind, str]] = [
            (t.open, t.close, ActionKind.SEARCH, t.tool) for t in self.tool_tags]
        candidates.append((self.answer_open, self.answer_close, ActionKind.ANSWER, ""))
        if self.backtrack:
            candidates.append((*self.backtrack, ActionKind.BACKTRACK, ""))
        if self.summary:
            candidates.append((*self.summary, ActionKind.SUMMARY, ""))
        for open_tag, close_tag, kind, tool in candidates:
            end = text.find(close_tag)
            if end < 0:
                continue
            start = text.rfind(open_tag, 0, end)
            content = text[start + len(open_tag):end] if start >= 0 else text[:end]
            action = Action(kind, content.strip(), tool=tool)
            if kind is ActionKind.SEARCH:
                queries = self.split_queries(action.content)
                call = Call(tool, {"query": action.content}, queries, raw=action.content)
                action = Action(kind, action.content, queries, tool, calls=(call,))
            if best is None or end < best[0]:
                best = (end, action)
        return best[1] if best else Action(ActionKind.NONE)

    def write_call(self, tool: str, arguments: Mapping[str, Any]) -> str:
        """The text the model writes to call ``tool``: a tag dialect's tag around the query (the tool's tag), the
        native format's JSON. Expert and gold trajectories are written with it."""
        tag = next((t for t in self.tool_tags if t.tool == tool), None)
        if tag is None:
            raise ValueError(f"dialect {self.name!r} has no tag for tool {tool!r}")
        query = arguments.get("query") if len(arguments) == 1 else None
        content = query if isinstance(query, str) else json.dumps(dict(arguments), ensure_ascii=False)
        return f"{tag.open} {content} {tag.close}"

    def write_search(self, query: str) -> str:
        """The text of a search for ``query``."""
        return self.write_call("search", {"query": query})

    def write_answer(self, answer: str) -> str:
        """The text of the final answer."""
        return f"{self.answer_open} {answer} {self.answer_close}"

    def split_queries(self, content: str) -> tuple[str, ...]:
        parts = [content]
        for sep in self.query_separators:
            parts = [p for chunk in parts for p in chunk.split(sep)]
        queries = [p.strip() for p in parts if p.strip()]
        return tuple(dict.fromkeys(queries))[: self.max_queries_per_search]

    def neutralize(self, text: str) -> str:
        """``text`` with every tag of the dialect in it made ordinary text (``<`` -> ``&lt;``, ``>`` -> ``&gt;`` of
        that occurrence; a word joiner after the first character of a tag with neither), so that untrusted text
        (a passage, a tool's result, a user's message) can neither end an observation nor hold an answer or an
        action. Idempotent; text without the dialect's tags is returned as it is."""
        pattern = re.compile("|".join(map(re.escape, sorted(self.tags, key=len, reverse=True))))
        while pattern.search(text):  # one pass does it for the shipped tags; odd custom ones might re-form
            text = pattern.sub(_defuse, text)
        return text

    def neutral_hit(self, hit: Hit) -> Hit:
        """``hit`` with the dialect's tags in its title and text made ordinary text (itself when it has none)."""
        title, text = self.neutralize(hit.title), self.neutralize(hit.text)
        return hit if (title, text) == (hit.title, hit.text) else replace(hit, title=title, text=text)

    def forged_tags(self, text: str) -> list[str]:
        """Environment tags present in model-written text."""
        return [tag for tag in self.environment_tags if tag in text]

    def extract_answer(self, text: str) -> str | None:
        """The content of the last complete answer tag pair, or None."""
        end = text.rfind(self.answer_close)
        if end < 0:
            return None
        start = text.rfind(self.answer_open, 0, end)
        if start < 0:
            return None
        return text[start + len(self.answer_open):end].strip()

    # ---------------------------------------------------------------------------------- observations

    def format_passages(self, hits: Sequence[Hit]) -> str:
        return self.format_passages_with_spans(hits)[0]

    def format_passages_with_spans(self, hits: Sequence[Hit]) -> tuple[str, list[tuple[int, int]]]:
        """The passages' text and, per hit, the ``[start, end)`` character span of its ``{text}`` in it (the
        whole passage when the template has no ``{text}``): the engine uses the spans to tell which passages
        a truncated observation still shows."""
        head_template, has_text, _ = self.passage_template.partition("{text}")
        out: list[str] = []
        spans: list[tuple[int, int]] = []
        pos = 0
        for i, h in enumerate(hits, start=1):
            if out:
                pos += len(self.passage_joiner)
            block = self.passage_template.format(i=i, title=h.title, text=h.text)
            if has_text:
                start = pos + len(head_template.format(i=i, title=h.title))
                spans.append((start, start + len(h.text)))
            else:
                spans.append((pos, pos + len(block)))
            out.append(block)
            pos += len(block)
        return self.passage_joiner.join(out), spans

    def wrap_observation(self, body: str) -> str:
        return f"\n\n{self.observation_open}\n{body}\n{self.observation_close}\n\n"


# Prompt languages: the labels of a base model's plain-text prompt ("{system}\n\nUser: {question}\nAssistant:").
LANGUAGES: dict[str, tuple[str, str]] = {"en": ("User", "Assistant"), "zh": ("用户", "助手")}

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


def agentic_dialect() -> Dialect:
    return Dialect(
        name="agentic",
        tool_tags=[ToolTag("<search>", "</search>", "search")],
        backtrack=("<backtrack>", "</backtrack>"),
        summary=("<summary>", "</summary>"),
        content_tags=[("<think>", "</think>"), ("<plan>", "</plan>"), ("<reasoning>", "</reasoning>"),
                      ("<conclusion>", "</conclusion>")],
        prompts={"en": _EN["agentic"], "zh": _ZH["agentic"]},
    )


def search_r1_dialect() -> Dialect:
    return Dialect(
        name="search-r1",
        tool_tags=[ToolTag("<search>", "</search>", "search")],
        observation_open="<information>",
        observation_close="</information>",
        content_tags=[("<think>", "</think>")],
        query_separators=(),
        max_queries_per_search=1,
        passage_template='Doc {i}(Title: "{title}") {text}',
        prompts={"en": _EN["search-r1"], "zh": _ZH["search-r1"]},
    )


def r1_searcher_dialect() -> Dialect:
    return Dialect(
        name="r1-searcher",
        tool_tags=[ToolTag("<|begin_of_query|>", "<|end_of_query|>", "search")],
        observation_open="<|begin_of_documents|>",
        observation_close="<|end_of_documents|>",
        content_tags=[("<think>", "</think>")],
        query_separators=(),
        max_queries_per_search=1,
        passage_template="({i})Title: {title} Text: {text}",
        prompts={"en": _EN["r1-searcher"], "zh": _ZH["r1-searcher"]},
    )


# The dialect registry: every dialect name anywhere (configs, command-line choices, checks) comes from here.
def native_dialect() -> Dialect:
    """The model's own tool-call format (:mod:`.native`)."""
    from .native import NativeDialect

    return NativeDialect()


DIALECTS = {"agentic": agentic_dialect, "search-r1": search_r1_dialect, "r1-searcher": r1_searcher_dialect,
            "native": native_dialect}


def get_dialect(name: str) -> Dialect:
    try:
        return DIALECTS[name]()
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; choose one of {', '.join(DIALECTS)}") from None


def memory_actions(name: str) -> tuple[str, ...]:
    """The memory actions (``backtrack``, ``summary``) dialect ``name`` has."""
    d = get_dialect(name)
    return tuple(a for a, tags in (("backtrack", d.backtrack), ("summary", d.summary)) if tags)


def _defuse(match: re.Match[str]) -> str:
    """A tag occurrence made ordinary text (:meth:`Dialect.neutralize`)."""
    tag = match.group()
    if "<" in tag or ">" in tag:
        return tag.replace("<", "&lt;").replace(">", "&gt;")
    return tag[0] + "\u2060" + tag[1:]


_TAG = re.compile(r"</?[a-z_]+>|<\|[a-z_]+\|>")


def tags_in(text: str) -> list[str]:
    """Every tag-looking token of ``text`` in order (``<x>``, ``</x>``, ``<|x|>``)."""
    return _TAG.findall(text)
