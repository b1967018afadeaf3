"""A turn's event stream kept for ResumeTurn (docs/semantics.md §8), once for both drivers: the
``Store.append_events`` core program (:mod:`turnwire_server.store.core.sql`); the rows' encoding
is :mod:`turnwire_server.store.core.stream_rows`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from turnwire_server.store.core.fencing import holds_lease, lease_read
from turnwire_server.store.core.sql import Dialect, Program, Statement
from turnwire_server.store.core.stream_rows import pack_events
from turnwire_server.store.records import TurnLease

__all__ = ["EventBatch", "append_events", "prepare_events", "stream_read", "stream_writes"]

_PUT_EVENTS: Final = (
    # A batch retried after a failed commit starts at the same number: replace it.
    "INSERT INTO turn_events (request_id, first_sequence_number, last_sequence_number, data)"
    " VALUES (?, ?, ?, ?) ON CONFLICT (request_id, first_sequence_number) DO UPDATE"
    " SET last_sequence_number = excluded.last_sequence_number, data = excluded.data"
)


@dataclass(frozen=True, slots=True)
class EventBatch:
    """``append_events``' arguments, checked and packed in the caller's task."""

    first: int
    """The batch's first sequence number (0 when it has no events)."""
    last: int
    """Its last sequence number (0 when it has no events)."""
    data: bytes | None
    """The packed events (None when there are none)."""
    ended: bool


def prepare_events(events: Sequence[tuple[int, bytes]], *, ended: bool) -> EventBatch:
    """Check and pack a batch. Raises :class:`ValueError` for an empty batch without ``ended``,
    or sequence numbers that do not ascend from >= 1."""
    if not events and not ended:
        raise ValueError("append_events needs events, or ended=True")
    numbers = [number for number, _ in events]
    if numbers != sorted(set(numbers)) or (numbers and numbers[0] < 1):
        raise ValueError(f"event sequence numbers must ascend from >= 1, got {numbers[:5]}…")
    if not numbers:
        return EventBatch(0, 0, None, ended)
    return EventBatch(numbers[0], numbers[-1], pack_events(events), ended)


def stream_read(request_id: str, dialect: Dialect) -> Statement:
    """The read :func:`stream_writes` decides on (after the conversation's lock): the stream's
    end time and last sequence number, its row locked."""
    return Statement(
        "SELECT end_time, last_sequence_number FROM turn_streams WHERE request_id = ?" + dialect.lock_rows,
        (request_id,),
        fetch=True,
    )


def stream_writes(
    conversation_id: str,
    request_id: str,
    batch: EventBatch,
    stream: list[Any],
    *,
    dialect: Dialect,
    now_us: int,
) -> list[Statement]:
    """Create or extend the stream row, insert the batch, wake the readers following the turn
    elsewhere (the dialect's ``events_stored``). ``stream`` is :func:`stream_read`'s rows. A
    first batch starting at 1 for a stream that already ended replaces that stream (the
    request id was retried after a failed turn). The caller has checked that the turn is
    recorded (a deleted conversation's turn keeps nothing)."""
    writes: list[Statement] = []
    if stream and stream[0][0] is not None and batch.first == 1:
        writes.append(Statement("DELETE FROM turn_streams WHERE request_id = ?", (request_id,)))
        stream = []
    if not stream:
        writes.append(
            Statement(
                "INSERT INTO turn_streams"
                " (request_id, conversation_id, last_sequence_number, create_time, end_time)"
                " VALUES (?, ?, ?, ?, ?)",
                (request_id, conversation_id, batch.last, now_us, now_us if batch.ended else None),
            )
        )
    else:
        end_time, stored_last = stream[0]
        writes.append(
            Statement(
                "UPDATE turn_streams SET last_sequence_number = ?, end_time = ? WHERE request_id = ?",
                (max(stored_last, batch.last), now_us if batch.ended else end_time, request_id),
            )
        )
    if batch.data is not None:
        writes.append(Statement(_PUT_EVENTS, (request_id, batch.first, batch.last, batch.data)))
    return [*writes, *dialect.events_stored(request_id)]


def append_events(
    conversation_id: str,
    request_id: str,
    batch: EventBatch,
    dialect: Dialect,
    now_us: int,
    *,
    lease: TurnLease | None,
) -> Program[bool]:
    """``Store.append_events``: :func:`stream_writes` under the conversation's lock; True when
    written. Nothing is written (False) when no turn ``request_id`` is recorded (its
    conversation was deleted while it ran); raises :class:`LeaseLost` (writing nothing) when
    ``lease`` (None: not fenced) is no longer the turn's."""
    found = yield [
        *dialect.lock_conversation(conversation_id),
        lease_read(request_id, dialect),
        stream_read(request_id, dialect),
    ]
    recorded, stream = found[-2], found[-1]
    if not holds_lease(recorded, lease):
        return False  # its conversation was deleted (or it never stored input): nothing to keep
    yield stream_writes(conversation_id, request_id, batch, stream, dialect=dialect, now_us=now_us)
    return True
