"""``turnwire migrate``: apply a store's pending schema migrations and say which ran.

Stores migrate themselves when they open (``turnwire serve`` does); this command lets a deploy
migrate first, once, before starting replicas.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from turnwire_server.store import Store, StoreError, StoreInUse, open_store

__all__ = ["COPIED_TABLES", "NOT_COPIED", "copy_sqlite_to_postgres", "migrate_store"]


def _sqlite_versions(path: Path) -> set[str]:
    if not path.is_file():
        return set()
    try:
        with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
            return {name for (name,) in conn.execute("SELECT name FROM schema_migrations")}
    except sqlite3.Error:
        return set()  # no schema_migrations yet: a new or empty database


async def migrate_store(url: str, *, pool_size: int = 10, password_env: str | None = None) -> list[str]:
    """Apply the pending migrations of the store ``url`` names; returns their names in order ([]
    when the schema was current).

    PostgreSQL: one transaction under the migration advisory lock (replicas may run this
    together). SQLite: the store opens (which migrates) and closes again; it refuses a file
    another process serves (:class:`~turnwire_server.store.StoreInUse`).

    Raises :class:`ValueError` for a URL :func:`~turnwire_server.store.open_store` refuses and
    :class:`StoreError` when the database cannot be reached, a migration fails or its schema is
    newer than this code knows (messages never hold the password).
    """
    store: Store = open_store(url, pool_size=pool_size, password_env=password_env)
    migrate = getattr(store, "migrate", None)
    if migrate is not None:  # PostgreSQL: migrates on a connection of its own
        try:
            applied: list[str] = await migrate()
            return applied
        finally:
            await store.close()
    path = getattr(store, "path", None)
    if not isinstance(path, Path):
        raise StoreError(f"the store {type(store).__name__} cannot be migrated on its own")
    before = _sqlite_versions(path)
    await store.open()
    await store.close()
    return sorted(_sqlite_versions(path) - before)


COPIED_TABLES: tuple[str, ...] = (
    "conversations",
    "fork_ancestors",
    "messages",
    "parts",
    "turns",
    "turn_streams",
    "turn_events",
    "submissions",
    "compactions",
    "budget_spend",
    "budget_reservations",
    "schedules",
    "webhook_deliveries",
    "webhook_attempts",
)
"""What ``turnwire migrate --from … --to …`` copies, parents first (foreign keys): every table
of the schema but two. Budgets too, so what was spent is not forgotten by a move
(docs/cost.md, "Budgets"); schedules, so they go on firing from the new store; webhook
deliveries and their attempts, so a pending call is still made and the record of past ones
stays. Not copied: ``schema_migrations`` (each store has its own) and ``turn_queue`` (live
tickets of running processes; there are none once the source is stopped)."""

NOT_COPIED: tuple[str, ...] = ("schema_migrations", "turn_queue")
"""The tables of the schema :data:`COPIED_TABLES` leaves out, on purpose (see there)."""

_USED_WHEN_HOLDING: tuple[str, ...] = ("conversations", "submissions", "schedules")
"""A target holding rows in any of these is in use: the copy refuses it."""


async def copy_sqlite_to_postgres(
    source: str, target: str, *, password_env: str | None = None
) -> dict[str, int]:
    """Copy everything an SQLite store holds into an empty PostgreSQL store; returns the rows
    copied per table.

    Both are migrated to the current schema first (the SQLite file through its store, which
    also proves no other process serves it). The copy is one PostgreSQL transaction (``COPY``
    per table): it lands whole or not at all. Raises :class:`StoreError` when the target
    already holds conversations, submissions or schedules, either store fails, or a table's columns differ
    (a schema this build does not know); :class:`ValueError` for URLs of other kinds.
    """
    import psycopg

    from turnwire_server.store.postgres import PostgresStore
    from turnwire_server.store.sqlite import SqliteStore

    sqlite_store = open_store(source)
    postgres_store = open_store(target, password_env=password_env)
    if not isinstance(sqlite_store, SqliteStore) or not isinstance(postgres_store, PostgresStore):
        raise ValueError("copying goes from an sqlite:/// store to a postgresql:// store")
    if not sqlite_store.path.is_file():
        raise StoreError(f"there is no SQLite store at {sqlite_store.path}: check the --from path")
    try:
        await sqlite_store.open()  # migrates it, and fails when another process serves the file
    except StoreInUse:
        raise StoreError(
            f"the SQLite store {sqlite_store.path} is in use by a running sidecar: stop it before copying"
        ) from None
    await sqlite_store.close()
    await postgres_store.migrate()
    target_info = postgres_store.connection_info()
    copied: dict[str, int] = {}
    try:
        source_db = closing(sqlite3.connect(f"file:{sqlite_store.path}?mode=ro", uri=True))
        connection = await psycopg.AsyncConnection.connect(*target_info[0], **target_info[1])
        with source_db as db:
            async with connection as conn, conn.transaction():
                for table in _USED_WHEN_HOLDING:
                    cur = await conn.execute(f"SELECT 1 FROM {table} LIMIT 1".encode())
                    if await cur.fetchone() is not None:
                        raise StoreError(
                            f"the target {postgres_store.display_url} already holds {table}: copy into "
                            "an empty database (a fresh one, migrated or not)"
                        )
                for table in COPIED_TABLES:
                    copied[table] = await _copy_table(db, conn, table)
    except (sqlite3.Error, psycopg.Error) as error:
        raise StoreError(
            postgres_store.redact(f"copying into {postgres_store.display_url} failed: {error}")
        ) from None
    return copied


async def _copy_table(source: sqlite3.Connection, target: object, table: str) -> int:
    """``COPY`` every row of ``table`` from ``source`` into ``target``; the rows copied."""
    import psycopg

    assert isinstance(target, psycopg.AsyncConnection)
    columns = [row[1] for row in source.execute(f"PRAGMA table_info({table})")]
    cur = await target.execute(
        b"SELECT column_name FROM information_schema.columns"
        b" WHERE table_name = %s AND table_schema = current_schema()",
        (table,),
    )
    target_columns = {row[0] for row in await cur.fetchall()}
    if set(columns) - target_columns:
        raise StoreError(
            f"table {table}: the target has no column(s) {sorted(set(columns) - target_columns)}"
        )
    names = ", ".join(columns)
    count = 0
    async with target.cursor() as cursor, cursor.copy(f"COPY {table} ({names}) FROM STDIN".encode()) as copy:
        for row in source.execute(f"SELECT {names} FROM {table}"):
            await copy.write_row(row)
            count += 1
    return count
