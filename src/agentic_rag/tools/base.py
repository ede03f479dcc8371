"""Tools the model calls by tag, and the registry that names them.

A tool answers a batch of queries at once (the engine gathers every paused sequence's queries into one
call): ``tool.batch(queries, k)`` returns, per query, either a list of :class:`~agentic_rag.search.Hit`
(shown as passages) or a string (shown as is). A tool that raises fails the whole call; the engine turns
that into an error observation for each caller, counts it, and goes on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from ..search.types import Hit, PartialSearchError, Searcher


class ToolError(str):
    """One query's failure inside an otherwise answered batch: the text the model sees in its observation.
    The engine records it as an error event (counted like a failed search); a plain ``str`` result is a
    tool's ordinary text output."""


ToolResult = list[Hit] | str


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str

    def batch(self, queries: Sequence[str], k: int) -> list[ToolResult]: ...


class SearchTool:
    """Wiki or document search over any :class:`Searcher`: a local index or a search server URL."""

    def __init__(self, searcher: Searcher, name: str = "search", description: str = "search the document index"):
        self.searcher, self.name, self.description = searcher, name, description

    def batch(self, queries: Sequence[str], k: int) -> list[ToolResult]:
        """Hits per query. A query the backend cannot answer (Lucene rejects it, say) gets a
        :class:`ToolError` of its own; the other queries of the batch keep their hits."""
        try:
            return list(self.searcher.batch_search(list(queries), k))
        except PartialSearchError as exc:
            return [hits if hits is not None else ToolError(f"Search failed: {error}")
                    for hits, error in zip(exc.results, exc.errors, strict=True)]

    @classmethod
    def open(cls, index: str, retriever: str = "bm25", name: str = "search", **kwargs) -> SearchTool:
        """A search tool over an index directory or ``http://`` search server (see ``open_searcher``)."""
        from ..search import open_searcher

        return cls(open_searcher(index, retriever, **kwargs), name=name)


class FunctionTool:
    """A user-defined tool from a function of one query (or a batch function with ``batched=True``)."""

    def __init__(self, name: str, fn: Callable, description: str = "", batched: bool = False):
        self.name, self.fn, self.description, self.batched = name, fn, description or name, batched

    def batch(self, queries: Sequence[str], k: int) -> list[ToolResult]:
        if self.batched:
            out = list(self.fn(list(queries), k))
            if len(out) != len(queries):
                raise RuntimeError(f"tool {self.name!r} returned {len(out)} results for {len(queries)} queries")
            return out
        return [self.fn(q) for q in queries]


class ToolRegistry:
    """Tools by name. ``register`` refuses a second tool under a taken name."""

    def __init__(self, tools: Sequence[Tool] = ()):
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool, name: str | None = None) -> None:
        name = name or tool.name
        if name in self._tools:
            raise ValueError(f"a tool named {name!r} is already registered")
        if not callable(getattr(tool, "batch", None)):
            raise TypeError(f"tool {name!r} has no batch(queries, k) method")
        self._tools[name] = tool

    def get(self, name: str) -> Tool:
        try:
            return self._tools[name]
        except KeyError:
            raise KeyError(f"no tool named {name!r}; registered: {', '.join(self._tools) or 'none'}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._tools

    def names(self) -> list[str]:
        return list(self._tools)
