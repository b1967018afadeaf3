"""Turn limits and repairs: timeouts, the stall watchdog, repair_tool_call, the hook timeline.

docs/semantics.md §3 (TurnConfig: timeout, stream_stall_timeout_ms,
repair_tool_call) and section 5 (stall watchdog → INTERRUPTED).
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from google.rpc import error_details_pb2
from support.engine_harness import (
    CONV,
    EngineFactory,
    detail,
    echo,
    end_of,
    kinds,
    make_tool,
    text_of,
    tool_parts,
    value,
)

from turnwire.hooks import Middleware, TurnConfig, TurnContext, TurnTimeout
from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import ToolExecution
from turnwire.types import ToolCall
from turnwire_client.v1 import event_pb2, message_pb2


class Configure(Middleware):
    """Returns a fixed TurnConfig from before_turn."""

    def __init__(self, config: TurnConfig) -> None:
        super().__init__()
        self.config = config

    async def before_turn(self, ctx: TurnContext) -> TurnConfig:
        return self.config


SLOW_TEXT = {"main": [ScriptStep(text="one two three four five six", delay_ms=60)]}
#: A reply that never ends by itself: only the limit under test can end the turn, and a
#: deadline of a second leaves the first words time to stream on a loaded machine.
ENDLESS_TEXT = {"main": [ScriptStep(text="one two three ", delay_ms=60, until_cancelled=True)]}


@pytest.mark.parametrize(
    ("limit", "words"),
    [
        (TurnTimeout(total_seconds=1), "total timeout of 1 s"),
        (TurnTimeout(step_seconds=1), "model step 0 exceeded 1 s"),
        (TurnTimeout(chunk_seconds=0.03), "no model output for 0.03 s"),
    ],
)
async def test_a_timeout_ends_the_turn_deadline_exceeded_and_keeps_the_partial(
    make_engine: EngineFactory, limit: TurnTimeout, words: str
) -> None:
    h = await make_engine(scripts=ENDLESS_TEXT, middlewares=[Configure(TurnConfig(timeout=limit))])
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert end.error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert words in end.error.message
    info = detail(end.error, error_details_pb2.ErrorInfo)
    assert info.reason == "MODEL_TIMEOUT"
    stored = await h.store.load_messages(CONV)
    if isinstance(limit, TurnTimeout) and limit.chunk_seconds:
        assert len(stored) == 1  # the first chunk never came in time: nothing to keep
    else:
        assert text_of(stored[-1]).startswith("one ")  # what streamed before the deadline


async def test_a_generous_timeout_changes_nothing(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts=SLOW_TEXT,
        middlewares=[
            Configure(TurnConfig(timeout=TurnTimeout(total_seconds=5, step_seconds=5, chunk_seconds=1)))
        ],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert text_of(end.message) == "one two three four five six"


async def test_stall_watchdog_interrupts_a_silent_tool_and_stores_the_partial(
    make_engine: EngineFactory,
) -> None:
    cancelled = asyncio.Event()

    async def hang(input: dict[str, Any], execution: ToolExecution) -> str:
        try:
            await asyncio.sleep(10)
        finally:
            cancelled.set()
        return "never"

    h = await make_engine(
        scripts={"main": [ScriptStep(text="Waiting.", tool_calls=[ScriptedToolCall(name="hang")])]},
        tools=[make_tool("hang", hang)],
        stream_stall_timeout_seconds=0.15,
    )
    started = asyncio.get_running_loop().time()
    events = await h.run()
    elapsed = asyncio.get_running_loop().time() - started
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_INTERRUPTED
    assert cancelled.is_set()
    assert elapsed < 8  # fired after ~0.15-0.2 s (more on a loaded machine), not after the tool's 10 s
    stored = await h.store.load_messages(CONV)
    assert text_of(stored[-1]) == "Waiting."
    call = tool_parts(stored[-1])[0]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
    assert end.message == stored[-1]


async def test_a_stall_before_the_first_chunk_says_why_and_continuing_it_says_why_not(
    make_engine: EngineFactory,
) -> None:
    """docs/semantics.md §5 and §12: an INTERRUPTED or SKIPPED end carries a status saying why.

    Before: a stall before the first chunk ended INTERRUPTED with no error and only the user
    message stored; ContinueLastTurn then answered SKIPPED with no reason."""
    h = await make_engine(
        scripts={"main": [ScriptStep(text="late", delay_ms=3000)]}, stream_stall_timeout_seconds=0.1
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_INTERRUPTED
    assert end.error.code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
    assert detail(end.error, error_details_pb2.ErrorInfo).reason == "STREAM_STALLED"
    assert "stream_stall_timeout_seconds" in end.error.message
    assert [m.role for m in await h.store.load_messages(CONV)] == [message_pb2.ROLE_USER]
    skipped = end_of(await h.run(None, continuation=True))
    assert skipped.status == event_pb2.TURN_STATUS_SKIPPED
    assert detail(skipped.error, error_details_pb2.ErrorInfo).reason == "NOTHING_TO_CONTINUE"
    assert "the last message is the user's and has no reply yet" in skipped.error.message
    assert detail(skipped.error, error_details_pb2.ErrorInfo).metadata["last_role"] == "user"


async def test_stall_timeout_from_before_turn_overrides_the_default(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={"main": [ScriptStep(text="a b c", delay_ms=100)]},
        middlewares=[Configure(TurnConfig(stream_stall_timeout_seconds=0.04))],
    )
    assert end_of(await h.run()).status == event_pb2.TURN_STATUS_INTERRUPTED
    h2 = await make_engine(
        scripts={"main": [ScriptStep(text="a b c", delay_ms=20)]},
        middlewares=[Configure(TurnConfig(stream_stall_timeout_seconds=0.0))],
        stream_stall_timeout_seconds=0.005,
        db="second.db",
    )
    assert end_of(await h2.run()).status == event_pb2.TURN_STATUS_COMPLETED


def _fix_json(call: ToolCall, error: str) -> ToolCall | None:
    """A repair hook that strips a markdown fence around JSON."""
    raw = call.raw_input.strip().removeprefix("```json").removesuffix("```").strip()
    return ToolCall(call.tool_call_id, call.tool_name, {"q": raw.split('"')[3]}, raw_input=raw)


FENCED = '```json {"q": "fenced"} ```'


async def test_repair_tool_call_fixes_invalid_input_and_the_tool_runs(make_engine: EngineFactory) -> None:
    seen: list[str] = []

    async def repair(call: ToolCall, error: str) -> ToolCall | None:
        seen.append(error)
        return _fix_json(call, error)

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="echo", raw_input=FENCED)]),
                ScriptStep(text="ok"),
            ]
        },
        tools=[make_tool("echo", echo)],
        middlewares=[Configure(TurnConfig(repair_tool_call=repair))],
    )
    events = await h.run()
    assert "tool_input_error" not in kinds(events)
    assert "tool_output_available" in kinds(events)
    assert seen and seen[0].startswith("The tool input is not valid JSON")
    call = tool_parts(end_of(events).message)[0]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert call.input["q"] == "fenced"


async def test_a_repair_that_gives_only_the_input_text_is_parsed(make_engine: EngineFactory) -> None:
    """Before: a repaired call whose input existed only as raw JSON text ran with input ``{}``."""
    got: list[dict[str, Any]] = []

    async def record(input: dict[str, Any], execution: ToolExecution) -> str:
        got.append(input)
        return "ok"

    def unfence(call: ToolCall, error: str) -> ToolCall:
        raw = call.raw_input.strip().removeprefix("```json").removesuffix("```").strip()
        return ToolCall(call.tool_call_id, call.tool_name, None, raw_input=raw)

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="record", raw_input=FENCED)]),
                ScriptStep(text="ok"),
            ]
        },
        tools=[make_tool("record", record)],
        middlewares=[Configure(TurnConfig(repair_tool_call=unfence))],
    )
    events = await h.run()
    assert got == [{"q": "fenced"}]
    assert tool_parts(end_of(events).message)[0].input_json == '{"q": "fenced"}'


async def test_repair_tool_call_returning_none_keeps_the_input_error(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="echo", raw_input=FENCED)]),
                ScriptStep(text="ok"),
            ]
        },
        tools=[make_tool("echo", echo)],
        middlewares=[Configure(TurnConfig(repair_tool_call=lambda call, error: None))],
    )
    events = await h.run()
    assert "tool_input_error" in kinds(events)
    assert tool_parts(end_of(events).message)[0].state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR


async def test_a_call_cut_off_by_the_output_limit_is_never_repaired(make_engine: EngineFactory) -> None:
    calls: list[str] = []

    def repair(call: ToolCall, error: str) -> ToolCall | None:
        calls.append(call.tool_call_id)
        return _fix_json(call, error)

    ran: list[Any] = []

    async def record(input: dict[str, Any], execution: ToolExecution) -> str:
        ran.append(input)
        return "ran"

    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(
                    tool_calls=[ScriptedToolCall(name="echo", raw_input='{"q": "trunc')],
                    finish_reason="length",
                ),
                ScriptStep(text="ok"),
            ]
        },
        tools=[make_tool("echo", record)],
        middlewares=[Configure(TurnConfig(repair_tool_call=repair))],
    )
    events = await h.run()
    assert calls == [] and ran == []
    assert "tool_input_error" in kinds(events)


async def test_hook_timeline_is_in_turn_end_metadata_when_enabled(make_engine: EngineFactory) -> None:
    class Slow(Middleware):
        async def before_turn(self, ctx: TurnContext) -> None:
            await asyncio.sleep(0.01)

    h = await make_engine(middlewares=[Slow()], hook_timeline=True)
    end = end_of(await h.run())
    timeline = value(end.metadata)["hook_timeline"]
    assert [(e["middleware"], e["hook"]) for e in timeline] == [("Slow", "before_turn")]
    assert timeline[0]["duration_ms"] >= 10
    h2 = await make_engine(middlewares=[Slow()], db="other.db")
    assert "hook_timeline" not in end_of(await h2.run()).metadata


async def test_hidden_reasoning_goes_back_to_the_model_within_the_turn_but_is_never_stored(
    make_engine: EngineFactory,
) -> None:
    # Anthropic rejects a tool-use continuation without its signed thinking, so
    # send_reasoning=False hides reasoning from the client and the store only.
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(
                    reasoning="private plan",
                    reasoning_signature="sig-1",
                    tool_calls=[ScriptedToolCall(name="echo", input={"q": 1})],
                ),
                ScriptStep(text="done"),
            ]
        },
        tools=[make_tool("echo", echo)],
        middlewares=[Configure(TurnConfig(send_reasoning=False))],
        checkpoint_interval_ms=10,
    )
    events = await h.run()
    assert not [k for k in kinds(events) if k.startswith("reasoning")]
    second_request = h.provider.requests[1]
    sent = second_request.messages[-1]
    reasoning = [p.reasoning for p in sent.parts if p.WhichOneof("kind") == "reasoning"]
    assert [(r.text, r.signature) for r in reasoning] == [("private plan", b"sig-1")]
    stored = (await h.store.load_messages(CONV))[-1]
    assert "reasoning" not in [p.WhichOneof("kind") for p in stored.parts]
    assert stored == end_of(events).message
