"""Deleting a conversation in process: its turns are stopped first and write nothing back, and
the retention sweep deletes idle conversations, expires events and runs the expiry hooks.
docs/semantics.md §12 (deleting, retention)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import sqlite3

import pytest
from google.rpc import error_details_pb2
from support.engine_harness import CONV, EngineFactory, Harness, collect, detail, end_of
from support.waiting import wait_until

from turnwire.testing import ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.deletion import delete_conversation
from turnwire_server.engine.maintenance import Maintenance, SweepHook
from turnwire_server.store.core.rows import to_us
from turnwire_server.store.sqlite import SqliteStore

SLOW = {"main": [ScriptStep(text="word ", delay_ms=5, until_cancelled=True)]}
"""A reply that streams until its turn is stopped: it is always cut mid-stream."""


def _stored_rows(store: SqliteStore, conversation_id: str) -> int:
    """Rows any table holds for the conversation, read from the file directly."""
    with sqlite3.connect(store.path) as conn:
        return sum(
            conn.execute(f"SELECT COUNT(*) FROM {table} WHERE {column} = ?", (conversation_id,)).fetchone()[0]
            for table, column in (
                ("conversations", "id"),
                ("messages", "conversation_id"),
                ("parts", "conversation_id"),
                ("turns", "conversation_id"),
                ("turn_streams", "conversation_id"),
                ("submissions", "conversation_id"),
            )
        )


def _streaming(handle_events: list[event_pb2.TurnEvent]) -> bool:
    return sum(e.WhichOneof("event") == "text_delta" for e in handle_events) >= 3


async def test_deleting_cancels_a_streaming_turn_and_nothing_of_it_comes_back(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(scripts=SLOW, checkpoint_interval_ms=10)
    handle = await h.start("tell me a long story")
    events: list[event_pb2.TurnEvent] = []

    async def read() -> None:
        async for response in handle:
            events.append(response.event)

    reader = asyncio.create_task(read())
    await wait_until(lambda: _streaming(events), what="the reply streams")
    await wait_until(lambda: _stored_rows(h.store, CONV) > 0, what="a checkpoint is stored")

    assert await delete_conversation(h.engine, CONV) is True

    # The turn had ended (its final write done) before the delete returned.
    assert handle.task.done()
    await reader
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert detail(end.error, error_details_pb2.ErrorInfo).reason == "CONVERSATION_DELETED"
    assert _stored_rows(h.store, CONV) == 0
    assert await h.store.get_conversation(CONV) is None
    assert h.engine.active_turns(CONV) == 0


async def test_a_turn_whose_rows_vanish_mid_stream_writes_nothing_back(make_engine: EngineFactory) -> None:
    """The store's guard: even when a conversation's rows go while its turn still runs (no
    cancel), the turn's checkpoints and final write are no-ops; the turn ends ABORTED."""
    h = await make_engine(scripts=SLOW, checkpoint_interval_ms=10)
    handle = await h.start("tell me a long story")
    events: list[event_pb2.TurnEvent] = []

    async def read() -> None:
        async for response in handle:
            events.append(response.event)

    reader = asyncio.create_task(read())
    await wait_until(lambda: _streaming(events), what="the reply streams")
    assert await h.store.delete_conversation(CONV) is True
    streamed = len(events)
    await wait_until(lambda: len(events) > streamed + 5, what="the turn streams on after the delete")
    handle.cancel()
    await reader
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    assert detail(end.error, error_details_pb2.ErrorInfo).reason == "CONVERSATION_DELETED"
    assert _stored_rows(h.store, CONV) == 0


async def test_a_queued_turn_is_stopped_before_it_stores_its_input(make_engine: EngineFactory) -> None:
    h = await make_engine(scripts=SLOW)
    first = await h.start("first")
    queued = await h.start("second")
    first_events: list[event_pb2.TurnEvent] = []

    async def read() -> None:
        async for response in first:
            first_events.append(response.event)

    reader = asyncio.create_task(read())
    await wait_until(lambda: _streaming(first_events), what="the first turn streams")
    await delete_conversation(h.engine, CONV)
    await reader
    queued_end = end_of(await collect(queued))
    assert queued_end.status == event_pb2.TURN_STATUS_ABORTED
    assert detail(queued_end.error, error_details_pb2.ErrorInfo).reason == "INPUT_NOT_STORED"
    assert _stored_rows(h.store, CONV) == 0


async def test_a_new_turn_after_the_delete_starts_a_fresh_conversation(make_engine: EngineFactory) -> None:
    h = await make_engine()
    await h.run("one")
    await h.run("two")
    await delete_conversation(h.engine, CONV)
    assert end_of(await h.run("again")).status == event_pb2.TURN_STATUS_COMPLETED
    record = await h.store.get_conversation(CONV)
    assert record is not None and record.message_count == 2
    # The model saw only the new question: nothing of the deleted history.
    assert [m.role for m in h.provider.requests[-1].messages] == [message_pb2.ROLE_USER]


# --------------------------------------------------------------------------- the maintenance sweep


def _age(store: SqliteStore, conversation_id: str, when: dt.datetime) -> None:
    with sqlite3.connect(store.path) as conn:
        conn.execute(
            "UPDATE conversations SET update_time = ? WHERE id = ?", (to_us(when, "t"), conversation_id)
        )


