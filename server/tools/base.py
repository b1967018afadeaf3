"""The tool interface: a named, described, schema-typed async callable.

Every tool home (in-process Python, remote tool hosts, MCP servers) exposes
:class:`Tool`; the engine sees nothing else. A tool either returns its result
(any JSON value) or is an async generator whose yields are preliminary
results and whose last yield is the final one (THINK-SEMANTICS.md section 3,
streaming tools).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from server.providers.base import ToolDefinition


@dataclass(slots=True)
class ToolExecution:
    """What a tool gets besides its input.

    ``cancelled`` is set when the turn is cancelled; long-running tools
    should check it (they are also cancelled as asyncio tasks).
    """

    tool_call_id: str
    conversation_id: str
    request_id: str
    step_number: int
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class ToolError(Exception):
    """Raised by a tool to fail with a message the model sees verbatim."""


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call.

    ``input_schema`` is a JSON Schema object. ``execute`` returns a JSON value
    (dict, list, str, number, bool or None), or returns an async iterator of
    JSON values for a streaming tool. Any exception is the call's error: the
    model sees its message and the turn goes on.

    A tool may also set ``streaming = True`` to say it streams preliminary
    results; the engine then emits one preliminary result even when a hook
    blocks or substitutes the call (THINK-SEMANTICS.md section 3).
    """

    name: str
    description: str
    input_schema: Mapping[str, Any]

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any | AsyncIterator[Any]:
        """Run the tool on ``input`` (already a JSON object)."""
        ...


def definition_of(tool: Tool) -> ToolDefinition:
    """The model-facing definition of ``tool``."""
    return ToolDefinition(name=tool.name, description=tool.description, input_schema=tool.input_schema)
