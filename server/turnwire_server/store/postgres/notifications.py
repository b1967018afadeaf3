"""What PostgreSQL replicas tell each other by ``NOTIFY`` (the listener:
:mod:`turnwire_server.store.postgres.replicas`): cancel requests relayed to whichever replica
runs a turn, submissions offered to replicas with a free slot, and stored events that wake a
reader following a turn another replica runs (docs/semantics.md §5, §7)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from turnwire_server.event_waits import set_within
from turnwire_server.store.postgres import db
from turnwire_server.store.postgres.connection import PostgresConnection
from turnwire_server.store.postgres.db import Conn
from turnwire_server.store.postgres.replicas import CANCEL_CHANNEL, EVENTS_CHANNEL

__all__ = ["Notifications"]


class Notifications(PostgresConnection):
    """The cancel relay and the wake-ups (the contracts: :mod:`turnwire_server.store.replicas`,
    :mod:`~turnwire_server.store.submissions`, :mod:`~turnwire_server.store.streams`)."""

    async def request_cancel(self, request_id: str, *, stop: str = "") -> bool:
        """Notifies every replica (payload: the request id, then a newline and ``stop`` when
        given); True when the turn runs or waits in line on any of them."""
        payload = f"{request_id}\n{stop}" if stop else request_id

        async def body(conn: Conn, _: int) -> bool:
            found = await db.fetch_one(
                conn,
                "SELECT 1 FROM turns WHERE request_id = %s AND state = 'running'"
                " UNION ALL SELECT 1 FROM turn_queue WHERE request_id = %s LIMIT 1",
                (request_id, request_id),
            )
            await db.run(conn, "SELECT pg_notify(%s, %s)", (CANCEL_CHANNEL, payload))
            return found is not None

        return await self._write("request_cancel", body)

    def cancel_requests(self) -> AsyncIterator[tuple[str, str]]:
        return self._listener.cancel_requests()

    async def submission_offers(self) -> AsyncIterator[None]:
        """Several notifications may fold into one wake-up; one also comes after the listener
        reconnected (what was notified meanwhile is missed)."""
        offered = self._listener.offered
        while True:
            await offered.wait()
            offered.clear()
            yield None

    async def wait_for_events(self, request_id: str, after: int, timeout_seconds: float) -> bool:
        """True: this store follows other replicas (woken by their ``NOTIFY`` per stored batch)."""
        with self._listener.waiting(EVENTS_CHANNEL, request_id) as stored:
            stream = await self.get_stream(request_id)
            if stream is not None and (stream.end_time is not None or stream.last_sequence_number > after):
                return True
            await set_within(stored, timeout_seconds)
        return True
