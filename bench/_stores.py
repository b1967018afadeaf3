"""What the store benches share (``fencing_cost.py``, ``budget_cost.py``): both stores opened side
by side, and the PostgreSQL server's CPU spent for a database (the backends' own time, which the
client's CPU does not show)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import psycopg
from support.stores import postgres_database

from turnwire_server.store.postgres import PostgresStore
from turnwire_server.store.sqlite import SqliteStore

_TICKS = os.sysconf("SC_CLK_TCK")


@asynccontextmanager
async def both_stores() -> AsyncIterator[tuple[SqliteStore, PostgresStore, str]]:
    """An open SQLite store in a temporary directory and an open PostgreSQL store on a fresh
    database of the local server (``support.stores.postgres_database``), with that database's URL;
    both closed (and the database dropped) on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        lite = SqliteStore(Path(tmp) / "bench.db")
        await lite.open()
        try:
            with postgres_database() as url:
                pg = PostgresStore(url)
                await pg.open()
                try:
                    yield lite, pg, url
                finally:
                    await pg.close()
        finally:
            await lite.close()


def backend_cpu_s(url: str) -> float:
    """Seconds of CPU (user + system, from ``/proc``) the PostgreSQL backends serving ``url``'s
    database have used so far; a backend that ended meanwhile is left out."""
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            p for (p,) in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
        ]
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        except (OSError, IndexError):
            pass
    return total / _TICKS
