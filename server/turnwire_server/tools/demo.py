"""Demo tools, enabled by default (``tools.demo``): time, calculator, weather.

``get_current_time`` and ``calculator`` give real answers; ``get_weather`` is
offline and returns deterministic sample data (it says so in its output), so
the demo runs without a network. The calculator bounds every number before it
computes it (see ``MAX_INTEGER_BITS``), so no expression can keep it busy.
"""

from __future__ import annotations

import ast
import datetime as dt
import hashlib
import math
import operator
import sys
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


MAX_EXPRESSION_CHARS = 200
"""Longest expression the calculator reads."""
MAX_DEPTH = 100
"""Deepest nesting of operations (a 200-character sum of 100 terms fits; 101 unary signs do not)."""
MAX_LITERAL_DIGITS = 100
"""Most digits of an integer written in the expression."""
MAX_EXPONENT = 100
"""Largest absolute exponent of ``**``."""
MAX_INTEGER_BITS = 10_000
"""Largest integer the calculator computes with (about 3,000 digits), intermediate results included.

Results are exact (JSON text keeps integers of any size); 3,000 digits also stay
under Python's default limit on writing an integer out (4,300 digits).

Bounding every integer before it is computed bounds the time of every step:
CPython computes a big-integer power in one uninterruptible C call, so an
unbounded one (``((9**99)**99)**99``) would take minutes and, on the event loop
or in a thread holding the GIL, stall the whole process.
"""

_LOG10_2 = math.log10(2)

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


def _digits(bits: float) -> int:
    """About how many decimal digits an integer of ``bits`` bits has."""
    return int(bits * _LOG10_2) + 1


def _too_large(bits: float) -> ToolError:
    return ToolError(
        f"number too large: the result would have about {_digits(bits):,} digits (the calculator works "
        f"with integers of at most {MAX_INTEGER_BITS:,} bits, about {_digits(MAX_INTEGER_BITS):,} digits)"
    )


def _check_size(node: ast.BinOp, left: float | int, right: float | int) -> None:
    """Refuse an integer operation whose result would exceed MAX_INTEGER_BITS, before computing it."""
    if isinstance(node.op, ast.Pow):
        if abs(right) > MAX_EXPONENT:
            raise ToolError(f"exponent too large (at most {MAX_EXPONENT})")
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            bits = right * math.log2(abs(left))  # the result has floor(bits) + 1 bits
            if bits >= MAX_INTEGER_BITS:
                raise _too_large(bits)
    elif isinstance(node.op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
        bits = abs(left).bit_length() + abs(right).bit_length()
        if bits > MAX_INTEGER_BITS and left and right:
            raise _too_large(bits)


def _evaluate(node: ast.AST, depth: int = 0) -> float | int:
    # A whitelist walk of the AST: never eval() model input. Every operation is bounded
    # before it runs (see MAX_INTEGER_BITS); floats overflow to an error, not to inf.
    if depth > MAX_DEPTH:
        raise ToolError(f"expression nested too deeply (at most {MAX_DEPTH} levels)")
    if isinstance(node, ast.Expression):
        return _evaluate(node.body, depth + 1)
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        if isinstance(node.value, int) and len(str(abs(node.value))) > MAX_LITERAL_DIGITS:
            raise ToolError(f"number too long (at most {MAX_LITERAL_DIGITS} digits)")
        if isinstance(node.value, float) and not math.isfinite(node.value):
            raise ToolError("number too large (beyond about 1.8e308)")
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left, right = _evaluate(node.left, depth + 1), _evaluate(node.right, depth + 1)
        _check_size(node, left, right)
        return _real(_OPERATORS[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _real(_OPERATORS[type(node.op)](_evaluate(node.operand, depth + 1)))
    raise ToolError(f"unsupported expression element: {type(node).__name__}")


def _real(value: Any) -> float | int:
    """``value`` if it is a finite real number; otherwise the error the model sees."""
    if isinstance(value, complex):
        raise ToolError("the result is not a real number (a fractional power of a negative number)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("number too large (beyond about 1.8e308)")
    if isinstance(value, int) and abs(value).bit_length() > MAX_INTEGER_BITS:  # a safety net
        raise _too_large(abs(value).bit_length())
    return value  # type: ignore[no-any-return]


def evaluate(expression: str) -> float | int:
    """The value of an arithmetic ``expression``, computed within the calculator's limits.

    Raises :class:`ToolError` (the message the model reads) for anything else:
    a syntax error, an element that is not arithmetic, division by zero, and
    an expression, nesting, literal, exponent or result beyond the limits
    above. Every operation is checked before it runs, so this returns (or
    refuses) within milliseconds.
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"expression too long (at most {MAX_EXPRESSION_CHARS} characters)")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    try:
        value = _evaluate(tree)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("number too large (beyond about 1.8e308)") from None
    if isinstance(value, int):
        try:
            str(value)  # the result travels as JSON text
        except ValueError:  # beyond sys.get_int_max_str_digits(), if set below MAX_INTEGER_BITS
            raise ToolError(
                f"result too long to write out: about {_digits(value.bit_length()):,} digits "
                f"(at most {sys.get_int_max_str_digits():,})"
            ) from None
    return value


@tool(CalculatorInput, name="calculator")
def calculator(input: CalculatorInput, execution: ToolExecution) -> dict[str, Any]:
    """Evaluate an arithmetic expression exactly as a calculator would."""
    # Synchronous, so it runs in a worker thread; its limits keep every call to milliseconds.
    return {"expression": input.expression, "result": evaluate(input.expression)}


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
