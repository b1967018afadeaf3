"""The PostgreSQL store's schema migrations: loading the packaged scripts and applying them.

The schema lives in ``server/turnwire_server/store/migrations/postgres/NNNN_name.sql``,
mirroring the SQLite migrations version for version. :func:`apply_migrations` runs every
pending one in ONE transaction that first takes a transaction-level advisory lock
(``pg_advisory_xact_lock``), so replicas starting together against the same database
serialize: the first applies, the others then find everything recorded in
``schema_migrations`` and apply nothing. A failing migration rolls the whole run back.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import psycopg

from turnwire_server.store.core.migration_rules import newer_schema_problem, packaged_scripts, readable_by
from turnwire_server.store.errors import StoreError

__all__ = ["MIGRATION_LOCK_KEY", "PgMigration", "apply_migrations", "load_migrations"]

_log = logging.getLogger("turnwire_server.store.postgres")

_MIGRATIONS_PACKAGE: Final = "turnwire_server.store.migrations.postgres"

MIGRATION_LOCK_KEY: Final = 0x7475726E_77697265  # "turnwire": the advisory lock of a migration run
"""The ``pg_advisory_xact_lock`` key that serializes migration runs on one database."""


@dataclass(frozen=True, slots=True)
class PgMigration:
    """One schema migration: ``version`` (from 1), ``name`` (file stem) and its SQL script (one
    or more statements, sent as one simple query)."""

    version: int
    name: str
    script: str


@functools.cache
def load_migrations() -> tuple[PgMigration, ...]:
    """The packaged PostgreSQL migrations, in version order (raises as
    :func:`~turnwire_server.store.core.migration_rules.packaged_scripts`)."""
    return tuple(PgMigration(*found) for found in packaged_scripts(_MIGRATIONS_PACKAGE))


async def apply_migrations(
    conn: psycopg.AsyncConnection[tuple[object, ...]],
    migrations: Sequence[PgMigration],
    *,
    where: str,
    now_us: int,
) -> list[str]:
    """Apply the ``migrations`` not yet recorded in ``conn``'s database; returns the names applied
    (in order; [] when the schema was current).

    ``conn`` must be in autocommit mode and outside a transaction. Everything happens in one
    transaction holding ``pg_advisory_xact_lock(MIGRATION_LOCK_KEY)``: creating
    ``schema_migrations`` if missing, the version check and every pending migration.
    ``where`` names the store in messages (``postgres store``: no address, docs/operate/logs.md),
    ``now_us`` is the ``applied_at`` value (µs since the epoch). Raises :class:`StoreError` when
    the database's schema is newer than the newest of ``migrations`` (nothing is changed) and
    :class:`psycopg.Error` when a statement fails (the whole run is rolled back).
    """
    known = migrations[-1].version if migrations else 0
    applied: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)"
        )
        await conn.execute("ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS readable_by INTEGER")
        cur = await conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
        row = await cur.fetchone()
        newest = int(row[0]) if row is not None else 0  # type: ignore[call-overload]
        if newest > known:
            cur = await conn.execute(
                "SELECT version, readable_by FROM schema_migrations WHERE version > %s", (known,)
            )
            newer = [(int(str(v)), None if r is None else int(str(r))) for v, r in await cur.fetchall()]
            problem = newer_schema_problem(known, newer)
            if problem is not None:
                raise StoreError(f"{where}: {problem}")
            _log.warning("%s: schema %d is newer but readable by this build (%d)", where, newest, known)
        for migration in migrations:
            if migration.version <= newest:
                continue
            await conn.execute(migration.script.encode())  # several statements: a simple query
            await conn.execute(
                "INSERT INTO schema_migrations (version, name, applied_at, readable_by)"
                " VALUES (%s, %s, %s, %s)",
                (migration.version, migration.name, now_us, readable_by(migration.version, migration.script)),
            )
            applied.append(migration.name)
    for name in applied:
        _log.info("%s: applied migration %s", where, name)
    return applied
