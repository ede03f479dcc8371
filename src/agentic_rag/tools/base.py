"""Tools the model calls, and the registry that names them.

Every tool has a ``name``, a ``description`` and ``parameters`` (the JSON schema of its arguments):
:meth:`ToolRegistry.schemas` is what a chat template lists (the native dialect) and what ``agentic-rag tools`` shows.
Two shapes, both called in batches (the engine gathers every paused sequence's calls of a tool into one call):

* a **query tool** answers queries: ``tool.batch(queries, k)`` returns, per query, a list of
  :class:`~agentic_rag.search.Hit` (shown as passages) or a string (shown as is). Its one argument is ``query``.
  :class:`SearchTool` and :class:`~.web.WebSearchTool` *retrieve* (``retrieves = True``): their calls are searches
  (``rollout.max_searches``, search events, the retrieval rewards); :class:`FunctionTool` (a function of a query) is
  not.
* an **argument tool** takes typed arguments: ``tool.call_batch([(arguments, state), ...])`` returns a string (or a
  :class:`ToolError`) per call; ``state`` is what ``tool.new_state(row)`` made for the call's rollout (a class tool's
  instance, :mod:`.python`; None for a plain function). Python functions and classes (:mod:`.python`) and MCP
  servers' tools (:mod:`.mcp`) are argument tools.

A tool that raises fails its whole batch; the engine turns that into an error observation for each caller, counts
it, and goes on. ``max_calls`` (None: no limit but the turns) and ``max_observation_tokens`` (None: the rollout's)
are a tool's own limits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from ..search.types import Hit, PartialSearchError, Searcher


class ToolError(str):
    """One query's failure inside an otherwise answered batch: the text the model sees in its observation.
    The engine records it as an error event (counted like a failed search); a plain ``str`` result is a
    tool's ordinary text output."""


ToolResult = list[Hit] | str


QUERY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {"query": {
    "type": "string", "description": "what to search for"}}, "required": ["query"]}


@runtime_checkable
class Tool(Protocol):
    name: str
    description: str


def schema(tool: Any) -> dict[str, Any]:
    """``{"name", "description", "parameters"}`` of any tool (a query tool without its own ``parameters`` takes one
    ``query``)."""
    return {"name": tool.name, "description": getattr(tool, "description", "") or tool.name,
            "parameters": getattr(tool, "parameters", None) or QUERY_PARAMETERS}


def is_argument_tool(tool: Any) -> bool:
    return callable(getattr(tool, "call_batch", None))


def retrieves(tool: Any) -> bool:
    """Whether ``tool``'s calls are searches (passages shown, counted against ``max_searches``)."""
    return bool(getattr(tool, "retrieves", False))


class SearchTool:
    """Wiki or document search over any :class:`Searcher`: a local index or a search server URL."""

    retrieves = True
    parameters = QUERY_PARAMETERS

    def __init__(self, searcher: Searcher, name: str = "search",
                 description: str = "Search the document collection; returns the best matching passages."):
        self.searcher, self.name, self.description = searcher, name, description
        self.max_calls: int | None = None  # the search tool's limit is rollout.max_searches
        self.max_observation_tokens: int | None = None

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
    """A query tool from a function of one query (or a batch function with ``batched=True``). For typed arguments,
    see :mod:`.python`."""

    parameters = QUERY_PARAMETERS

    def __init__(self, name: str, fn: Callable, description: str = "", batched: bool = False,
                 retrieves: bool | None = None):
        """``retrieves``: whether its calls are searches (None: when it is registered as ``search``, the tool the
        search tags call)."""
        self.name, self.fn, self.description, self.batched = name, fn, description or name, batched
        self.retrieves = name == "search" if retrieves is None else retrieves
        self.max_calls: int | None = None
        self.max_observation_tokens: int | None = None

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
        if not callable(getattr(tool, "batch", None)) and not is_argument_tool(tool):
            raise TypeError(f"tool {name!r} has neither batch(queries, k) nor call_batch(calls)")
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

    def __iter__(self):
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def schemas(self) -> list[dict[str, Any]]:
        """Every tool's name, description and argument schema, in order."""
        return [schema(t) for t in self._tools.values()]

    def new_states(self, row: Mapping[str, Any]) -> dict[Any, Any]:
        """The per-rollout state of every tool that has one (a class tool's instance, ``reset(**row)``), by the
        tool's ``state_key``: the methods of one class share one instance."""
        states: dict[Any, Any] = {}
        for tool in self._tools.values():
            key = getattr(tool, "state_key", None)
            if key is not None and key not in states:
                states[key] = tool.new_state(row)
        return states

    def close(self) -> None:
        """Close what the tools hold open (an MCP server's process, an HTTP client), each once."""
        closed: set[int] = set()
        for tool in self._tools.values():
            owner = getattr(tool, "owner", tool)
            close = getattr(owner, "close", None)
            if callable(close) and id(owner) not in closed:
                closed.add(id(owner))
                close()
