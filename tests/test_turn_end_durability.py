"""The TurnEnd is durable before it is sent, and a turn's whole stream is stored however short
(docs/semantics.md §2 finish, §8 resumable streams; issue 32 item 10).

Each test watches the store's writes that hold a TurnEnd and the moment the caller receives
it: the write always comes first, and what ResumeTurn reads back is what the caller got. A
completed turn stores its last events and its TurnEnd in the transaction that records its end
(``Store.finish_turn``), so its end costs one store write, not two; a TurnEnd that hooks shape
after that write (``on_chat_error``, the hook timeline) is stored in a write of its own, still
before it is sent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2
from support.engine_harness import CONV, EngineFactory, Harness, collect, detail, end_of, kinds
from support.waiting import wait_until

from turnwire.hooks import ChatError, ChatErrorContext, ChatResponseContext, Middleware
from turnwire.testing import ScriptedError, ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.errors import TurnNotHere
from turnwire_server.engine.resume import replay
from turnwire_server.engine.stream_log import RECOVERY_SEQUENCE_GAP, Subscription
from turnwire_server.store.records import TurnRecord


@dataclasses.dataclass
class Watch:
    """The store's writes at a turn's end, and whether the caller had its TurnEnd before each."""

    writes: list[tuple[str, bool]] = dataclasses.field(default_factory=list)
    """``(method, holds the TurnEnd)`` of each finish_turn / roll_back_turn / append_events."""
    end_stored_after_sent: bool = False
    received: set[str] = dataclasses.field(default_factory=set)
    """The request ids whose TurnEnd the caller has."""


def watch(h: Harness) -> Watch:
    """Wrap the store's end-of-turn writes of ``h`` to fill a :class:`Watch`."""
    seen = Watch()

    def wrap(name: str, request_id: Callable[[tuple[Any, ...]], str], end_flag: str) -> None:
        original = getattr(h.store, name)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            ends = bool(kwargs.get(end_flag))
            seen.writes.append((name, ends))
            if ends and request_id(args) in seen.received:
                seen.end_stored_after_sent = True
            return await original(*args, **kwargs)

        setattr(h.store, name, wrapper)

    wrap("finish_turn", lambda args: args[0].request_id, "stream_ended")
    wrap("roll_back_turn", lambda args: args[0].request_id, "stream_ended")
    wrap("append_events", lambda args: args[1], "ended")
    return seen


async def read(handle: Any, seen: Watch, events: list[event_pb2.TurnEvent]) -> None:
    """Read ``handle``'s events into ``events``, noting in ``seen`` when its TurnEnd arrives."""
    async for response in handle:
        events.append(response.event)
        if response.event.HasField("turn_end"):
            seen.received.add(response.event.request_id)
    await handle.task


async def run_watched(
    h: Harness, seen: Watch, text: str | None = "hi", **kwargs: Any
) -> list[event_pb2.TurnEvent]:
    events: list[event_pb2.TurnEvent] = []
    await read(await h.start(text, **kwargs), seen, events)
    return events


async def stored_stream(h: Harness, request_id: str) -> list[event_pb2.TurnEvent]:
    stream = await h.store.get_stream(request_id)
    assert stream is not None and stream.end_time is not None, "the stream is stored and ended"
    return [event_pb2.TurnEvent.FromString(data) for data in await h.store.load_events(request_id, 0)]


async def test_a_short_turn_stores_its_whole_stream_with_its_end_in_one_write(
    make_engine: EngineFactory,
) -> None:
    at_response: list[list[event_pb2.TurnEvent]] = []
    harness: list[Harness] = []

    class ReadsTheStream(Middleware):
        async def on_chat_response(self, ctx: ChatResponseContext) -> None:
            # Before the TurnEnd is sent, the store already holds the whole stream, TurnEnd included.
            at_response.append(await stored_stream(harness[0], ctx.request_id))

    h = await make_engine(scripts={"main": [ScriptStep(text="short")]}, middlewares=[ReadsTheStream()])
    harness.append(h)
    seen = watch(h)
    events = await run_watched(h, seen, request_id="r-short")

    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert at_response == [events]
    assert await stored_stream(h, "r-short") == events
    # Its end is one store write: the last events and the TurnEnd travel with the turn's end state.
    assert seen.writes == [("finish_turn", True)]
    assert not seen.end_stored_after_sent


