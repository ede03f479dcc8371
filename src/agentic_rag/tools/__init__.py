"""Model-facing tools: what a search action calls. A small registry of named tools (see :mod:`.base`)."""

from .base import FunctionTool, SearchTool, Tool, ToolError, ToolRegistry, ToolResult
from .web import WebSearchTool

__all__ = ["FunctionTool", "SearchTool", "Tool", "ToolError", "ToolRegistry", "ToolResult", "WebSearchTool"]