async def test_sweep_deletes_idle_conversations_and_keeps_recent_and_busy_ones(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    h = await make_engine(scripts={"main": [ScriptStep(text="hi")], "endless": SLOW["main"]})
    now = dt.datetime.now(dt.UTC)
    await h.run("hello", conversation_id="idle")
    await h.run("hello", conversation_id="recent")
    _age(h.store, "idle", now - dt.timedelta(hours=2))
    busy = await h.start("long", conversation_id="busy", model="scripted:endless")
    await wait_until(lambda: h.store.get_conversation("busy"), what="the busy turn stored its input")
    _age(h.store, "busy", now - dt.timedelta(hours=2))

    maintenance = Maintenance(
        h.engine, interval_seconds=60, conversation_retention_seconds=3600, event_retention_seconds=0
    )
    with caplog.at_level(logging.INFO, logger="turnwire.maintenance"):
        removed = await maintenance.sweep(now)

    assert removed == {"conversations": 1}
    assert "removed 1 conversations" in caplog.text
    assert await h.store.get_conversation("idle") is None
    assert await h.store.get_conversation("recent") is not None
    assert await h.store.get_conversation("busy") is not None  # its turn runs: never swept
    busy.cancel()
    await collect(busy)


async def test_sweep_expires_events_and_runs_hooks_even_when_one_fails(
    make_engine: EngineFactory, caplog: pytest.LogCaptureFixture
) -> None:
    h = await make_engine()
    now = dt.datetime.now(dt.UTC)
    with sqlite3.connect(h.store.path) as conn:
        conn.execute(
            "INSERT INTO turn_streams (request_id, conversation_id, create_time, end_time)"
            " VALUES ('r-old', 'c1', 0, ?)",
            (to_us(now - dt.timedelta(hours=2), "t"),),
        )
        conn.execute(
            "INSERT INTO turn_events (request_id, first_sequence_number, last_sequence_number, data)"
            " VALUES ('r-old', 1, 1, x'00')"
        )
    seen: list[dt.datetime] = []

    async def expire_pending(at: dt.datetime) -> int:
        seen.append(at)
        return 3

    async def broken(at: dt.datetime) -> int:
        raise RuntimeError("boom")

    maintenance = Maintenance(
        h.engine,
        interval_seconds=60,
        conversation_retention_seconds=0,
        event_retention_seconds=3600,
        hooks={"broken": broken},
    )
    maintenance.add_hook("pending_tool_calls", expire_pending)
    with pytest.raises(ValueError, match="already registered"):
        maintenance.add_hook("pending_tool_calls", expire_pending)
    with caplog.at_level(logging.INFO, logger="turnwire.maintenance"):
        removed = await maintenance.sweep(now)

    assert removed == {"event_streams": 1, "pending_tool_calls": 3}
    assert seen == [now]
    assert "broken failed" in caplog.text
    with sqlite3.connect(h.store.path) as conn:
        assert conn.execute("SELECT events_expired FROM turn_streams").fetchall() == [(1,)]
        assert conn.execute("SELECT COUNT(*) FROM turn_events").fetchone() == (0,)


def _sweeping_loop(h: Harness, hooks: dict[str, SweepHook]) -> Maintenance:
    """A maintenance loop that sweeps every 10 ms with ``hooks`` alone."""
    return Maintenance(
        h.engine,
        interval_seconds=0.01,
        conversation_retention_seconds=0,
        event_retention_seconds=0,
        hooks=hooks,
    )


async def test_the_loop_sweeps_until_stopped(make_engine: EngineFactory) -> None:
    h = await make_engine()
    sweeps: list[dt.datetime] = []

    async def count(at: dt.datetime) -> int:
        sweeps.append(at)
        return 0

    maintenance = _sweeping_loop(h, {"count": count})
    maintenance.start()
    await wait_until(lambda: len(sweeps) >= 3, what="three sweeps")
    await maintenance.stop()
    await maintenance.stop()  # idempotent
    assert maintenance._task is None


async def test_the_loop_stops_when_a_sweep_swallowed_its_cancel(make_engine: EngineFactory) -> None:
    # A worker's maintenance loop went on after its stop (CI: the worker outlived its supervisor):
    # a store call's wait (psycopg_pool's, Python 3.11's asyncio.wait_for) returned its result when
    # the cancel landed as it ended, and stop waited for the loop for good.
    h = await make_engine()
    in_sweep = asyncio.Event()
    swallowed: list[bool] = []

    async def store_call(at: dt.datetime) -> int:
        in_sweep.set()
        try:
            await asyncio.Event().wait()  # a store call that answers only when cancelled
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed.append(True)  # as wait_for did: the awaited result, the cancel gone
        return 0

    maintenance = _sweeping_loop(h, {"store_call": store_call})
    maintenance.start()
    loop = maintenance._task
    assert loop is not None
    await asyncio.wait_for(in_sweep.wait(), 10)
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10) as limit:  # a stop that waits for good is cut short here
            await maintenance.stop()
    assert not limit.expired(), "the stop waited for a loop that went on"
    assert swallowed == [True]
    assert loop.done()
