"""Leases and claims, once for both drivers (core programs, :mod:`turnwire_server.store.core.sql`):
``ReplicaStore.renew_leases``, ``ReplicaStore.claim_interrupted_turns`` and
``SubmissionStore.claim_pending_submissions`` (the rules: docs/semantics.md §5, "Leases").

A claim takes the turn's lease over: it increments ``lease_epoch``, the fencing token the
previous owner's writes carry, so that owner writes nothing more for the turn
(:mod:`.fencing`; docs/semantics.md §5, "Fencing").

Whose work may be claimed is decided here once: a running turn (or pending submission) of
another owner whose lease lapsed before ``now`` or that has none. A driver whose other owners
are dead by construction passes ``lapsed_before_us=None``: then every other owner's work is
claimable, whatever its lease (SQLite serves one process per file; its file lock proves the
previous one dead, so a crash a moment ago need not wait out the lease). Claimants running at
once take disjoint rows (the dialect's ``claim_rows``: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL),
and the claimed work's places in a shared line go over to the claimant in the same transaction
(``work_claimed``: PostgreSQL's queue tickets).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from turnwire_server.store.core.rows import TURN_COLUMNS, time_from_us, to_us, turn_from_row
from turnwire_server.store.core.sql import Dialect, Program, Statement, in_marks
from turnwire_server.store.core.submission_rows import SUBMISSION_COLUMNS, submission_from_row
from turnwire_server.store.records import HeldTurn, SubmissionRecord, TurnLease, TurnRecord

__all__ = ["claim_interrupted_turns", "claim_pending_submissions", "release_leases", "renew_leases"]

R = TypeVar("R")

_LAPSED: Final = " AND (lease_until IS NULL OR lease_until < ?)"
"""The lease condition of a claim (µs since the epoch), left out when ``lapsed_before_us`` is None."""


def renew_leases(owner: str, until_us: int, dialect: Dialect) -> Program[list[HeldTurn]]:
    """Extend to ``until_us`` (µs since the epoch) the leases of ``owner``'s running turns,
    pending submissions and what else the dialect leases (``lease_renewals``): one statement
    each, whatever their number; returns the turns ``owner`` holds (their tokens and starts: what
    the replica compares with the turns it runs, to give up the others' leases). The turns' rows
    are locked in the order a group commit of fenced writes locks them (conversation, then
    request id: :mod:`.fencing`), so the two never wait on each other in a cycle."""
    found = yield [
        Statement(
            "UPDATE turns SET lease_until = ? WHERE request_id IN (SELECT request_id FROM turns"
            " WHERE owner = ? AND state = 'running' ORDER BY conversation_id, request_id"
            f"{dialect.lock_rows}) RETURNING request_id, owner, lease_epoch, start_time",
            (until_us, owner),
            fetch=True,
        ),
        Statement(
            "UPDATE submissions SET lease_until = ? WHERE owner = ? AND state = 'pending'", (until_us, owner)
        ),
        *(Statement(sql, (until_us, owner)) for sql in dialect.lease_renewals),
    ]
    return [_held_turn(row) for row in found[0]]


def _token(lease: TurnLease) -> tuple[str, str, int]:
    return lease.request_id, lease.owner, lease.epoch


def _held_turn(row: Any) -> HeldTurn:
    """A renewal's row (request id, owner, epoch, start in µs) as a :class:`HeldTurn`."""
    start_time = time_from_us(row[3])
    assert start_time is not None  # NOT NULL in the schema
    return HeldTurn(TurnLease(row[0], row[1], int(row[2] or 0)), start_time)


def release_leases(turns: Sequence[HeldTurn]) -> Program[None]:
    """Give up the lease of each of ``turns`` (one statement, a parameter row each): the turn,
    while still ``running`` under that very token (owner and epoch) and that very start (its
    ``start_time``: a later attempt under the same request id is another turn), gets no owner
    and no lease, so the next claim of any replica, its former owner's included, takes it over.
    A turn ended, taken over or never stored is left as it is."""
    yield [
        Statement(
            "UPDATE turns SET owner = NULL, lease_until = NULL WHERE request_id = ? AND owner = ?"
            " AND lease_epoch = ? AND start_time = ? AND state = 'running'",
            [(*_token(turn.lease), to_us(turn.start_time, "start_time")) for turn in turns],
            many=True,
        )
    ]


def claim_interrupted_turns(
    owner: str, lapsed_before_us: int | None, until_us: int, limit: int, *, passed_over: Sequence[str] = ()
) -> Callable[[Dialect], Program[list[TurnRecord]]]:
    """Claim up to ``limit`` (>= 1) running turns of other owners (module docstring: whose), but
    none of the owners ``passed_over``, oldest first: each gets ``owner`` and the lease
    ``until_us`` (µs since the epoch) in one statement, and its place in a shared line (the
    dialect's ``work_claimed``); returns them as claimed, by start time then request id. Returns
    the program's maker (a driver that retries a transaction runs a new program). Raises
    :class:`ValueError` for ``limit`` < 1 (at once)."""
    return _claiming(_TURNS, owner, lapsed_before_us, until_us, limit, passed_over=passed_over)


def claim_pending_submissions(
    owner: str, lapsed_before_us: int | None, until_us: int, limit: int
) -> Callable[[Dialect], Program[list[SubmissionRecord]]]:
    """Claim up to ``limit`` (>= 1) pending submissions no replica claimed yet (no owner) or
    whose owner is gone (module docstring), in acceptance order, as
    :func:`claim_interrupted_turns` claims turns. Raises :class:`ValueError` for ``limit`` < 1."""
    return _claiming(_SUBMISSIONS, owner, lapsed_before_us, until_us, limit)


@dataclass(frozen=True, slots=True)
class _Claimable(Generic[R]):
    """A table whose open rows carry an owner and a lease, and how its claimed rows come back."""

    table: str
    key: str  # the primary key: the first of ``columns``, and the work's id in line
    columns: str  # the record's columns
    taken: str  # what else a claim sets (the fencing token's epoch)
    open_rows: str  # the condition of rows still to run
    order: str  # who is claimed first
    record: Callable[[Any], R]
    record_order: Callable[[R], Any]


_TURNS: Final = _Claimable(
    "turns",
    "request_id",
    TURN_COLUMNS,
    ", lease_epoch = lease_epoch + 1",
    "state = 'running'",
    "start_time, request_id",
    turn_from_row,
    lambda turn: (turn.start_time, turn.request_id),
)
_SUBMISSIONS: Final = _Claimable(
    "submissions",
    "id",
    SUBMISSION_COLUMNS,
    "",
    "state = 'pending'",
    "seq",
    submission_from_row,
    lambda r: r.seq,
)


def _claiming(
    rows: _Claimable[R],
    owner: str,
    lapsed_before_us: int | None,
    until_us: int,
    limit: int,
    *,
    passed_over: Sequence[str] = (),
) -> Callable[[Dialect], Program[list[R]]]:
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    lapsed, lapsed_params = ("", ()) if lapsed_before_us is None else (_LAPSED, (lapsed_before_us,))
    if passed_over:
        lapsed, lapsed_params = (
            f"{lapsed} AND (owner IS NULL OR owner NOT IN ({in_marks(len(passed_over))}))",
            (*lapsed_params, *passed_over),
        )

    def program(dialect: Dialect) -> Program[list[R]]:
        found = yield [
            Statement(
                f"UPDATE {rows.table} SET owner = ?, lease_until = ?{rows.taken} WHERE {rows.key} IN ("
                f"SELECT {rows.key} FROM {rows.table} WHERE {rows.open_rows}"
                f" AND (owner IS NULL OR owner <> ?){lapsed} ORDER BY {rows.order}"
                f" LIMIT ?{dialect.claim_rows}) RETURNING {rows.columns}",
                (owner, until_us, owner, *lapsed_params, limit),
                fetch=True,
            )
        ]
        if found[0]:
            yield dialect.work_claimed([row[0] for row in found[0]], owner, until_us)
        return sorted(map(rows.record, found[0]), key=rows.record_order)

    return program
