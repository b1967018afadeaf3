"""Retention writes, once for both drivers (core programs, :mod:`turnwire_server.store.core.sql`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Final

from turnwire_server.store.core.sql import Dialect, Program, Statement

__all__ = ["expire_budget_periods", "expire_events", "expire_turn_budgets"]

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


def _delete_budget_rows(keys: list[tuple[object, ...]]) -> Statement:
    """The deletion of the budget rows ``keys`` (``scope, scope_key, period``) a sweep claimed."""
    return Statement(
        "DELETE FROM budget_spend WHERE scope = ? AND scope_key = ? AND period = ?", keys, many=True
    )


_ENDED_PERIODS: Final = (
    # Key lengths tell the periods apart: a UTC day (2026-12-02) or month (2026-12); '' never ends.
    # The first two terms are the partial index's (migration 0016): the scan reads only periods
    # before the later of the two bounds, oldest first, and stops at the limit.
    "SELECT scope, scope_key, period FROM budget_spend b WHERE period <> '' AND period < ?"
    " AND ((length(period) = 10 AND period < ?) OR (length(period) = 7 AND period < ?))"
    " AND NOT EXISTS (SELECT 1 FROM budget_reservations r"
    " WHERE r.scope = b.scope AND r.scope_key = b.scope_key AND r.period = b.period)"
    " ORDER BY period LIMIT ?"
)


def expire_budget_periods(day: str, month: str, limit: int) -> Callable[[Dialect], Program[int]]:
    """``Store.expire_budget_periods``: up to ``limit`` (>= 1) budget rows of periods before
    ``day`` (a UTC day, ``2026-12-02``: the rows of earlier days) or ``month`` (``2026-12``: of
    earlier months) that no running step reserved on are deleted; returns how many. Rows another
    writer is expiring or charging at the same moment are skipped (the dialect's
    ``claim_rows``). Returns the program's maker. Raises :class:`ValueError` for ``limit`` < 1 or
    a ``day`` or ``month`` not of those forms (at once)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if len(day) != 10 or len(month) != 7:
        raise ValueError(f"day and month must be YYYY-MM-DD and YYYY-MM, got {day!r} and {month!r}")
    return functools.partial(_expire_budget_periods, day, month, limit)


def _expire_budget_periods(day: str, month: str, limit: int, dialect: Dialect) -> Program[int]:
    found = yield [
        Statement(_ENDED_PERIODS + dialect.claim_rows, (max(day, month), day, month, limit), fetch=True)
    ]
    keys = [tuple(row) for row in found[0]]
    yield [_delete_budget_rows(keys)]
    return len(keys)


_ENDED_TURN_BUDGETS: Final = (
    # A turn's own budget row (scope 'turn', keyed by its request id) once the turn has ended: its
    # last settlement rode the write that ended it, and no later attempt charges it. The primary
    # key serves the scope's range; the turn is found by its own.
    "SELECT scope, scope_key, period FROM budget_spend b WHERE scope = 'turn'"
    " AND EXISTS (SELECT 1 FROM turns t WHERE t.request_id = b.scope_key AND t.end_time IS NOT NULL)"
    " AND NOT EXISTS (SELECT 1 FROM budget_reservations r"
    " WHERE r.scope = b.scope AND r.scope_key = b.scope_key AND r.period = b.period)"
    " LIMIT ?"
)


def expire_turn_budgets(limit: int) -> Callable[[Dialect], Program[int]]:
    """``Store.expire_turn_budgets``: up to ``limit`` (>= 1) rows of turns' own budgets
    (``turn`` scope) whose turn has ended and that no step reserved on are deleted; returns how
    many. Rows another writer is expiring or charging at the same moment are skipped (the
    dialect's ``claim_rows``). Returns the program's maker. Raises :class:`ValueError` for
    ``limit`` < 1 (at once)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    return functools.partial(_expire_turn_budgets, limit)


def _expire_turn_budgets(limit: int, dialect: Dialect) -> Program[int]:
    found = yield [Statement(_ENDED_TURN_BUDGETS + dialect.claim_rows, (limit,), fetch=True)]
    keys = [tuple(row) for row in found[0]]
    yield [_delete_budget_rows(keys)]
    return len(keys)
