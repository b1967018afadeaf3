"""The store backends the store tests run against: SQLite (a file in ``tmp_path``) and PostgreSQL
(a database of its own, ``tw_test_<random>``, on the server ``TURNWIRE_TEST_POSTGRES_URL`` names,
default ``postgresql://postgres@127.0.0.1:5432/test``; dropped at teardown).

A PostgreSQL server is required: when none is reachable the tests FAIL and say how to get one
(``.ci/run`` starts a throwaway server when nothing listens on 127.0.0.1:5432).
"""

from __future__ import annotations

import datetime as dt
import os
import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

import psycopg
import pytest

from turnwire_server.store import Store, TurnRecord
from turnwire_server.store.postgres import PostgresStore
from turnwire_server.store.sqlite import SqliteStore

POSTGRES_URL_ENV: Final = "TURNWIRE_TEST_POSTGRES_URL"
DEFAULT_POSTGRES_URL: Final = "postgresql://postgres@127.0.0.1:5432/test"
BACKENDS: Final = ("sqlite", "postgres")


def postgres_server_url() -> str:
    """The PostgreSQL server the tests use (a database on it to connect to for admin work)."""
    return os.environ.get(POSTGRES_URL_ENV) or DEFAULT_POSTGRES_URL


def _url_with_dbname(url: str, dbname: str) -> str:
    """``url`` (a postgresql:// URL) naming the database ``dbname`` instead."""
    base, _, query = url.partition("?")
    scheme, _, rest = base.partition("://")
    authority = rest.partition("/")[0]
    return f"{scheme}://{authority}/{dbname}" + (f"?{query}" if query else "")


@contextmanager
def postgres_database() -> Iterator[str]:
    """A fresh, empty database on the test server for the ``with`` body; yields its URL. Dropped
    afterwards (``WITH (FORCE)``: connections a failed test left open are closed).

    Calls ``pytest.fail`` (never skip) when the server cannot be reached.
    """
    server = postgres_server_url()
    name = f"tw_test_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(server, autocommit=True, connect_timeout=5)
    except psycopg.Error as exc:
        pytest.fail(
            f"the PostgreSQL store tests need a PostgreSQL server, and none is reachable at "
            f"{server} ({exc}). Start one (`make test` does when none listens: "
            "tools/with-postgres.sh) or set "
            f"{POSTGRES_URL_ENV}=postgresql://user@host:port/database.",
            pytrace=False,
        )
    try:
        with admin:
            admin.execute(f'CREATE DATABASE "{name}"'.encode())
        yield _url_with_dbname(server, name)
    finally:
        with psycopg.connect(server, autocommit=True, connect_timeout=5) as again:
            again.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'.encode())


class StoreBackend:
    """One backend's database for one test: new stores on it, and direct SQL beside them.

    :meth:`sql` takes SQLite-style ``?`` placeholders on both backends (the two schemas have
    the same tables and columns).
    """

    def __init__(self, name: str, *, path: Path | None = None, url: str | None = None) -> None:
        self.name = name
        self.path = path
        self.url = url
        self._pg: psycopg.Connection[Any] | None = None
        self._stores: list[Store] = []

    def new_store(self, **kwargs: Any) -> Store:
        """A new store (not opened) on this test's database."""
        store: Store
        if self.name == "sqlite":
            assert self.path is not None
            store = SqliteStore(self.path, **kwargs)
        else:
            assert self.url is not None
            store = PostgresStore(self.url, **kwargs)
        self._stores.append(store)
        return store

    def sql(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        """Run one statement directly on the database (committed); the rows it returned."""
        if self.name == "sqlite":
            import sqlite3

            assert self.path is not None
            with sqlite3.connect(self.path) as lite:
                return lite.execute(query, tuple(params)).fetchall()
        conn = self._postgres()
        cur = conn.execute(query.replace("?", "%s").encode(), tuple(params))
        return [tuple(row) for row in cur.fetchall()] if cur.description is not None else []

    def executemany(self, query: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement per parameter row, in one transaction."""
        if self.name == "sqlite":
            import sqlite3

            assert self.path is not None
            with sqlite3.connect(self.path) as lite:
                lite.executemany(query, rows)
            return
        conn = self._postgres()
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(query.replace("?", "%s").encode(), rows)

    def tables(self) -> set[str]:
        """The names of the database's tables."""
        if self.name == "sqlite":
            return {t for (t,) in self.sql("SELECT name FROM sqlite_master WHERE type = 'table'")}
        return {t for (t,) in self.sql("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}

    def _postgres(self) -> psycopg.Connection[Any]:
        if self._pg is None:
            assert self.url is not None
            self._pg = psycopg.connect(self.url, autocommit=True)
        return self._pg

    async def close(self) -> None:
        """Close every store made here and the direct connection."""
        for store in self._stores:
            await store.close()
        if self._pg is not None:
            self._pg.close()
            self._pg = None


def leased_turn(
    request_id: str, conversation_id: str, owner: str, *, start_time: dt.datetime, lease_seconds: float = 30
) -> TurnRecord:
    """A running turn as a replica records it: ``owner`` holds its lease until ``lease_seconds``
    after ``start_time``; its reply's id is ``tw-a-<request_id>``."""
    return TurnRecord(
        request_id=request_id,
        conversation_id=conversation_id,
        assistant_message_id=f"tw-a-{request_id}",
        continuation=False,
        model="scripted:x",
        state="running",
        start_time=start_time,
        owner=owner,
        lease_until=start_time + dt.timedelta(seconds=lease_seconds),
    )
