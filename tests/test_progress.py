"""The parts of the Progress keepalives that need no server (api/progress.py): the phase a
stream reports, and the keepalive of a re-attached stream (ResumeTurn, WatchSubmission) with its
source's end, errors and cancellation. The live streams are tested through real servers in
tests/e2e/test_progress_e2e.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from turnwire_client.v1 import event_pb2
from turnwire_server.api.progress import Silence, keepalive

QUEUED = event_pb2.PROGRESS_PHASE_QUEUED
MODEL = event_pb2.PROGRESS_PHASE_MODEL
TOOL = event_pb2.PROGRESS_PHASE_TOOL


def event(kind: str, number: int = 1, **fields: object) -> event_pb2.TurnEvent:
    made = event_pb2.TurnEvent(conversation_id="c", request_id="r", sequence_number=number)
    getattr(made, kind).SetInParent()
    for name, value in fields.items():
        setattr(getattr(made, kind), name, value)
    return made


def same(item: event_pb2.TurnEvent) -> event_pb2.TurnEvent:
    return item


def alone(item: event_pb2.TurnEvent) -> list[event_pb2.TurnEvent]:
    return [item]


def test_the_phase_follows_the_stream() -> None:
    silence = Silence("", "r")
    assert silence.progress(1.5).progress.phase == QUEUED
    silence.saw(event("turn_start"))
    assert silence.conversation_id == "c"
    assert silence.progress(1).progress.phase == MODEL
    silence.saw(event("tool_input_available", tool_call_id="a"))
    silence.saw(event("tool_input_available", tool_call_id="b"))
    silence.saw(event("tool_output_available", tool_call_id="a", preliminary=True))
    silence.saw(event("tool_output_available", tool_call_id="a"))
    assert silence.progress(1).progress.phase == TOOL  # b still runs
    silence.saw(event("tool_output_error", tool_call_id="b"))
    assert silence.progress(1).progress.phase == MODEL
    silence.saw(event("tool_input_available", tool_call_id="client-side"))
    silence.saw(event("step_finish"))  # a client tool's call gets no result in its turn
    progress = silence.progress(2.25)
    assert progress.progress.phase == MODEL
    assert progress.progress.elapsed.ToMilliseconds() == 2250
    assert (progress.sequence_number, progress.conversation_id, progress.request_id) == (0, "c", "r")
    assert not silence.ended
    silence.saw(event("turn_end"))
    assert silence.ended
    assert Silence("c", "r", started=True).progress(1).progress.phase == MODEL


async def test_a_stalled_replay_gets_progress_and_its_events_in_order() -> None:
    release = asyncio.Event()

    async def source() -> AsyncIterator[event_pb2.TurnEvent]:
        yield event("turn_start", 1)
        await release.wait()
        yield event("turn_end", 2)
        await asyncio.Event().wait()  # never: the stream ended with its TurnEnd

    seen: list[event_pb2.TurnEvent] = []
    stream = keepalive(source(), 0.01, Silence("c", "r"), alone, same)
    async for item in stream:
        seen.append(item)
        if len([e for e in seen if e.HasField("progress")]) == 3:
            release.set()
        if item.HasField("turn_end"):
            break
    await stream.aclose()
    kinds = [e.WhichOneof("event") for e in seen]
    assert kinds == ["turn_start", "progress", "progress", "progress", "turn_end"]
    assert {e.progress.phase for e in seen if e.HasField("progress")} == {MODEL}


async def test_no_progress_after_the_turn_end_and_the_source_ends_the_stream() -> None:
    async def source() -> AsyncIterator[event_pb2.TurnEvent]:
        yield event("turn_end", 1)
        await asyncio.sleep(0.05)  # a slow close after the TurnEnd: no Progress in it

    items = [item async for item in keepalive(source(), 0.01, Silence("c", "r"), alone, same)]
    assert [e.WhichOneof("event") for e in items] == ["turn_end"]


async def test_the_source_error_propagates_and_leaving_cancels_the_wait() -> None:
    class Gone(Exception):
        pass

    async def failing() -> AsyncIterator[event_pb2.TurnEvent]:
        yield event("turn_start", 1)
        raise Gone

    with pytest.raises(Gone):
        async for _ in keepalive(failing(), 10, Silence("c", "r"), alone, same):
            pass

    finished = asyncio.Event()

    async def endless() -> AsyncIterator[event_pb2.TurnEvent]:
        try:
            yield event("turn_start", 1)
            await asyncio.Event().wait()
        finally:
            finished.set()

    stream = keepalive(endless(), 0.01, Silence("c", "r"), alone, same)
    assert (await anext(stream)).HasField("turn_start")
    assert (await anext(stream)).HasField("progress")  # waiting for the next event meanwhile
    await stream.aclose()
    assert finished.is_set()  # the source's wait was cancelled and its cleanup ran
