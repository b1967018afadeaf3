"""Fencing a running turn's writes (docs/semantics.md §5, "Fencing"), once for both drivers.

A turn's lease carries a fencing token, ``(owner, lease_epoch)``: the replica that runs it and
the number of claims so far (each takeover increments it, :mod:`.lease_writes`). Every write a
turn makes (checkpoints, event batches, its reply and end, a discarded attempt) reads the
token in the read batch it already sends, its row locked (the dialect's ``lock_rows``: a
claim, which skips locked rows, then waits its turn), and refuses with
:class:`~turnwire_server.store.errors.LeaseLost`, writing nothing, when the token is no longer
the writer's. So a replica that was paused or cut off past its lease never writes for a turn
another replica took over: no extra statement, no extra round trip.
"""

from __future__ import annotations

from typing import Any, Final

from turnwire_server.store.core.sql import Dialect, Statement
from turnwire_server.store.errors import LeaseLost
from turnwire_server.store.records import TurnLease

__all__ = ["holds_lease", "lease_read"]

_LEASE_READ: Final = "SELECT owner, lease_epoch FROM turns WHERE request_id = ?"
_LEASE_AND_SUBMISSION_READ: Final = (
    "SELECT owner, lease_epoch, EXISTS (SELECT 1 FROM submissions AS s"
    " WHERE s.id = turns.request_id AND s.state = 'running') FROM turns WHERE request_id = ?"
)


def lease_read(request_id: str, dialect: Dialect, *, running_submission: bool = False) -> Statement:
    """The read :func:`holds_lease` decides on: turn ``request_id``'s token, its row locked.
    ``running_submission``: its row also says (third column) whether a submission of the same id
    is running, which a turn's end then ends (no other write makes one running while the turn
    runs: a submission's turn start would conflict with this turn's row)."""
    sql = _LEASE_AND_SUBMISSION_READ if running_submission else _LEASE_READ
    return Statement(sql + dialect.lock_rows, (request_id,), fetch=True)


def holds_lease(rows: list[Any], lease: TurnLease | None) -> bool:
    """Whether the turn :func:`lease_read` read is recorded (False: its conversation was deleted,
    or it never started). Raises :class:`LeaseLost` when it is recorded under another token than
    ``lease`` (None: the write is not fenced)."""
    if not rows:
        return False
    if lease is not None:
        owner, epoch = rows[0][0], rows[0][1]
        if (owner or "") != lease.owner or int(epoch or 0) != lease.epoch:
            raise LeaseLost(lease.request_id)
    return True
