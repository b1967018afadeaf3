"""Ending the database sessions of a replica that stopped in the middle of a write (issue 34;
docs/semantics.md §5, "Fencing").

A fenced write reads the turn's lease token with its row locked, then sends its writes
(:mod:`turnwire_server.store.core.fencing`). A replica paused (SIGSTOP, a frozen VM, a long GC
pause) or cut off between the two leaves its backend inside the transaction, ``active`` and
waiting for the client (``ClientRead``): PostgreSQL ends no such session by itself
(``idle_in_transaction_session_timeout`` applies only between statements, ``statement_timeout``
only while one runs; the server's TCP timeouts only when the route is really gone, and a paused
process's kernel still answers keepalives). Its row lock would keep every other replica's claim
(``FOR UPDATE SKIP LOCKED``) off that turn for as long as the pause lasts.

So every pooled session names its replica in ``application_name`` (:func:`session_name`), and
before each claim a replica ends the sessions of the replicas whose leases lapsed that have been
inside one transaction for longer than a lease (:data:`_END_STUCK`): the store's transactions
wait on nothing but the database, so such a transaction is stuck, and its replica, not renewing
its leases, is paused or cut off. Its locks go with it; the next claim takes the turn over, and
the replica, when it goes on, finds its connection gone and its lease taken (fencing refuses its
writes).

A stuck session need not hold the turn's row: paused inside a write of the turn's conversation
(an insert's foreign-key lock on the conversation row, say), it leaves the turn claimable while
its transaction is still younger than a lease, and once the claim moved the turn over, its
replica owns no lapsed turn any more. The claimant would then wait on that lock for as long as
the pause lasts. So the replicas a claim found lapsed stay lapsed for a few leases
(:class:`LapsedReplicas`), and later claims end their sessions once those are old enough.

Ending another role's sessions needs that role's membership or ``pg_signal_backend`` (replicas
normally share one role); without it the claim goes on and a warning says why.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Final

import psycopg

log = logging.getLogger("turnwire_server.store.postgres")

__all__ = ["LapsedReplicas", "end_stuck_sessions", "session_name"]

_NAME_PREFIX: Final = "turnwire/"
_NAME_BYTES: Final = 63
"""PostgreSQL keeps the first 63 bytes of an ``application_name`` (NAMEDATALEN - 1)."""

_END_STUCK: Final = b"""
WITH lapsed AS (
    SELECT DISTINCT owner FROM turns
    WHERE state = 'running' AND owner IS NOT NULL AND owner <> %(me)s AND lease_until < %(lapsed)s
), ended AS (
    SELECT pg_terminate_backend(a.pid) AS done
    FROM pg_stat_activity AS a
    WHERE a.datname = current_database()
      AND a.pid <> pg_backend_pid()
      AND a.xact_start < now() - make_interval(secs => %(older_than_s)s)
      AND a.application_name IN (
          SELECT %(prefix)s || owner FROM lapsed
          UNION SELECT %(prefix)s || o FROM unnest(%(recent)s::text[]) AS o WHERE o <> %(me)s
      )
)
SELECT ARRAY(SELECT owner FROM lapsed), (SELECT COUNT(*) FROM ended WHERE done)
"""

_REMEMBERED_LEASES: Final = 4
"""For how many leases a replica found lapsed stays so (:class:`LapsedReplicas`): its stuck
session is ended once older than a lease, and claims run every third of one."""

_REMEMBERED_MAX: Final = 256
"""At most this many replicas are remembered (the ones found lapsed longest ago go first)."""


class LapsedReplicas:
    """The replicas a claim found with lapsed leases, remembered for :data:`_REMEMBERED_LEASES`
    leases after they were last found so (at most :data:`_REMEMBERED_MAX`, about 70 bytes each):
    the turns of a paused replica are claimed away before its stuck sessions are old enough to
    end, and it then owns none that would name it lapsed. Not thread-safe (one event loop)."""

    def __init__(self) -> None:
        self._until: dict[str, float] = {}  # replica id -> monotonic seconds it is remembered until

    def recent(self) -> list[str]:
        """The replicas still remembered (expired ones are forgotten here)."""
        now = time.monotonic()
        for owner in [o for o, until in self._until.items() if until <= now]:
            del self._until[owner]
        return list(self._until)

    def found(self, owners: list[str], lease_s: float) -> None:
        """Remember ``owners`` (just found lapsed) for :data:`_REMEMBERED_LEASES` leases of
        ``lease_s`` seconds from now."""
        until = time.monotonic() + _REMEMBERED_LEASES * lease_s
        for owner in owners:
            self._until.pop(owner, None)  # re-inserted last: dict order is oldest first
            self._until[owner] = until
        while len(self._until) > _REMEMBERED_MAX:
            del self._until[next(iter(self._until))]


def session_name(replica_id: str) -> str:
    """The ``application_name`` of replica ``replica_id``'s database sessions: ``turnwire/<id>``,
    also what an operator sees in ``pg_stat_activity``. Raises :class:`ValueError` when it would
    not fit PostgreSQL's 63 bytes (the server would cut it, and no claim could match it)."""
    name = _NAME_PREFIX + replica_id
    if len(name.encode()) > _NAME_BYTES:
        raise ValueError(f"replica id {replica_id!r} is too long for a session name (at most 54 bytes)")
    return name


async def end_stuck_sessions(
    conn: Any, me: str, lapsed_before_us: int, older_than_s: float, lapsed: LapsedReplicas
) -> int:
    """End (``pg_terminate_backend``) the sessions of every replica other than ``me`` that have
    been inside one transaction for more than ``older_than_s`` seconds (a lease), where the
    replica holds a running turn whose lease lapsed before ``lapsed_before_us`` (µs since the
    epoch) or is one ``lapsed`` still remembers; the replicas found lapsed are remembered
    (:meth:`LapsedReplicas.found`). Returns how many sessions were ended. ``conn`` is an
    autocommit connection. Lacking the privilege to end one is logged and counted as none;
    other database errors propagate (:class:`psycopg.Error`)."""
    params = {
        "me": me,
        "lapsed": lapsed_before_us,
        "prefix": _NAME_PREFIX,
        "older_than_s": older_than_s,
        "recent": lapsed.recent(),
    }
    try:
        owners, ended = await (await conn.execute(_END_STUCK, params)).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        log.warning(
            "a replica whose lease lapsed holds a database session stuck inside a transaction, and this"
            " replica's role may not end it (it needs the other role's membership or pg_signal_backend):"
            " its turns wait until that session ends"
        )
        return 0
    lapsed.found(owners, older_than_s)
    if ended:
        log.warning(
            "ended %d database session(s) of a replica whose lease lapsed, stuck inside a transaction"
            " for more than %.0f s (a paused or cut-off replica: its turns are taken over)",
            ended,
            older_than_s,
        )
    return int(ended)
