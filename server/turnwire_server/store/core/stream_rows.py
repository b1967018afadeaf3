"""How both stores encode a turn's event stream in rows: ``turn_streams`` rows and the packed
event batches of ``turn_events`` (docs/semantics.md §8)."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from typing import Any, Final

from turnwire_server.store.core.rows import time_from_us
from turnwire_server.store.errors import StoreCorrupted
from turnwire_server.store.records import StreamRecord

__all__ = ["STREAM_COLUMNS", "events_from_rows", "pack_events", "stream_from_row", "unpack_events"]

_FRAME: Final = struct.Struct(">qI")
"""An event's frame in a packed batch: its sequence number and its length in bytes."""

STREAM_COLUMNS: Final = (
    "request_id, conversation_id, last_sequence_number, create_time, end_time, events_expired"
)
"""The columns :func:`stream_from_row` reads, in its order."""


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
