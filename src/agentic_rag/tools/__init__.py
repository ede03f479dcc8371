"""Model-facing tools: the index search, web search, typed Python functions and per-rollout classes
(:mod:`.python`), MCP servers' tools (:mod:`.mcp`), their registry (:mod:`.base`), the ``tools:`` section
(:mod:`.settings`) and the one function that builds it (:func:`.build.build_tools`). See docs/guides/tools.md."""

from .base import FunctionTool, SearchTool, Tool, ToolError, ToolRegistry, ToolResult
from .build import build_tools
from .python import PythonTool, ToolLoadError, python_tools
from .web import WebSearchTool

__all__ = ["FunctionTool", "PythonTool", "SearchTool", "Tool", "ToolError", "ToolLoadError", "ToolRegistry",
           "ToolResult", "WebSearchTool", "build_tools", "python_tools"]
