"""The PostgreSQL store backend: psycopg 3 (async) with a bounded connection pool.

Same behaviour as the SQLite store (:mod:`turnwire_server.store.sqlite`): the reads and each
write's statements and rules are the shared core's (:mod:`turnwire_server.store.core`); every
write is one transaction here, reads are single statements (one snapshot each), and
undecodable data is :class:`StoreCorrupted`.

The schema lives in ``migrations/postgres/NNNN_name.sql``; pending migrations run at
:meth:`PostgresStore.open` in one transaction under an advisory lock
(:mod:`turnwire_server.store.postgres.migrations`), so replicas may start together.

**Several replicas share one database.** The turn lock is a cross-replica FIFO queue, cancel
requests and event wake-ups travel by ``LISTEN``/``NOTIFY``, and turn leases let a survivor
claim the turns of a replica that died (:mod:`turnwire_server.store.postgres.replicas`). The
store's writes are safe under concurrency (conversation locks, ``SELECT … FOR UPDATE``).

:class:`PostgresStore` is made of one part a concern: the connections and transactions, on
which the core's reads and writes run (:mod:`.connection`, group commit in :mod:`.batching`),
a turn's admission and the turn queue (:mod:`.admission`, statements in :mod:`.turn_queue`),
and the cancel relay and wake-ups (:mod:`.notifications`). What its writes do beyond SQLite's
(queue tickets, notifications, row locks) is its dialect's (:mod:`.db`).
"""

from __future__ import annotations

import datetime as dt

import psycopg
import psycopg_pool

from turnwire_server.store.core.rows import to_us
from turnwire_server.store.postgres.admission import TurnQueue
from turnwire_server.store.postgres.connection import DEFAULT_POOL_SIZE
from turnwire_server.store.postgres.notifications import Notifications
from turnwire_server.store.postgres.stuck_sessions import end_stuck_sessions
from turnwire_server.store.records import TurnRecord

__all__ = ["DEFAULT_POOL_SIZE", "PostgresStore"]


class PostgresStore(TurnQueue, Notifications):
    """:class:`~turnwire_server.store.base.Store` on a PostgreSQL database (psycopg 3, async).

    ``url`` is ``postgresql://user[:password]@host[:port]/database`` (or ``postgres://``; libpq
    query parameters pass through); ``password_env`` names an environment variable with the
    password when the URL has none (else libpq's ``PGPASSWORD``). ``pool_size`` (>= 1) bounds
    the connections the store holds; a call waits up to ``timeout_s`` seconds for one.

    Errors: :class:`StoreError` when the database cannot be reached or fails (its message
    names the URL with the password masked, never the password), :class:`StoreCorrupted` for
    stored data that cannot be decoded, the domain errors of
    :mod:`turnwire_server.store.errors` as the SQLite store raises them, and
    :class:`ValueError` for a malformed URL (at construction) or an argument no backend could
    store. Besides the pool, the store holds one ``LISTEN`` connection. ``replica_id`` names
    the sessions for the replica whose turns they write (:func:`.stuck_sessions.session_name`;
    None: the libpq default), which is what lets another replica end them once that replica's
    leases lapsed inside a write (:meth:`claim_interrupted_turns`).
    """

    async def claim_interrupted_turns(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[TurnRecord]:
        """:meth:`Store.claim_interrupted_turns`, after ending the sessions of the replicas whose
        leases lapsed that are stuck inside a transaction for longer than a lease
        (:func:`.stuck_sessions.end_stuck_sessions`): their locks would keep the claim off their
        turns, or the claimant's recovery waiting. A turn whose row lock goes with them is claimed
        by the next claim (a third of a lease later), once the server has ended the session; the
        turns of a lapsed replica with a session inside a younger transaction are passed over
        until it is old enough to end."""
        pool = self._require_pool("claim_interrupted_turns")
        try:
            async with pool.connection() as conn:
                lease_s = (lease_until - now).total_seconds()
                busy = await end_stuck_sessions(conn, owner, to_us(now, "now"), lease_s)
        except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
            raise self._error(exc, "claim_interrupted_turns") from None
        return await self._claim_turns(owner, now, lease_until, limit, busy)
