"""Tool executors behind one interface (:class:`Tool`): in-process Python tools and the demo set."""

from server.tools.base import Tool, ToolError, ToolExecution, definition_of
from server.tools.loading import ToolLoadError, load_tools
from server.tools.python_tool import PythonTool, tool

__all__ = [
    "PythonTool",
    "Tool",
    "ToolError",
    "ToolExecution",
    "ToolLoadError",
    "definition_of",
    "load_tools",
    "tool",
]
