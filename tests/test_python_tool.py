"""``turnwire.tools``: the ``@tool`` decorator and :class:`PythonTool` on their own.

Schema from a pydantic model, name and description defaults, input validation
errors as :class:`ToolError` text (with the field path), sync / async /
async-generator functions, pydantic results dumped to JSON, and the
``input_model`` / ``input_schema`` choice.
"""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pydantic import BaseModel, Field
from support.engine_harness import EngineFactory, end_of, of_kind

from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import PythonTool, Tool, ToolError, ToolExecution, definition_of, tool
from turnwire_client.v1 import event_pb2


class Address(BaseModel):
    zip: int


class Lookup(BaseModel):
    """Which item to look up."""

    sku: str = Field(description="the stock keeping unit")
    tags: list[int] = []
    address: Address | None = None


class Color(enum.Enum):
    RED = "red"


class Stock(BaseModel):
    sku: str
    units: int
    checked: dt.datetime
    color: Color


CHECKED = dt.datetime(2025, 3, 4, 5, 6, 7, tzinfo=dt.UTC)


def execution() -> ToolExecution:
    return ToolExecution(tool_call_id="call-1", conversation_id="conv-1", request_id="req-1", step_number=0)


# --------------------------------------------------------------------------- schema, name, description


def test_the_schema_is_the_models_json_schema_without_its_title() -> None:
    @tool(Lookup)
    async def lookup(input: Lookup, execution: ToolExecution) -> str:
        return input.sku

    expected = Lookup.model_json_schema()
    assert expected["title"] == "Lookup"  # pydantic puts one there ...
    del expected["title"]
    assert "title" not in lookup.input_schema  # ... the tool leaves it out
    assert lookup.input_schema == expected
    # Everything else is kept: the model's docstring, field descriptions, $defs for nested models.
    assert lookup.input_schema["description"] == "Which item to look up."
    assert lookup.input_schema["properties"]["sku"]["description"] == "the stock keeping unit"
    assert lookup.input_schema["required"] == ["sku"]
    assert "Address" in lookup.input_schema["$defs"]
    # The model class itself is not changed.
    assert Lookup.model_json_schema()["title"] == "Lookup"


def test_name_and_description_default_to_the_functions_name_and_docstring() -> None:
    @tool(Lookup)
    async def lookup_stock(input: Lookup, execution: ToolExecution) -> str:
        """Units in stock for a SKU.

        Counts every warehouse.
        """
        return input.sku

    assert isinstance(lookup_stock, PythonTool)
    assert lookup_stock.name == "lookup_stock"
    # inspect.getdoc: the docstring dedented, without the leading and trailing blank lines.
    assert lookup_stock.description == "Units in stock for a SKU.\n\nCounts every warehouse."
    assert definition_of(lookup_stock).name == "lookup_stock"
    assert definition_of(lookup_stock).description == lookup_stock.description
    assert definition_of(lookup_stock).input_schema == lookup_stock.input_schema


def test_an_explicit_name_and_description_win() -> None:
    @tool(Lookup, name="find", description="Find an item.")
    async def lookup_stock(input: Lookup, execution: ToolExecution) -> str:
        """Not this."""
        return input.sku

    assert (lookup_stock.name, lookup_stock.description) == ("find", "Find an item.")
    assert repr(lookup_stock) == "PythonTool('find')"


def test_without_a_docstring_the_description_is_empty() -> None:
    @tool(Lookup)
    def bare(input: Lookup, execution: ToolExecution) -> str:
        return input.sku

    assert bare.description == ""


def test_a_python_tool_is_a_tool() -> None:
    @tool(Lookup)
    async def lookup(input: Lookup, execution: ToolExecution) -> str:
        return input.sku

    assert isinstance(lookup, Tool)
    assert isinstance(PythonTool("raw", "d", lambda i, e: i, input_schema={"type": "object"}), Tool)


# --------------------------------------------------------------------------- input_model / input_schema


def test_neither_input_model_nor_input_schema_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"tool 'nothing': give exactly one of input_model or input_schema"):
        PythonTool("nothing", "d", lambda i, e: i)


def test_both_input_model_and_input_schema_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"tool 'both': give exactly one of input_model or input_schema"):
        PythonTool("both", "d", lambda i, e: i, input_model=Lookup, input_schema={"type": "object"})


async def test_with_input_schema_the_function_gets_the_raw_dict_unvalidated() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    seen: list[Any] = []

    def record(input: dict[str, Any], execution: ToolExecution) -> str:
        seen.append(input)
        return "ok"

    raw = PythonTool("raw", "A raw tool.", record, input_schema=schema)
    assert raw.input_schema is schema
    assert raw.input_model is None
    assert await raw.execute({"q": 5}, execution()) == "ok"  # not checked against the schema
    assert seen == [{"q": 5}]


# --------------------------------------------------------------------------- validation errors


async def test_a_valid_input_reaches_the_function_as_a_model_instance() -> None:
    received: list[Any] = []

    @tool(Lookup)
    async def lookup(input: Lookup, execution: ToolExecution) -> str:
        received.append((input, execution.tool_call_id))
        return "ok"

    assert await lookup.execute({"sku": "A-1", "tags": ["2"]}, execution()) == "ok"
    [(model, call_id)] = received
    assert isinstance(model, Lookup)
    assert model == Lookup(sku="A-1", tags=[2])  # pydantic's lax mode converts "2"
    assert call_id == "call-1"


