"""In-process Python tools: an async (or sync) function with a JSON Schema.

The schema comes from a pydantic model (``input_model``) or is given
explicitly (``input_schema``). With a model, the input is validated before the
function runs, and a validation error becomes the call's error text, which
the model sees.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pydantic import BaseModel, ValidationError

from server.tools.base import ToolError, ToolExecution


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
