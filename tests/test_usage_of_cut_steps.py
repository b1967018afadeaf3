"""Usage is never lost: a step cut short still counts what the provider reported (docs/semantics.md §11).

Before: ``message_start`` reported 1200 input tokens, then ``CancelChat`` gave ``TurnEnd.usage``
0/0; a finished step of 1000 plus a cancelled step of 1100 reported 1000; an in-stream
overload error after 900 input tokens reported 0; a step whose model call had finished (2000
input and 100 output tokens) cancelled while its tool ran reported 0 tokens and no cost.
"""

from __future__ import annotations

import asyncio
from typing import Any

from support.engine_harness import MODEL, EngineFactory, collect, end_of, make_tool

from turnwire.testing import ScriptedError, ScriptedToolCall, ScriptedUsage, ScriptStep
from turnwire.tools import ToolExecution
from turnwire_client.v1 import event_pb2
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings

RATES = {"input_mtok": 3.0, "output_mtok": 15.0}
LONG = " ".join(f"w{i}" for i in range(200))


async def _cancel_at_first_delta(h: Any) -> list[event_pb2.TurnEvent]:
    handle = await h.start("go")

    def on_event(kind: str) -> None:
        if kind == "text_delta":
            handle.cancel()

    return await collect(handle, on_event)


async def test_a_cancelled_step_counts_its_input_tokens(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={"main": [ScriptStep(text=LONG, delay_ms=5, usage=ScriptedUsage(input_tokens=1200))]}
    )
    end = end_of(await _cancel_at_first_delta(h))
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert end.usage.input_tokens == 1200


async def test_a_finished_step_and_a_cancelled_one_add_up(make_engine: EngineFactory) -> None:
    async def ping(input: dict[str, Any], execution: ToolExecution) -> str:
        return "pong"

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(
                    tool_calls=[ScriptedToolCall(name="ping")],
                    usage=ScriptedUsage(input_tokens=1000, output_tokens=10),
                ),
                ScriptStep(text=LONG, delay_ms=5, usage=ScriptedUsage(input_tokens=1100)),
            ]
        },
        tools=[make_tool("ping", ping)],
    )
    end = end_of(await _cancel_at_first_delta(h))
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert (end.usage.input_tokens, end.usage.output_tokens) == (2100, 10)


async def test_an_in_stream_error_counts_the_input_tokens_reported_before_it(
    make_engine: EngineFactory,
) -> None:
    overloaded = ScriptedError(message="Overloaded", status=529, type="overloaded_error", after_chunks=2)
    h = await make_engine(
        scripts={"main": [ScriptStep(text=LONG, usage=ScriptedUsage(input_tokens=900), error=overloaded)]}
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert end.usage.input_tokens == 900


async def test_a_step_cancelled_while_its_tool_runs_counts_its_model_call(make_engine: EngineFactory) -> None:
    # The model call finished (its FinishStep reported the usage); the step's tool is still running
    # when the turn is cancelled: the call was made and billed, so the turn reports it.
    started = asyncio.Event()

    async def slow(input: dict[str, Any], execution: ToolExecution) -> str:
        started.set()
        await asyncio.Event().wait()  # until cancelled
        return "never"

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(
                    tool_calls=[ScriptedToolCall(name="slow")],
                    usage=ScriptedUsage(input_tokens=2000, output_tokens=100),
                ),
                ScriptStep(text="unused"),
            ]
        },
        tools=[make_tool("slow", slow)],
        prices=PriceBook(PricingSettings.model_validate({"models": {MODEL: RATES}})),
        strict=False,
    )
    handle = await h.start("go")
    collecting = asyncio.create_task(collect(handle))
    await asyncio.wait_for(started.wait(), 10)
    handle.cancel()
    end = end_of(await collecting)

    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert (end.usage.input_tokens, end.usage.output_tokens) == (2000, 100)
    assert end.HasField("cost") and end.cost.usd == (2000 * 3.0 + 100 * 15.0) / 1e6
    (stored,), _ = await h.store.list_turns(handle.conversation_id, 10, "")
    assert stored.cost_usd == end.cost.usd  # as ListTurns and GetConversation read it
