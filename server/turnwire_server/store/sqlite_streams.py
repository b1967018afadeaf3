"""The SQLite store's event streams: a turn's events kept for ResumeTurn (docs/semantics.md §8).

Same conventions as :mod:`turnwire_server.store.sqlite_writes`.
"""

from __future__ import annotations

import sqlite3
import struct
from collections.abc import Iterable, Sequence
from typing import Any, Final

from turnwire_server.store.base import StreamRecord
from turnwire_server.store.errors import StoreCorrupted
from turnwire_server.store.sqlite_rows import WriteFn, time_from_us

__all__ = [
    "STREAM_COLUMNS",
    "append_events_write",
    "events_from_rows",
    "pack_events",
    "stream_from_row",
    "unpack_events",
]


STREAM_COLUMNS: Final = (
    "request_id, conversation_id, last_sequence_number, create_time, end_time, events_expired"
)
"""The columns :func:`stream_from_row` reads, in its order."""


def append_events_write(
    conversation_id: str, request_id: str, events: Sequence[tuple[int, bytes]], *, ended: bool
) -> WriteFn:
    """The write of ``Store.append_events``: create or extend the stream row, insert ``events``.

    A first batch starting at 1 for a stream that already ended replaces that stream (the
    request id was retried after a failed turn). Nothing is written when no turn
    ``request_id`` is recorded (its conversation was deleted while it ran). Raises
    :class:`ValueError` for an empty batch without ``ended``, or sequence numbers that do
    not ascend.
    """
    if not events and not ended:
        raise ValueError("append_events needs events, or ended=True")
    numbers = [number for number, _ in events]
    if numbers != sorted(set(numbers)) or (numbers and numbers[0] < 1):
        raise ValueError(f"event sequence numbers must ascend from >= 1, got {numbers[:5]}…")
    batch = pack_events(events) if events else b""
    last = numbers[-1] if numbers else 0

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        if conn.execute("SELECT 1 FROM turns WHERE request_id = ?", (request_id,)).fetchone() is None:
            return  # its conversation was deleted (or it never stored input): nothing to keep
        found = conn.execute(
            "SELECT end_time FROM turn_streams WHERE request_id = ?", (request_id,)
        ).fetchone()
        if found is not None and found[0] is not None and numbers and numbers[0] == 1:
            conn.execute("DELETE FROM turn_streams WHERE request_id = ?", (request_id,))
            found = None
        if found is None:
            conn.execute(
                "INSERT INTO turn_streams (request_id, conversation_id, last_sequence_number, create_time)"
                " VALUES (?, ?, 0, ?)",
                (request_id, conversation_id, now_us),
            )
        if events:
            # OR REPLACE: a batch retried after a failed commit starts at the same number.
            conn.execute(
                "INSERT OR REPLACE INTO turn_events"
                " (request_id, first_sequence_number, last_sequence_number, data) VALUES (?, ?, ?, ?)",
                (request_id, numbers[0], last, batch),
            )
        conn.execute(
            "UPDATE turn_streams SET last_sequence_number = MAX(last_sequence_number, ?),"
            " end_time = CASE WHEN ? THEN ? ELSE end_time END WHERE request_id = ?",
            (last, ended, now_us, request_id),
        )

    return apply


_FRAME: Final = struct.Struct(">qI")


def pack_events(events: Sequence[tuple[int, bytes]]) -> bytes:
    """One ``turn_events.data`` value: each event framed as (sequence number, length, bytes)."""
    return b"".join(_FRAME.pack(number, len(data)) + data for number, data in events)


def unpack_events(data: bytes, after: int, before: int | None) -> list[bytes]:
    """The serialized events of a packed batch with ``after < sequence_number < before``.

    Raises :class:`ValueError` for a value :func:`pack_events` did not make (a damaged row)."""
    found: list[bytes] = []
    offset, end = 0, len(data)
    while offset < end:
        if end - offset < _FRAME.size:
            raise ValueError("truncated event frame")
        number, length = _FRAME.unpack_from(data, offset)
        offset += _FRAME.size
        if end - offset < length:
            raise ValueError("truncated event")
        if number > after and (before is None or number < before):
            found.append(data[offset : offset + length])
        offset += length
    return found


def events_from_rows(
    rows: Iterable[Any], request_id: str, after: int, before: int | None, store: str
) -> list[bytes]:
    """The serialized events of ``turn_events`` rows ``(data,)`` (in order) with
    ``after < sequence_number < before``; both stores' ``load_events``. Raises
    :class:`StoreCorrupted` (naming ``store``) for a batch that cannot be read back."""
    events: list[bytes] = []
    try:
        for (data,) in rows:
            events.extend(unpack_events(bytes(data), after, before))
    except ValueError as exc:
        raise StoreCorrupted(
            f"{store} store: the events of turn {request_id!r} cannot be read: {exc}"
        ) from exc
    return events


def stream_from_row(row: Any) -> StreamRecord:
    """A ``turn_streams`` row ``(request_id, conversation_id, last_sequence_number, create_time,
    end_time, events_expired)`` as a :class:`StreamRecord`."""
    create = time_from_us(row[3])
    assert create is not None  # NOT NULL column
    return StreamRecord(
        request_id=row[0],
        conversation_id=row[1],
        last_sequence_number=row[2],
        create_time=create,
        end_time=time_from_us(row[4]),
        events_expired=bool(row[5]),
    )
