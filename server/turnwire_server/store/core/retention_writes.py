"""Retention writes, once for both drivers (core programs, :mod:`turnwire_server.store.core.sql`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

from turnwire_server.store.core.sql import Dialect, Program, Statement

__all__ = ["expire_events"]

_ENDED_STREAMS: Final = (
    "SELECT request_id FROM turn_streams"
    " WHERE end_time IS NOT NULL AND events_expired = 0 AND end_time < ?"
    " ORDER BY end_time LIMIT ?"
)


def expire_events(before_us: int, limit: int) -> Callable[[Dialect], Program[int]]:
    """``Store.expire_events``: the events of up to ``limit`` (>= 1) streams that ended before
    ``before_us`` (µs since the epoch) are deleted and the streams marked ``events_expired``;
    returns how many streams. Streams another writer is expiring at the same moment are skipped
    (the dialect's ``claim_rows``). Returns the program's maker (a driver that retries a
    transaction runs a new program). Raises :class:`ValueError` for ``limit`` < 1 (at once)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return functools.partial(_expire_events, before_us, limit)


def _expire_events(before_us: int, limit: int, dialect: Dialect) -> Program[int]:
    found = yield [Statement(_ENDED_STREAMS + dialect.claim_rows, (before_us, limit), fetch=True)]
    streams = [(request_id,) for (request_id,) in found[0]]
    yield [
        Statement("DELETE FROM turn_events WHERE request_id = ?", streams, many=True),
        Statement("UPDATE turn_streams SET events_expired = 1 WHERE request_id = ?", streams, many=True),
    ]
    return len(streams)