async def test_a_long_turn_stores_what_its_batches_left_with_its_end(make_engine: EngineFactory) -> None:
    words = [f"w{i} " for i in range(30)]
    h = await make_engine(
        scripts={"main": [ScriptStep(text="".join(words), delay_ms=5)]}, checkpoint_interval_ms=20
    )
    seen = watch(h)
    events = await run_watched(h, seen, request_id="r-long")

    assert await stored_stream(h, "r-long") == events
    batches = [name for name, _ in seen.writes if name == "append_events"]
    assert batches, "a turn longer than the interval stores batches while it runs"
    assert seen.writes[-1] == ("finish_turn", True)
    assert not seen.end_stored_after_sent


async def test_a_turn_end_on_chat_error_shapes_is_stored_before_it_is_sent(
    make_engine: EngineFactory,
) -> None:
    class Surface(Middleware):
        async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
            return ChatError("the model is resting", code="UNAVAILABLE", reason="PROVIDER_ERROR")

    h = await make_engine(
        scripts={"main": [ScriptStep(error=ScriptedError(message="down", status=503))]},
        middlewares=[Surface()],
    )
    seen = watch(h)
    events = await run_watched(h, seen, request_id="r-error")

    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert end.error.message == "the model is resting"
    assert await stored_stream(h, "r-error") == events
    # The end state first, then (after on_chat_error) the TurnEnd, before it is sent.
    assert seen.writes == [("finish_turn", False), ("append_events", True)]
    assert not seen.end_stored_after_sent


async def test_a_turn_end_with_a_hook_timeline_is_stored_before_it_is_sent(
    make_engine: EngineFactory,
) -> None:
    class Observer(Middleware):
        async def on_chat_response(self, ctx: ChatResponseContext) -> None:
            return None

    h = await make_engine(
        scripts={"main": [ScriptStep(text="x")]}, middlewares=[Observer()], hook_timeline=True
    )
    seen = watch(h)
    events = await run_watched(h, seen, request_id="r-timeline")

    timeline = json_format.MessageToDict(end_of(events).metadata)["hook_timeline"]
    hooks = [entry["hook"] for entry in timeline]
    assert "on_chat_response" in hooks  # the timeline covers the hooks after the end state
    assert await stored_stream(h, "r-timeline") == events
    assert not seen.end_stored_after_sent


async def test_a_recovered_turn_left_interrupted_stores_its_turn_end_with_its_state(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="x")]}, recovery_budget=0)
    record = await started_turn(h, "r-crashed")
    seen = watch(h)
    assert await h.engine.recover() == 1

    assert seen.writes == [("finish_turn", True)]
    events = await stored_stream(h, "r-crashed")
    assert events[0].HasField("turn_start")
    end = events[-1]
    assert end.sequence_number == 1 + RECOVERY_SEQUENCE_GAP
    assert end.turn_end.status == event_pb2.TURN_STATUS_INTERRUPTED
    assert (await h.store.get_turn(record.request_id)).state == "interrupted"  # type: ignore[union-attr]


async def started_turn(
    h: Harness, request_id: str, *, conversation_id: str = CONV, text: str | None = "hello"
) -> TurnRecord:
    """A turn another process started and never ended: its input (none without ``text``), its
    record, its TurnStart."""
    messages = []
    if text is not None:
        user = message_pb2.Message(id=f"u-{request_id}", role=message_pb2.ROLE_USER)
        user.parts.add().text.text = text
        messages.append(user)
    record = TurnRecord(
        request_id=request_id,
        conversation_id=conversation_id,
        assistant_message_id=f"tw-a-{request_id}",
        continuation=False,
        model="scripted:main",
        state="running",
        start_time=dt.datetime.now(dt.UTC),
        spec="{}",
        owner="another-process",
    )
    await h.store.start_turn(record, messages)
    start = event_pb2.TurnEvent(conversation_id=conversation_id, request_id=request_id, sequence_number=1)
    start.turn_start.message_id = record.assistant_message_id
    await h.store.append_events(conversation_id, request_id, [(1, start.SerializeToString())], ended=False)
    return record


async def _replayed(h: Harness, request_id: str) -> list[event_pb2.TurnEvent]:
    """Every event :func:`replay` gives of ``request_id`` from the start, the turn not running
    here (its stored stream, or a TurnEnd from its record), each wait on the store 50 ms."""
    return [
        event
        async for batch in replay(
            request_id, 0, store=h.store, subscribe=lambda _: None, retention_seconds=0, follow_seconds=0.05
        )
        for event in batch
    ]


