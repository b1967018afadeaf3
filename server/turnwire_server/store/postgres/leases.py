"""Leases and claims on PostgreSQL (docs/semantics.md §5, "Leases"): a replica renews the leases
of all its work in one transaction, and a survivor claims the lapsed turns and pending
submissions of a replica that died. The statements and whose work is claimable are the shared
core's (:mod:`turnwire_server.store.core.lease_writes`); what is this driver's own is the queue
tickets, which carry their replica's lease and go over to the claimant in the claim's
transaction, so recovered work keeps its place in line."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import TypeVar

from turnwire_server.store.base import SubmissionRecord, TurnRecord
from turnwire_server.store.core import lease_writes
from turnwire_server.store.core.rows import to_us
from turnwire_server.store.core.sql import Dialect, Program
from turnwire_server.store.postgres import turn_queue
from turnwire_server.store.postgres.connection import PostgresConnection
from turnwire_server.store.postgres.db import DIALECT, Conn, run_program

__all__ = ["Leases"]

R = TypeVar("R", TurnRecord, SubmissionRecord)


class Leases(PostgresConnection):
    """Lease renewal and claims (the contracts: :mod:`turnwire_server.store.base`)."""

    async def renew_leases(self, owner: str, until: dt.datetime) -> int:
        """The turns', the pending submissions' and the queue tickets' leases, in one transaction."""
        until_us = to_us(until, "until")
        return await self._write(
            "renew_leases",
            lambda conn, _: run_program(conn, lease_writes.renew_leases(owner, until_us, DIALECT)),
        )

    async def claim_interrupted_turns(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[TurnRecord]:
        """Each claimed turn's queue ticket is taken over in the same transaction."""
        until_us = to_us(lease_until, "lease_until")
        make = lease_writes.claim_interrupted_turns(owner, to_us(now, "now"), until_us, limit)
        return await self._claim("claim_interrupted_turns", make, owner, until_us, lambda t: t.request_id)

    async def claim_pending_submissions(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[SubmissionRecord]:
        """Each claimed submission's queue ticket is taken over in the same transaction."""
        until_us = to_us(lease_until, "lease_until")
        make = lease_writes.claim_pending_submissions(owner, to_us(now, "now"), until_us, limit)
        return await self._claim(
            "claim_pending_submissions", make, owner, until_us, lambda r: r.submission_id
        )

    async def _claim(
        self,
        what: str,
        make: Callable[[Dialect], Program[list[R]]],
        owner: str,
        until_us: int,
        queue_key: Callable[[R], str],
    ) -> list[R]:
        """Run the claim ``make`` builds and take over the claimed work's queue tickets
        (``queue_key``: a record's ticket id) in the same transaction; the claimed records."""

        async def body(conn: Conn, _: int) -> list[R]:
            claimed = await run_program(conn, make(DIALECT))
            await turn_queue.take_over_tickets(
                conn, [queue_key(record) for record in claimed], owner, until_us
            )
            return claimed

        return await self._write(what, body)