@pytest.mark.parametrize(
    ("bad_input", "problems"),
    [
        ({}, "sku: Field required"),
        ({"sku": 1}, "sku: Input should be a valid string"),
        (
            {"sku": "a", "tags": [1, "x"]},
            "tags.1: Input should be a valid integer, unable to parse string as an integer",
        ),
        (
            {"sku": "a", "address": {"zip": "z"}},
            "address.zip: Input should be a valid integer, unable to parse string as an integer",
        ),
        (
            {"tags": "x"},
            "sku: Field required; tags: Input should be a valid list",
        ),
        # Not an object at all: no field path, so the error names the whole input.
        ([1], "input: Input should be a valid dictionary or instance of Lookup"),
    ],
    ids=["missing", "wrong-type", "list-item", "nested", "two-problems", "not-an-object"],
)
async def test_a_validation_error_is_a_tool_error_naming_the_field_path(
    bad_input: Any, problems: str
) -> None:
    called: list[Any] = []

    @tool(Lookup)
    async def lookup(input: Lookup, execution: ToolExecution) -> str:
        called.append(input)
        return "ok"

    with pytest.raises(ToolError) as invalid:
        await lookup.execute(bad_input, execution())
    assert str(invalid.value) == f"invalid input for tool 'lookup': {problems}"
    # pydantic's exception is not chained: the model sees only this text.
    assert invalid.value.__cause__ is None and invalid.value.__suppress_context__
    assert called == []  # the function never ran


async def test_the_engine_reports_the_validation_text_as_the_calls_error(make_engine: EngineFactory) -> None:
    @tool(Lookup)
    async def lookup(input: Lookup, execution: ToolExecution) -> str:
        return "ok"

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="lookup", input={"sku": "a", "tags": ["x"]})]),
                ScriptStep(text="sorry"),
            ]
        },
        tools=[lookup],
    )
    events = await h.run()
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    [error] = of_kind(events, "tool_output_error")
    assert error.error_text == (
        "invalid input for tool 'lookup': tags.0: Input should be a valid integer, "
        "unable to parse string as an integer"
    )


# --------------------------------------------------------------------------- function kinds and results


async def test_a_sync_function_is_called_and_its_result_returned() -> None:
    @tool(Lookup)
    def count(input: Lookup, execution: ToolExecution) -> dict[str, Any]:
        return {"sku": input.sku, "units": 3}

    assert count.streaming is False
    assert await count.execute({"sku": "A-1"}, execution()) == {"sku": "A-1", "units": 3}


async def test_an_async_function_is_awaited() -> None:
    @tool(Lookup)
    async def count(input: Lookup, execution: ToolExecution) -> list[Any]:
        return [input.sku, execution.step_number, None]

    assert count.streaming is False
    assert await count.execute({"sku": "A-1"}, execution()) == ["A-1", 0, None]


async def test_an_async_generator_function_is_a_streaming_tool_returning_its_iterator() -> None:
    @tool(Lookup)
    async def progress(input: Lookup, execution: ToolExecution) -> AsyncIterator[dict[str, Any]]:
        yield {"progress": 1}
        yield {"done": input.sku}

    assert progress.streaming is True
    result = await progress.execute({"sku": "A-1"}, execution())
    assert isinstance(result, AsyncIterator)
    assert [item async for item in result] == [{"progress": 1}, {"done": "A-1"}]


async def test_an_async_generator_still_validates_before_it_starts() -> None:
    @tool(Lookup)
    async def progress(input: Lookup, execution: ToolExecution) -> AsyncIterator[int]:
        yield 1

    with pytest.raises(ToolError, match=r"^invalid input for tool 'progress': sku: Field required$"):
        await progress.execute({}, execution())


@pytest.mark.parametrize("kind", ["sync", "async"])
async def test_a_pydantic_result_is_dumped_to_json_values(kind: str) -> None:
    stock = Stock(sku="A-1", units=3, checked=CHECKED, color=Color.RED)

    def sync_stock(input: Lookup, execution: ToolExecution) -> Stock:
        return stock

    async def async_stock(input: Lookup, execution: ToolExecution) -> Stock:
        return stock

    stock_tool = tool(Lookup, name="stock")(sync_stock if kind == "sync" else async_stock)
    result = await stock_tool.execute({"sku": "A-1"}, execution())
    # mode="json": the datetime and the enum become JSON strings, not Python objects.
    assert result == {"sku": "A-1", "units": 3, "checked": "2025-03-04T05:06:07Z", "color": "red"}


async def test_a_tool_error_raised_by_the_function_propagates_unchanged() -> None:
    failure = ToolError("the warehouse is closed")

    @tool(Lookup)
    async def closed(input: Lookup, execution: ToolExecution) -> str:
        raise failure

    with pytest.raises(ToolError) as raised:
        await closed.execute({"sku": "A-1"}, execution())
    assert raised.value is failure