async def test_an_ended_turn_whose_stream_lacks_its_turn_end_resumes_with_one_from_its_record(
    make_engine: EngineFactory,
) -> None:
    """A stream stored by an older version, or a crash between the end state and the TurnEnd
    hooks shaped: once nothing more arrives, the reader gets the recorded end, not UNAVAILABLE."""
    h = await make_engine(scripts={"main": [ScriptStep(text="x")]})
    record = await started_turn(h, "r-old")
    reply = message_pb2.Message(id=record.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().text.text = "the answer"
    ended = dataclasses.replace(record, state="completed", end_time=dt.datetime.now(dt.UTC))
    await h.store.finish_turn(ended, reply)

    events = await _replayed(h, "r-old")
    assert kinds(events) == ["turn_start", "turn_end"]
    end = events[-1]
    assert end.sequence_number == 2
    assert end.turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert end.turn_end.message.parts[0].text.text == "the answer"
    assert end.turn_end.metadata["from_turn_record"] is True

    # A replica following another (PostgreSQL): it gets the same once a wait brought nothing.
    async def follows(request_id: str, after: int, timeout_seconds: float) -> bool:
        return True

    h.store.wait_for_events = follows  # type: ignore[method-assign]
    followed = await _replayed(h, "r-old")
    assert followed == events
    del h.store.wait_for_events

    # A turn still running (its recovery pending) is still UNAVAILABLE, as before.
    await started_turn(h, "r-running")
    with pytest.raises(TurnNotHere):
        async for _ in replay(
            "r-running", 0, store=h.store, subscribe=lambda _: None, retention_seconds=0, follow_seconds=0.05
        ):
            pass


async def test_a_turn_that_started_and_ended_between_the_readers_looks_is_replayed(
    make_engine: EngineFactory,
) -> None:
    """The reader found no stream, then the turn recorded ended: it ran between the two reads
    (another replica's turn, a submission's). It is replayed from its stored stream, not NOT_FOUND
    as a turn that never started."""
    h = await make_engine(scripts={"main": [ScriptStep(text="the answer")]})
    events = await collect(await h.start("question", request_id="r-between"))
    assert kinds(events)[-1] == "turn_end"
    await wait_until(
        lambda: h.engine.handle("r-between") is None, timeout=10, what="the turn left the engine"
    )
    get_stream = h.store.get_stream
    looks: list[str] = []

    async def missed_once(request_id: str) -> Any:
        looks.append(request_id)
        return None if len(looks) == 1 else await get_stream(request_id)

    h.store.get_stream = missed_once  # type: ignore[method-assign]
    replayed = await _replayed(h, "r-between")
    assert kinds(replayed) == kinds(events)
    assert len(looks) == 2


async def test_a_turn_that_started_here_between_the_readers_looks_is_followed_live(
    make_engine: EngineFactory,
) -> None:
    """The reader found the turn not running here, then its turn row running without a stream:
    it started here between the two looks (CI: a scheduled fire's WatchSubmission, SERVER_RESTARTED
    on one process). It is followed live to its end, not UNAVAILABLE as a crash's turn."""
    # Deltas 200 ms apart and no checkpoint write before the end: the turn runs, unstored, a while.
    h = await make_engine(
        scripts={"main": [ScriptStep(text="one two three", delay_ms=200)]}, checkpoint_interval_ms=60_000
    )
    handle = await h.start("question", request_id="r-here")
    turn = await wait_until(lambda: h.store.get_turn("r-here"), what="the turn's row stored")
    assert turn is not None and turn.state == "running"
    assert await h.store.get_stream("r-here") is None
    looks: list[str] = []

    def late(request_id: str) -> Subscription | None:
        looks.append(request_id)
        return None if len(looks) == 1 else h.engine.subscribe(request_id)

    replayed = [
        event
        async for batch in replay(
            "r-here", 0, store=h.store, subscribe=late, retention_seconds=0, follow_seconds=0.05
        )
        for event in batch
    ]
    assert kinds(replayed)[0] == "turn_start"
    assert kinds(replayed)[-1] == "turn_end"
    assert len(looks) == 2
    assert kinds(replayed) == kinds(await collect(handle))


async def test_a_rolled_back_turn_stores_its_turn_end_with_the_rollback(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={
            "main": [ScriptStep(text="word ", delay_ms=20, until_cancelled=True)],
            "next": [ScriptStep(text="fresh")],
        }
    )
    seen = watch(h)
    first = await h.start("long one", request_id="r-rolled")
    events: list[event_pb2.TurnEvent] = []
    reader = asyncio.create_task(read(first, seen, events))
    await wait_until(lambda: any(e.HasField("text_delta") for e in events))
    rollback = dataclasses.replace(
        h.request("instead", request_id="r-new", model="scripted:next"), concurrent_input="rollback"
    )
    await collect(await h.engine.start(rollback))
    await reader

    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert detail(end.error, error_details_pb2.ErrorInfo).reason == "ROLLED_BACK"
    assert ("roll_back_turn", True) in seen.writes
    assert not seen.end_stored_after_sent
    assert await stored_stream(h, "r-rolled") == events
