"""``turnwire migrate``: apply a store's pending schema migrations and say which ran.

Stores migrate themselves when they open (``turnwire serve`` does); this command lets a deploy
migrate first, once, before starting replicas.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from turnwire_server.store import Store, StoreError, open_store

__all__ = ["migrate_store"]


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
