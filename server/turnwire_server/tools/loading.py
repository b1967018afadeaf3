"""Build the server-side tool set from configuration."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from turnwire.tools import Tool, ToolExecution
from turnwire_server.importing import import_object
from turnwire_server.tools.demo import DEMO_TOOLS


class ToolLoadError(Exception):
    """A configured tool path does not resolve to a tool."""


def _takes_no_arguments(factory: Any) -> bool:
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a builtin without a signature: let the call decide
        return True
    return all(
        p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        for p in signature.parameters.values()
    )


def _as_tools(value: Any, path: str) -> list[Tool]:
    if isinstance(value, Tool):
        return [value]
    if callable(value) and not isinstance(value, type):
        if not _takes_no_arguments(value):
            raise ToolLoadError(
                f"{path} is a plain function {getattr(value, '__name__', '')}{inspect.signature(value)}, "
                "not a tool: decorate it with "
                "@tool(InputModel) from turnwire.tools (docs/tools.md), or point to a zero-argument "
                "function that returns tools"
            )
        try:
            made = value()
        except Exception as error:
            raise ToolLoadError(
                f"{path}(): the tool factory raised {type(error).__name__}: {error}"
            ) from error
        return _as_tools(made, path)
    if isinstance(value, Iterable) and not isinstance(value, str | bytes):
        tools = list(value)
        if all(isinstance(t, Tool) for t in tools):
            return tools
    raise ToolLoadError(f"{path} is not a Tool, a list of Tools, or a callable returning them")


class ApprovalRequired:
    """A configured tool whose every call waits for the client's approval
    (``tools.require_approval``; docs/semantics.md §6). Delegates everything else to ``tool``."""

    needs_approval = True

    def __init__(self, tool: Tool) -> None:
        self.tool = tool
        self.name = tool.name
        self.description = tool.description
        self.input_schema: Mapping[str, Any] = tool.input_schema
        self.streaming = bool(getattr(tool, "streaming", False))
        self.timeout_seconds: float | None = getattr(tool, "timeout_seconds", None)

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any | AsyncIterator[Any]:
        """Run the wrapped tool."""
        return await self.tool.execute(input, execution)

    def __repr__(self) -> str:
        return f"ApprovalRequired({self.tool!r})"


def load_tools(demo: bool, paths: Iterable[str]) -> dict[str, Tool]:
    """The server's in-process tools by name: the demo tools (when ``demo``), then each path's tools.

    A later tool replaces an earlier one of the same name. ``tools.require_approval`` is applied
    to the whole tool set (:class:`~turnwire_server.tools.tool_set.ToolSet`). Raises
    :class:`ToolLoadError` naming the entry (``python[i]``) and the path that failed.
    """
    tools: dict[str, Tool] = {}
    if demo:
        tools.update((t.name, t) for t in DEMO_TOOLS)
    for index, path in enumerate(paths):
        try:
            value = import_object(path)
        except (ImportError, AttributeError, ValueError) as error:
            raise ToolLoadError(f"python[{index}]: cannot import tool {path!r}: {error}") from error
        tools.update((t.name, t) for t in _as_tools(value, path))
    return tools
