"""Tools: the interface every tool home implements, and in-process Python tools.

Every tool home exposes :class:`Tool` (today: in-process Python tools, this
module's :class:`PythonTool`); the engine sees nothing else. A tool either
returns its result (any JSON value) or is an async generator whose yields are
preliminary results and whose last yield is the final one (docs/semantics.md §3,
streaming tools).

In-process Python tools take their schema from a pydantic model (``@tool(Model)``)
or are given one explicitly (:class:`PythonTool`); with a model, the input is
validated before the function runs and a validation error becomes the call's
error text, which the model sees.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ValidationError

from turnwire.types import ToolDefinition


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
    blocks or substitutes the call (docs/semantics.md §3).
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


class PythonTool:
    """A tool backed by a Python callable.

    ``function(input, execution)`` receives the validated input (an instance of
    ``input_model``, or the raw dict when only ``input_schema`` is given) and
    the :class:`ToolExecution`. It may be sync, async, or an async generator
    (a streaming tool). Raises :class:`ValueError` when neither or both of
    ``input_model`` and ``input_schema`` are given.
    """

    def __init__(
        self,
        name: str,
        description: str,
        function: Callable[[Any, ToolExecution], Any | Awaitable[Any]],
        *,
        input_model: type[BaseModel] | None = None,
        input_schema: Mapping[str, Any] | None = None,
    ) -> None:
        if (input_model is None) == (input_schema is None):
            raise ValueError(f"tool {name!r}: give exactly one of input_model or input_schema")
        self.name = name
        self.description = description
        self.function = function
        #: True for an async-generator function: its yields are preliminary results.
        self.streaming = inspect.isasyncgenfunction(function)
        self.input_model = input_model
        if input_model is not None:
            schema = input_model.model_json_schema()
            schema.pop("title", None)
            self.input_schema: Mapping[str, Any] = schema
        else:
            assert input_schema is not None
            self.input_schema = input_schema

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any:
        """Validate ``input`` and call the function; returns its result (or async iterator).

        Raises :class:`ToolError` with pydantic's message when ``input`` does not
        match ``input_model``.
        """
        argument: Any = input
        if self.input_model is not None:
            try:
                argument = self.input_model.model_validate(input)
            except ValidationError as error:
                problems = "; ".join(
                    f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in error.errors()
                )
                raise ToolError(f"invalid input for tool {self.name!r}: {problems}") from None
        result = self.function(argument, execution)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, BaseModel):
            return result.model_dump(mode="json")
        return result

    def __repr__(self) -> str:
        return f"PythonTool({self.name!r})"


def tool(
    input_model: type[BaseModel], *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[[Any, ToolExecution], Any]], PythonTool]:
    """Decorator: turn ``async def f(input: Model, execution) -> ...`` into a :class:`PythonTool`.

    The name defaults to the function's name, the description to its docstring.
    """

    def wrap(function: Callable[[Any, ToolExecution], Any]) -> PythonTool:
        return PythonTool(
            name or function.__name__,
            description or inspect.getdoc(function) or "",
            function,
            input_model=input_model,
        )

    return wrap
