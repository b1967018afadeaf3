"""Tool inputs and outputs stay exact, and whatever is stored stays readable (docs/semantics.md §11).

Before: tool arguments ``{"order_id": 9007199254740993}`` reached the tool exactly but the
history replayed to the model said ``9007199254740992.0``; a result ``{"id":
1234567890123456789}`` went back as ``1.2345678901234568e+18`` (stored as ``Struct`` doubles);
a result with ``NaN`` was stored and sent as ``null``; arguments nested 40 deep were stored but
could not be read back; a 5 MB result made the conversation unreadable for default clients.
"""

from __future__ import annotations

import json
import math
from typing import Any

from support.engine_harness import CONV, EngineFactory, end_of, make_tool, tool_parts

from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import ToolExecution
from turnwire.values import tool_call_input, tool_call_output
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.providers.convert import tool_arguments, tool_result

BIG = 9007199254740993  # 2**53 + 1: a double cannot hold it
HUGE = 1234567890123456789


def _script(raw_input: str) -> dict[str, list[ScriptStep]]:
    return {
        "main": [
            ScriptStep(tool_calls=[ScriptedToolCall(name="lookup", raw_input=raw_input)]),
            ScriptStep(text="done"),
        ]
    }


async def test_big_integers_reach_the_tool_the_store_and_the_model_exactly(
    make_engine: EngineFactory,
) -> None:
    seen: list[Any] = []

    async def lookup(input: dict[str, Any], execution: ToolExecution) -> dict[str, Any]:
        seen.append(input["order_id"])
        return {"id": HUGE, "price": 12.5}

    raw = '{"order_id": 9007199254740993}'
    h = await make_engine(scripts=_script(raw), tools=[make_tool("lookup", lookup)])
    events = await h.run("find my order")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert seen == [BIG] and isinstance(seen[0], int)
    available = next(
        e.tool_input_available for e in events if e.WhichOneof("event") == "tool_input_available"
    )
    assert available.input_json == raw  # the model's own text
    assert not available.HasField("input")  # no view: a double would round it
    output = next(e.tool_output_available for e in events if e.WhichOneof("event") == "tool_output_available")
    assert json.loads(output.output_json) == {"id": HUGE, "price": 12.5}
    call = tool_parts((await h.store.load_messages(CONV))[-1])[0]
    assert tool_call_input(call) == {"order_id": BIG}
    assert tool_call_output(call) == {"id": HUGE, "price": 12.5}
    # What the next model request replays: the model's text, the tool's exact JSON.
    replayed = tool_parts(h.provider.requests[1].messages[-1])[0]
    assert tool_arguments(replayed) == raw
    assert tool_result(replayed) == ('{"id":1234567890123456789,"price":12.5}', False)


async def test_a_non_finite_number_in_a_result_is_an_error_naming_where(make_engine: EngineFactory) -> None:
    async def stats(input: dict[str, Any], execution: ToolExecution) -> dict[str, Any]:
        return {"mean": math.nan, "ok": [1, math.inf]}

    h = await make_engine(scripts=_script("{}"), tools=[make_tool("lookup", stats)])
    events = await h.run("stats")
    error = next(e.tool_output_error for e in events if e.WhichOneof("event") == "tool_output_error")
    assert "not JSON" in error.error_text and "$.mean" in error.error_text
    call = tool_parts((await h.store.load_messages(CONV))[-1])[0]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR and not call.output_json


async def test_deeply_nested_arguments_are_kept_and_stay_readable(make_engine: EngineFactory) -> None:
    deep: Any = {"leaf": 1}
    for _ in range(40):
        deep = {"d": deep}
    raw = json.dumps(deep)
    got: list[Any] = []

    async def lookup(input: dict[str, Any], execution: ToolExecution) -> str:
        got.append(input)
        return "ok"

    h = await make_engine(scripts=_script(raw), tools=[make_tool("lookup", lookup)])
    assert end_of(await h.run("deep")).status == event_pb2.TURN_STATUS_COMPLETED
    assert got == [deep]
    stored = (await h.store.load_messages(CONV))[-1]
    again = message_pb2.Message.FromString(stored.SerializeToString())  # decodes with default limits
    assert tool_call_input(tool_parts(again)[0]) == deep


async def test_a_result_over_the_size_limit_is_an_error_the_model_is_told(make_engine: EngineFactory) -> None:
    async def big(input: dict[str, Any], execution: ToolExecution) -> str:
        return "x" * 5_000_000

    h = await make_engine(scripts=_script("{}"), tools=[make_tool("lookup", big)])
    events = await h.run("big")
    error = next(e.tool_output_error for e in events if e.WhichOneof("event") == "tool_output_error")
    assert "5,000,002 bytes" in error.error_text and "limits.max_tool_output_bytes" in error.error_text
    stored = (await h.store.load_messages(CONV))[-1]
    assert stored.ByteSize() < 4 * 1024 * 1024


async def test_results_that_together_would_outgrow_a_readable_reply_are_errors(
    make_engine: EngineFactory,
) -> None:
    """Each result is under the per-result limit, but five together would make a reply no client
    with gRPC's default 4 MiB limit could read: the ones past the reply's budget are errors."""

    async def chunky(input: dict[str, Any], execution: ToolExecution) -> str:
        return "y" * 900_000

    calls = [ScriptedToolCall(name="lookup", id=f"c{i}") for i in range(5)]
    h = await make_engine(
        scripts={"main": [ScriptStep(tool_calls=calls), ScriptStep(text="done")]},
        tools=[make_tool("lookup", chunky)],
    )
    events = await h.run("many")
    errors = [e.tool_output_error for e in events if e.HasField("tool_output_error")]
    assert errors and all("3 MiB per reply" in e.error_text for e in errors)
    stored = (await h.store.load_messages(CONV))[-1]
    assert stored.ByteSize() < 4 * 1024 * 1024
    end = end_of(events)
    assert end.ByteSize() < 4 * 1024 * 1024  # the terminal event carries the reply: readable too
