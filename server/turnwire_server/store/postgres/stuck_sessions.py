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

A stuck session need not hold the turn's row: stopped inside a write of the turn's conversation
(an insert's foreign-key lock on the conversation's row, say), it leaves the turn's row free for
the claim, and the claimant's recovery would then wait on the conversation for as long as the
pause lasts. So a claim passes over the turns of a lapsed replica with a session still inside
a transaction younger than a lease (:func:`end_stuck_sessions` names them); a later claim ends
that session once it is older, then takes the turns. Only within a lease of that replica's lapse:
a transaction stuck since the pause is older than a lease by then, and a replica alive but not
renewing (its short transactions never age) would otherwise keep its turns for good.

A replica paused again after its turns were taken over (inside a stale write that locked a row
this replica now writes) owns no lapsed turn any more. So a claim also ends the session of any
other replica that blocks one of this replica's sessions while it has waited on its own client
(``ClientRead``, or idle inside its transaction) for longer than a lease: a live replica answers
its database within milliseconds.

Ending another role's sessions needs that role's membership or ``pg_signal_backend`` (replicas
normally share one role); without it the claim goes on and a warning says why.
"""

from __future__ import annotations

import logging
from typing import Any, Final

import psycopg

log = logging.getLogger("turnwire_server.store.postgres")

__all__ = ["end_stuck_sessions", "session_name"]

_NAME_PREFIX: Final = "turnwire/"
_NAME_BYTES: Final = 63
"""PostgreSQL keeps the first 63 bytes of an ``application_name`` (NAMEDATALEN - 1)."""

_END_STUCK: Final = b"""
WITH lapsed AS (
    SELECT owner, MAX(lease_until) AS lease_until FROM turns
    WHERE state = 'running' AND owner IS NOT NULL AND owner <> %(me)s
    GROUP BY owner HAVING MIN(lease_until) < %(lapsed)s
), inside AS (
    SELECT a.pid, lapsed.owner, lapsed.lease_until,
           a.xact_start < now() - make_interval(secs => %(older_than_s)s) AS stuck
    FROM pg_stat_activity AS a
    JOIN lapsed ON a.application_name = %(prefix)s || lapsed.owner
    WHERE a.datname = current_database()
      AND a.pid <> pg_backend_pid()
      AND a.xact_start IS NOT NULL
), blocking_me AS (
    SELECT DISTINCT unnest(pg_blocking_pids(w.pid)) AS pid
    FROM pg_stat_activity AS w
    WHERE w.datname = current_database() AND w.application_name = %(prefix)s || %(me)s
      AND w.wait_event_type = 'Lock'
), waiting_on_its_client AS (
    SELECT a.pid FROM pg_stat_activity AS a JOIN blocking_me USING (pid)
    WHERE a.application_name LIKE %(prefix)s || '%%' AND a.application_name <> %(prefix)s || %(me)s
      AND (a.wait_event = 'ClientRead' OR a.state = 'idle in transaction')
      AND a.state_change < now() - make_interval(secs => %(older_than_s)s)
), ended AS (
    SELECT pg_terminate_backend(pid) AS done
    FROM (SELECT pid FROM inside WHERE stuck UNION SELECT pid FROM waiting_on_its_client) AS stuck
)
SELECT ARRAY(
    SELECT DISTINCT owner FROM inside
    WHERE NOT stuck AND lease_until >= %(lapsed)s - %(lease_us)s
), (SELECT COUNT(*) FROM ended WHERE done)
"""


def session_name(replica_id: str) -> str:
    """The ``application_name`` of replica ``replica_id``'s database sessions: ``turnwire/<id>``,
    also what an operator sees in ``pg_stat_activity``. Raises :class:`ValueError` when it would
    not fit PostgreSQL's 63 bytes (the server would cut it, and no claim could match it)."""
    name = _NAME_PREFIX + replica_id
    if len(name.encode()) > _NAME_BYTES:
        raise ValueError(f"replica id {replica_id!r} is too long for a session name (at most 54 bytes)")
    return name


async def end_stuck_sessions(conn: Any, me: str, lapsed_before_us: int, older_than_s: float) -> list[str]:
    """End (``pg_terminate_backend``) the sessions of every replica other than ``me`` holding a
    running turn whose lease lapsed before ``lapsed_before_us`` (µs since the epoch) that have
    been inside one transaction for more than ``older_than_s`` seconds (a lease), and those of any
    other replica blocking a session of ``me`` after waiting on their client for longer than that.
    Returns the replicas whose lease lapsed less than a lease ago with a session inside a younger
    transaction: a claim passes over their turns for now (the module docstring says why); how
    many sessions were ended is logged. ``conn`` is an autocommit connection. Lacking the
    privilege to end one is logged and ends none; other database errors propagate
    (:class:`psycopg.Error`)."""
    params = {
        "me": me,
        "lapsed": lapsed_before_us,
        "prefix": _NAME_PREFIX,
        "older_than_s": older_than_s,
        "lease_us": int(older_than_s * 1_000_000),
    }
    try:
        busy, ended = await (await conn.execute(_END_STUCK, params)).fetchone()
    except psycopg.errors.InsufficientPrivilege:
        log.warning(
            "a replica whose lease lapsed holds a database session stuck inside a transaction, and this"
            " replica's role may not end it (it needs the other role's membership or pg_signal_backend):"
            " its turns wait until that session ends"
        )
        return []
    if ended:
        log.warning(
            "ended %d database session(s) of a replica whose lease lapsed, stuck inside a transaction"
            " for more than %.0f s (a paused or cut-off replica: its turns are taken over)",
            ended,
            older_than_s,
        )
    return list(busy)
