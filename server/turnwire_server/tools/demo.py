"""Demo tools, enabled by default (``tools.demo``): time, calculator, weather.

``get_current_time`` and ``calculator`` give real answers; ``get_weather`` is
offline and returns deterministic sample data (it says so in its output), so
the demo runs without a network.
"""

from __future__ import annotations

import ast
import datetime as dt
import hashlib
import operator
import zoneinfo
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field

from turnwire.tools import PythonTool, ToolError, ToolExecution, tool


class TimeInput(BaseModel):
    """Input of get_current_time."""

    timezone: str = Field("UTC", description="IANA time zone, for example Europe/Paris")


@tool(TimeInput, name="get_current_time")
async def get_current_time(input: TimeInput, execution: ToolExecution) -> dict[str, str]:
    """Get the current date and time in an IANA time zone."""
    try:
        zone = zoneinfo.ZoneInfo(input.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ToolError(f"unknown time zone {input.timezone!r}; use an IANA name like Europe/Paris") from None
    now = dt.datetime.now(zone)
    return {
        "timezone": input.timezone,
        "iso": now.isoformat(timespec="seconds"),
        "weekday": now.strftime("%A"),
    }


class CalculatorInput(BaseModel):
    """Input of calculator."""

    expression: str = Field(description="arithmetic with + - * / ** % and parentheses, e.g. (2+3)*4")


_OPERATORS: dict[type[ast.AST], Callable[..., Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _evaluate(node: ast.AST) -> float | int:
    # A whitelist walk of the AST: never eval() model input.
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ToolError("exponent too large (at most 100)")
        return _OPERATORS[type(node.op)](left, right)  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))  # type: ignore[no-any-return]
    raise ToolError(f"unsupported expression element: {type(node).__name__}")


@tool(CalculatorInput, name="calculator")
async def calculator(input: CalculatorInput, execution: ToolExecution) -> dict[str, Any]:
    """Evaluate an arithmetic expression exactly as a calculator would."""
    if len(input.expression) > 200:
        raise ToolError("expression too long (at most 200 characters)")
    try:
        tree = ast.parse(input.expression, mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {input.expression!r}") from None
    try:
        value = _evaluate(tree)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    return {"expression": input.expression, "result": value}


class WeatherInput(BaseModel):
    """Input of get_weather."""

    city: str = Field(min_length=1, max_length=100, description="city name, for example Paris")


_CONDITIONS = ("sunny", "partly cloudy", "overcast", "light rain", "windy", "clear")


@tool(WeatherInput, name="get_weather")
async def get_weather(input: WeatherInput, execution: ToolExecution) -> dict[str, Any]:
    """Get the current weather for a city (offline demo data, stable per city)."""
    digest = hashlib.sha256(input.city.strip().lower().encode()).digest()
    return {
        "city": input.city.strip(),
        "condition": _CONDITIONS[digest[0] % len(_CONDITIONS)],
        "temperature_c": digest[1] % 35 - 5,
        "source": "offline demo data",
    }


DEMO_TOOLS: tuple[PythonTool, ...] = (get_current_time, calculator, get_weather)
"""The demo tools, in the order they are offered to the model."""
