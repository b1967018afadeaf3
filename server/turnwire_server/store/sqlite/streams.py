"""The SQLite store's event streams: a turn's events kept for ResumeTurn (docs/semantics.md §8).

Same conventions as :mod:`turnwire_server.store.sqlite.writes`; the rows' encoding is
:mod:`turnwire_server.store.core.stream_rows`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from turnwire_server.store.core.stream_rows import pack_events
from turnwire_server.store.sqlite.db import WriteFn

__all__ = ["append_events_write"]


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
