"""The SQLite driver: one process per database file, a writer thread that group-commits the
shared core's writes, a read-only reader connection (docs/architecture.md, the store).

Only what differs from PostgreSQL lives here: the connections, the writer thread, the file
lock and the dialect's few statements; records, row codecs and each write's rules are the
shared core's (``turnwire_server.store``).
"""

from __future__ import annotations

from turnwire_server.store.sqlite.store import SqliteStore

__all__ = ["SqliteStore"]
