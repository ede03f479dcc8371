"""The one function that turns a ``tools:`` section into the agent's tools: training, evaluation, serving, gold
trajectories and ``agentic-rag tools`` all call :func:`build_tools`, so a tool is the same object wherever it runs.

A tool that cannot be made (a module that does not import, a function without a schema, an MCP server that does not
start) is a :class:`~.python.ToolLoadError`: one line naming the tool, raised before any model loads. Tools that
hold resources (an MCP server's process) are closed by :meth:`~.base.ToolRegistry.close`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import SearchTool, ToolRegistry
from .python import ToolLoadError
from .settings import DEFAULT_TOOLS, LIMITS, spec_problems

log = logging.getLogger(__name__)


def build_tools(specs: Sequence[Any] | None = None, *, searcher: Any = None, search: Any = None,
                base_dir: str | Path | None = None) -> ToolRegistry:
    """The tools ``specs`` name (``tools:``; None: ``[search]``), in order. ``search``: the search tool over
    ``searcher`` when given (an entry point that opened and probed it), else over the index ``search`` (the
    :class:`~agentic_rag.search.settings.SearchSettings`) names; with neither, ``search`` is left out (a closed-book
    run). ``base_dir``: where relative paths in the specs start (the config file's folder)."""
    specs = list(DEFAULT_TOOLS if specs is None else specs)
    problem = spec_problems(specs)
    if problem:
        raise ToolLoadError(f"tools: {problem}")
    registry = ToolRegistry()
    try:
        for spec in specs:
            for tool in _tools_of(spec, searcher=searcher, search=search, base_dir=base_dir):
                if tool.name in registry:
                    raise ToolLoadError(f"two tools are named {tool.name!r}: rename one (each tool's name is what the "
                                        f"model calls)")
                registry.register(tool)
    except BaseException:
        registry.close()
        raise
    return registry


def _tools_of(spec: Any, *, searcher: Any, search: Any, base_dir: str | Path | None) -> list[Any]:
    if spec == "search":
        if searcher is None and search is not None and getattr(search, "index", ""):
            from ..search import open_searcher

            searcher = open_searcher(search.index, search.retriever, cache_size=search.cache_size,
                                     timeout=search.timeout_s)
        return [SearchTool(searcher)] if searcher is not None else []
    limits = {k: spec.get(k) for k in LIMITS}
    if "python" in spec:
        from .python import python_tools

        return list(python_tools(spec["python"], base_dir=base_dir, **limits))
    from .mcp import mcp_tools

    return list(mcp_tools(spec["mcp"], base_dir=base_dir, **limits))


def describe_tools(registry: ToolRegistry) -> list[dict[str, Any]]:
    """Each tool's schema with what kind of tool it is and its limits (``agentic-rag tools``)."""
    from .base import is_argument_tool, retrieves, schema

    out = []
    for tool in registry:
        kind = "search" if retrieves(tool) else "function" if is_argument_tool(tool) else "query"
        out.append({**schema(tool), "kind": kind, "max_calls": getattr(tool, "max_calls", None),
                    "max_observation_tokens": getattr(tool, "max_observation_tokens", None)})
    return out
