"""The PostgreSQL driver: a pool of psycopg 3 async connections, pipelined transactions, the
cross-replica turn queue, leases, ``LISTEN``/``NOTIFY`` and the cancel relay
(docs/architecture.md, the store).

Only what differs from SQLite lives here; records, row codecs and each write's rules are the
shared core's (``turnwire_server.store``).
"""

from __future__ import annotations

from turnwire_server.store.postgres.store import DEFAULT_POOL_SIZE, PostgresStore
from turnwire_server.store.postgres.turn_queue import QUEUE_STEP

__all__ = ["DEFAULT_POOL_SIZE", "QUEUE_STEP", "PostgresStore"]
