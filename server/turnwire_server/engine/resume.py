"""Re-attaching to a turn's stream: what the reader missed, then the live events, exactly once.

docs/semantics.md §8 (resumable streams). A reader gives the last sequence number it saw and
gets every later event once, in order: from the store up to where the turn's in-memory backlog
begins, then that backlog, then the live events (see
:class:`~turnwire_server.engine.stream_log.StreamLog`). A reader that falls too far behind the
live turn is dropped by the log and attaches again from where it was. A finished turn is
read from the store alone, within the event retention. Re-attaching never runs a turn.

A turn recorded ended has its TurnEnd stored with its end state, or stored before it was sent
(see :mod:`~turnwire_server.engine.stream_log`). A stream without one is then a crash between
the two writes of a TurnEnd hooks shaped (it was never sent), a TurnEnd write that failed, or a
stream stored by an older version: once nothing more arrives, the reader gets a TurnEnd made
from the turn's record (:func:`recorded_end`) rather than waiting for a recovery that will
never come.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from turnwire_client.v1 import event_pb2
from turnwire_server.engine.errors import TurnNotHere, TurnStreamNotFound
from turnwire_server.engine.stream_log import Subscription, event_bytes
from turnwire_server.store.base import ReplayStore
from turnwire_server.store.records import StreamRecord, TurnRecord


async def replay(
    request_id: str,
    after: int,
    *,
    store: ReplayStore,
    subscribe: Callable[[str], Subscription | None],
    retention_seconds: float,
    follow_seconds: float = 10.0,
    batch_events: int = 1,
    batch_bytes: int = 0,
) -> AsyncIterator[list[event_pb2.TurnEvent]]:
    """The events of turn ``request_id`` with sequence numbers above ``after``, then the live ones
    until its TurnEnd, in lists of the events ready at once (read from the store together, in the
    live turn's backlog, queued for this reader): at least one event a list, at most
    ``batch_events``, and more than one only while their serialized sizes add up to at most
    ``batch_bytes`` (event batches, docs/semantics.md §10; the defaults give one event a list).

    ``subscribe`` attaches to the turn when it runs in this process (``TurnEngine.subscribe``).
    A turn that runs on another replica is followed through the store (``wait_for_events``, up
    to ``follow_seconds`` per wait), switching to the live feed if it comes to run here (a
    recovery). A turn recorded ended whose stream has no TurnEnd ends with :func:`recorded_end`
    once a wait brought nothing more (at once with one process per store). Raises
    :class:`TurnStreamNotFound` when no stream of that id is stored or running
    (never started, deleted) or it ended more than ``retention_seconds`` ago (0: kept while
    stored), :class:`TurnNotHere` when it has not ended and nothing can follow it (one process
    per store: a crash not yet recovered), and
    :class:`~turnwire_server.store.errors.StoreError` when the store fails.
    """
    last = after
    waited_at: int | None = None  # where the last wait for another replica's events began
    limits = (batch_events, batch_bytes)
    live: Subscription | None = None
    while True:
        live = live or subscribe(request_id)
        if live is not None:
            try:
                stored = await store.load_events(request_id, last, before=live.first_unstored)
                for batch in _batches(stored, *limits):
                    last = batch[-1].sequence_number
                    yield batch
                backlog = [r.event for r in live.backlog if r.event.sequence_number > last]
                for batch in _batches(backlog, *limits):
                    last = batch[-1].sequence_number
                    yield batch
                async for ready in live.channel.batches(batch_events, batch_bytes, event_bytes):
                    events = [r.event for r in ready if r.event.sequence_number > last]
                    if events:
                        last = events[-1].sequence_number
                        yield events
            finally:
                live.close()
            if not live.overflowed:
                return
            live = None
            continue
        stream = await _stream(request_id, store, retention_seconds)
        if stream is None:
            # Started on another replica, its first events not stored yet: follow it. Or started
            # here since the look above (its turn row written between the two looks: a scheduled
            # fire's watch, seen in CI): follow it live.
            if await store.wait_for_events(request_id, last, follow_seconds):
                continue
            if (live := subscribe(request_id)) is None:
                raise TurnNotHere(request_id)
            continue
        for batch in _batches(await store.load_events(request_id, last), *limits):
            last = batch[-1].sequence_number
            yield batch
        if stream.end_time is not None:
            return
        # Not ended and not here: another replica runs it (or a crash awaits its recovery), or
        # it ended without its TurnEnd stored (see the module docstring).
        if waited_at == last and (ended := await _ended_turn(request_id, store)) is not None:
            yield [await recorded_end(ended, last, store)]  # a whole wait brought nothing more
            return
        waited_at = last
        if not await store.wait_for_events(request_id, last, follow_seconds):
            # One process per store: nothing else will write this stream, unless it has come to
            # run here since the look above (a recovery).
            if (ended := await _ended_turn(request_id, store)) is None:
                if (live := subscribe(request_id)) is None:
                    raise TurnNotHere(request_id)
                continue
            yield [await recorded_end(ended, last, store)]
            return


def _batches(
    events: Sequence[bytes | event_pb2.TurnEvent], max_events: int, max_bytes: int
) -> Iterator[list[event_pb2.TurnEvent]]:
    """``events`` (stored ones serialized, or parsed), parsed, in lists of at most ``max_events``
    and, past the first event of a list, ``max_bytes`` serialized bytes."""
    batch: list[event_pb2.TurnEvent] = []
    total = 0
    for item in events:
        if isinstance(item, bytes):
            size, event = len(item), event_pb2.TurnEvent.FromString(item)
        else:
            size, event = (item.ByteSize() if max_events > 1 else 0), item
        if batch and (len(batch) >= max_events or total + size > max_bytes):
            yield batch
            batch, total = [], 0
        batch.append(event)
        total += size
    if batch:
        yield batch


async def _ended_turn(request_id: str, store: ReplayStore) -> TurnRecord | None:
    """The turn's record when it is recorded ended, else None."""
    turn = await store.get_turn(request_id)
    return turn if turn is not None and turn.state != "running" else None


_STATUSES: dict[str, event_pb2.TurnStatus.ValueType] = {
    "completed": event_pb2.TURN_STATUS_COMPLETED,
    "error": event_pb2.TURN_STATUS_ERROR,
    "aborted": event_pb2.TURN_STATUS_ABORTED,
    "interrupted": event_pb2.TURN_STATUS_INTERRUPTED,
    "skipped": event_pb2.TURN_STATUS_SKIPPED,
}


async def recorded_end(turn: TurnRecord, last: int, store: ReplayStore) -> event_pb2.TurnEvent:
    """The TurnEnd of ``turn``, recorded ended, whose stored stream (up to sequence number
    ``last``) has none (see the module docstring): numbered ``last + 1``, with the recorded
    status and error and the stored reply; usage and step count are not recorded (zero), and
    ``metadata["from_turn_record"]`` is true. Raises
    :class:`~turnwire_server.store.errors.StoreError` when the store fails."""
    event = event_pb2.TurnEvent(
        conversation_id=turn.conversation_id, request_id=turn.request_id, sequence_number=last + 1
    )
    end = event.turn_end
    end.status = _STATUSES[turn.state]
    if turn.error is not None:
        end.error.ParseFromString(turn.error)
    for message in await store.load_messages(turn.conversation_id):
        if message.id == turn.assistant_message_id:
            end.message.CopyFrom(message)
            break
    end.metadata.update({"from_turn_record": True})
    return event


async def _stream(request_id: str, store: ReplayStore, retention_seconds: float) -> StreamRecord | None:
    """The turn's stored stream; None when it has none yet but runs (on another replica).
    Raises :class:`TurnStreamNotFound` as :func:`replay` says."""
    stream = await store.get_stream(request_id)
    if stream is None:
        turn = await store.get_turn(request_id)
        if turn is not None and turn.state == "running":
            return None
        if turn is not None:
            # Started and ended between the two reads (another replica's, a submission's): a
            # turn that ran stores its stream before or with its end, so it is there now.
            stream = await store.get_stream(request_id)
    if stream is None:
        raise TurnStreamNotFound(
            f"no turn with request_id {request_id!r} has a stream to resume: it never started "
            "(its input was not stored), its conversation was deleted, or the id is wrong",
            request_id=request_id,
        )
    expired = stream.events_expired
    if stream.end_time is not None and retention_seconds > 0:
        age = (dt.datetime.now(dt.UTC) - stream.end_time).total_seconds()
        expired = expired or age > retention_seconds
    if expired:
        ended = stream.end_time.isoformat() if stream.end_time else "long ago"
        raise TurnStreamNotFound(
            f"turn {request_id!r} ended at {ended}; its events are kept for {retention_seconds:g} s "
            "after a turn ends (durability.event_retention_seconds) and are gone; read the stored "
            f"reply with GetConversation of conversation {stream.conversation_id!r}",
            request_id=request_id,
            expired=True,
            conversation_id=stream.conversation_id,
        )
    return stream
