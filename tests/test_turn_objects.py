"""A turn's objects go when it ends, without the cycle collector (docs/architecture.md, "A turn's
objects"; issue 33: every turn left its whole object graph to the collector, whose passes then ran
on the event loop).

The collector is off while a turn runs and ends; the turn's run object must then be freed by
reference counting alone once the caller drops its handle. A link left from one of the turn's
helpers back to it (a callback, the task whose context holds it) keeps it, and this fails.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from support.engine_harness import EngineFactory, Harness, collect, echo, end_of, make_tool
from support.waiting import wait_until

from turnwire.hooks import ChatResponseContext, ChunkContext, Middleware, StepContext, StepFinishContext
from turnwire.testing import ScriptedError, ScriptedToolCall, ScriptStep
from turnwire_client.v1 import event_pb2


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def _ended_turn_is_freed(
    h: Harness,
    text: str,
    *,
    status: event_pb2.TurnStatus.ValueType = event_pb2.TURN_STATUS_COMPLETED,
    cancel: bool = False,
    **request: Any,
) -> None:
    handle = await h.start(text, **request)
    if cancel:
        handle.run.cancel()
    events = await collect(handle)
    assert end_of(events).status == status, events[-1]
    run = weakref.ref(handle.run)
    del handle
    # The engine's own hold (its table of turns) goes when the turn's task has stored its tail.
    await wait_until(lambda: run() is None, what="the ended turn freed by reference counting")


async def test_a_text_turn_is_freed_without_the_collector(
    make_engine: EngineFactory, collector_off: None
) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="Hello there.")]})
    await _ended_turn_is_freed(h, "hi")


async def test_a_turn_with_a_tool_call_is_freed_without_the_collector(
    make_engine: EngineFactory, collector_off: None
) -> None:
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="echo", input={"x": 1})]),
                ScriptStep(text="done"),
            ]
        },
        tools=[make_tool("echo", echo)],
    )
    await _ended_turn_is_freed(h, "use the tool")


class _Watching(Middleware):
    """Every hook that sees the turn's step or chunks (their contexts carry its state)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def before_step(self, ctx: StepContext) -> None:
        self.seen.append("before_step")

    async def on_chunk(self, ctx: ChunkContext) -> None:
        self.seen.append("on_chunk")

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self.seen.append("on_step_finish")

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        self.seen.append("on_chat_response")


async def test_a_turn_with_hooks_is_freed_without_the_collector(
    make_engine: EngineFactory, collector_off: None
) -> None:
    watching = _Watching()
    h = await make_engine(scripts={"main": [ScriptStep(text="Hello there.")]}, middlewares=[watching])
    await _ended_turn_is_freed(h, "hi")
    assert {"before_step", "on_chunk", "on_step_finish", "on_chat_response"} <= set(watching.seen)


async def test_a_turn_without_a_model_step_is_freed_without_the_collector(
    make_engine: EngineFactory, collector_off: None
) -> None:
    # SaveMessages' turn when the history does not ask for a reply: its checkpointer never ran.
    h = await make_engine(scripts={"main": [ScriptStep(text="unused")]}, strict=False)
    await _ended_turn_is_freed(h, "hi", status=event_pb2.TURN_STATUS_SKIPPED, skip_unless="history")


async def test_a_cancelled_turn_is_freed_without_the_collector(
    make_engine: EngineFactory, collector_off: None
) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="a b c d e f", delay_ms=50)]}, strict=False)
    await _ended_turn_is_freed(h, "hi", status=event_pb2.TURN_STATUS_ABORTED, cancel=True)


async def test_a_failed_turn_is_freed_without_the_collector(
    make_engine: EngineFactory, collector_off: None
) -> None:
    # The turn keeps its error (on_chat_error, the stored status); the error's traceback must not
    # keep the frames that hold the run.
    h = await make_engine(
        scripts={"main": [ScriptStep(error=ScriptedError(message="upstream exploded", status=500))]},
        strict=False,
    )
    await _ended_turn_is_freed(h, "hi", status=event_pb2.TURN_STATUS_ERROR)
