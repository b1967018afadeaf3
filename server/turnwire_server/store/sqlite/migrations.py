"""The SQLite store's schema migrations: loading the packaged scripts and applying them.

The schema lives in ``server/store/migrations/sqlite/NNNN_name.sql``. Pending
migrations run when the store opens, each in its own transaction, and are
recorded in ``schema_migrations``.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from turnwire_server.store.core.migration_rules import newer_schema_problem, packaged_scripts, readable_by
from turnwire_server.store.errors import StoreError
from turnwire_server.store.sqlite.db import DB_ERRORS, store_error

__all__ = ["Migration", "apply_migrations", "load_migrations"]

_log = logging.getLogger("turnwire_server.store.sqlite")

_MIGRATIONS_PACKAGE: Final = "turnwire_server.store.migrations.sqlite"


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema migration: ``version`` (from 1), ``name`` (file stem), its statements, and the
    oldest schema version whose code may run on it (:mod:`turnwire_server.store.core.migration_rules`)."""

    version: int
    name: str
    statements: tuple[str, ...]
    readable_by: int


def _split_statements(script: str, name: str) -> tuple[str, ...]:
    """Split a migration script into statements (one or more lines each, ``;``-terminated).

    ``sqlite3.complete_statement`` understands quoting and ``CREATE TRIGGER ... END;``,
    so a statement may span lines; two statements must not share a line.
    """
    statements: list[str] = []
    buffer: list[str] = []
    for line in script.splitlines(keepends=True):
        buffer.append(line)
        text = "".join(buffer)
        if sqlite3.complete_statement(text):
            statements.append(text.strip())
            buffer = []
    leftover = [ln for ln in "".join(buffer).splitlines() if ln.strip()]
    if any(not ln.lstrip().startswith("--") for ln in leftover):
        raise StoreError(f"migration {name}: unterminated statement at the end of the file")
    return tuple(statements)


@functools.cache
def load_migrations() -> tuple[Migration, ...]:
    """The packaged SQLite migrations, in version order (raises as
    :func:`~turnwire_server.store.core.migration_rules.packaged_scripts`, and
    :class:`StoreError` for a script whose last statement is unterminated)."""
    return tuple(
        Migration(version, name, _split_statements(script, name), readable_by(version, script))
        for version, name, script in packaged_scripts(_MIGRATIONS_PACKAGE)
    )


def apply_migrations(
    conn: sqlite3.Connection, migrations: Sequence[Migration], path: Path, now_us: Callable[[], int]
) -> None:
    """Apply the ``migrations`` not yet recorded in ``conn``'s database, each in its own transaction.

    ``conn`` must be in autocommit mode (``isolation_level=None``) and outside a
    transaction; blocking, so call it on the thread that owns ``conn``. ``path``
    is for messages only; ``now_us()`` gives ``applied_at`` (µs since the
    epoch). Raises :class:`StoreError` when a migration fails (that migration
    is rolled back; earlier ones stay) or the database's schema is newer than
    the newest of ``migrations``.
    """
    conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
    )
    if "readable_by" not in {row[1] for row in conn.execute("PRAGMA table_info(schema_migrations)")}:
        conn.execute("ALTER TABLE schema_migrations ADD COLUMN readable_by INTEGER")
    known = migrations[-1].version if migrations else 0
    newest = conn.execute("SELECT MAX(version) FROM schema_migrations").fetchone()[0] or 0
    if newest > known:
        newer = conn.execute("SELECT version, readable_by FROM schema_migrations WHERE version > ?", (known,))
        problem = newer_schema_problem(known, [(int(v), r) for v, r in newer])
        if problem is not None:
            raise StoreError(f"sqlite store {path}: {problem}")
    for migration in migrations:
        if migration.version <= newest:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-check under the write lock: another process may have migrated meanwhile.
            done = conn.execute(
                "SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,)
            ).fetchone()
            if done is None:
                for statement in migration.statements:
                    conn.execute(statement)
                conn.execute(
                    "INSERT INTO schema_migrations (version, name, applied_at, readable_by)"
                    " VALUES (?, ?, ?, ?)",
                    (migration.version, migration.name, now_us(), migration.readable_by),
                )
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:
                with suppress(sqlite3.Error):  # the original error is the one to report
                    conn.execute("ROLLBACK")
            if isinstance(exc, DB_ERRORS):
                raise store_error(exc, f"migration {migration.name}") from exc
            raise
        _log.info("sqlite store %s: applied migration %s", path, migration.name)
