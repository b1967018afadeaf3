"""The SQLite store backend: one process, WAL mode, group-committed writes.

Two aiosqlite connections to one database file: a writer, owned by a single
writer task that applies queued writes in call order and batches everything
pending into one transaction (group commit), and a read-only reader. In WAL
mode the reader sees only committed data and never waits for the writer.

The schema lives in ``server/store/migrations/sqlite/NNNN_name.sql``; pending
migrations run at :meth:`SqliteStore.open`, each in its own transaction, and
are recorded in ``schema_migrations``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import datetime as dt
import functools
import json
import logging
import re
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AbstractAsyncContextManager, suppress
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Final, get_args

import aiosqlite
from google.protobuf.message import DecodeError

from server.store.base import (
    ConversationRecord,
    InvalidPageToken,
    MessageIdConflict,
    StoreError,
    TurnAlreadyExists,
    TurnRecord,
    TurnState,
)
from server.store.local_lock import LocalTurnLocks
from turnwire.v1 import message_pb2

__all__ = ["Migration", "SqliteStore", "load_migrations"]

_log = logging.getLogger(__name__)

_MIGRATIONS_PACKAGE: Final = "server.store.migrations.sqlite"
_MIGRATION_FILE: Final = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_BUSY_TIMEOUT_MS: Final = 5000
_TURN_STATES: Final[frozenset[str]] = frozenset(get_args(TurnState))
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US: Final = dt.timedelta(microseconds=1)
# google.protobuf.Timestamp's valid range: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
_TS_MIN_SECONDS: Final = -62_135_596_800
_TS_MAX_SECONDS: Final = 253_402_300_799
_TOKEN_ALPHABET: Final = re.compile(r"^[A-Za-z0-9_-]+$")
_TOKEN_VERSION: Final = 1


# --------------------------------------------------------------------------- migrations


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema migration: ``version`` (from 1), ``name`` (file stem) and its statements."""

    version: int
    name: str
    statements: tuple[str, ...]


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
    """The packaged SQLite migrations, in version order.

    Raises :class:`StoreError` when a file name does not match ``NNNN_name.sql``
    or versions are not 1, 2, 3, ... without gaps (a packaging mistake).
    """
    found: list[Migration] = []
    for entry in resources.files(_MIGRATIONS_PACKAGE).iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _MIGRATION_FILE.match(entry.name)
        if match is None:
            raise StoreError(f"migration file {entry.name!r} is not named NNNN_name.sql")
        name = entry.name.removesuffix(".sql")
        statements = _split_statements(entry.read_text(encoding="utf-8"), name)
        found.append(Migration(int(match.group(1)), name, statements))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise StoreError(f"migration versions are not 1..n: {[m.name for m in found]}")
    return tuple(found)


# --------------------------------------------------------------------------- conversions


def _to_us(value: dt.datetime, what: str) -> int:
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return (value - _EPOCH) // _ONE_US


def _from_us(us: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=us)


def _opt_from_us(us: int | None) -> dt.datetime | None:
    return None if us is None else _from_us(us)


@dataclass(frozen=True, slots=True)
class _MessageRow:
    """A message ready to write: validated and serialized in the caller's task."""

    id: str
    role: int
    create_time_us: int | None
    create_time_nanos: int
    metadata: bytes | None
    parts: tuple[tuple[str | None, bytes], ...]  # (oneof name, serialized Part)


def _message_row(message: message_pb2.Message) -> _MessageRow:
    if not message.id:
        raise ValueError("message id must not be empty")
    create_us: int | None = None
    create_nanos = 0
    if message.HasField("create_time"):
        ts = message.create_time
        if not (0 <= ts.nanos < 1_000_000_000 and _TS_MIN_SECONDS <= ts.seconds <= _TS_MAX_SECONDS):
            raise ValueError(f"message {message.id!r}: create_time is not a valid Timestamp")
        create_us = ts.seconds * 1_000_000 + ts.nanos // 1000
        create_nanos = ts.nanos % 1000
    metadata = (
        message.metadata.SerializeToString(deterministic=True) if message.HasField("metadata") else None
    )
    # Deterministic bytes, so an unchanged part compares equal and is not rewritten.
    parts = tuple(
        (part.WhichOneof("kind"), part.SerializeToString(deterministic=True)) for part in message.parts
    )
    return _MessageRow(message.id, int(message.role), create_us, create_nanos, metadata, parts)


def _build_message(
    message_id: str, role: int, create_us: int | None, create_nanos: int, metadata: bytes | None
) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.Role.ValueType(role))
    if create_us is not None:
        seconds, micros = divmod(create_us, 1_000_000)
        message.create_time.SetInParent()
        message.create_time.seconds = seconds
        message.create_time.nanos = micros * 1000 + create_nanos
    if metadata is not None:
        message.metadata.SetInParent()
        message.metadata.MergeFromString(metadata)
    return message


def _check_turn(turn: TurnRecord) -> None:
    if turn.state not in _TURN_STATES:
        raise ValueError(f"turn {turn.request_id!r}: unknown state {turn.state!r}")


def _turn_from_row(row: Any) -> TurnRecord:
    state = row[5]
    if state not in _TURN_STATES:
        raise StoreError(f"turn {row[0]!r} has unknown state {state!r} in the database")
    return TurnRecord(
        request_id=row[0],
        conversation_id=row[1],
        assistant_message_id=row[2],
        continuation=bool(row[3]),
        model=row[4],
        state=state,
        start_time=_from_us(row[6]),
        end_time=_opt_from_us(row[7]),
        error=row[8],
        recovery_count=row[9],
    )


def _conversation_from_row(row: Any) -> ConversationRecord:
    return ConversationRecord(
        conversation_id=row[0],
        create_time=_from_us(row[1]),
        update_time=_from_us(row[2]),
        message_count=row[3],
    )


def _encode_page_token(update_us: int, conversation_id: str) -> str:
    payload = json.dumps({"v": _TOKEN_VERSION, "u": update_us, "id": conversation_id}, separators=(",", ":"))
    return base64.urlsafe_b64encode(payload.encode()).decode("ascii").rstrip("=")


def _decode_page_token(token: str) -> tuple[int, str]:
    invalid = InvalidPageToken(f"invalid page token {token[:64]!r}")
    if not _TOKEN_ALPHABET.match(token):
        raise invalid
    try:
        payload = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
    except (ValueError, binascii.Error) as exc:  # JSON and UTF-8 errors are ValueErrors
        raise invalid from exc
    if not isinstance(payload, dict) or payload.get("v") != _TOKEN_VERSION:
        raise invalid
    update_us, conversation_id = payload.get("u"), payload.get("id")
    if type(update_us) is not int or type(conversation_id) is not str:
        raise invalid
    return update_us, conversation_id


def _store_error(exc: BaseException, what: str) -> StoreError:
    """``exc`` as a :class:`StoreError` saying what failed (``exc`` itself when it is one)."""
    if isinstance(exc, StoreError):
        return exc
    code = getattr(exc, "sqlite_errorname", None)
    detail = f"{code}: {exc}" if code else str(exc) or type(exc).__name__
    err = StoreError(f"sqlite store: {what} failed: {detail}")
    err.__cause__ = exc
    return err


# Errors of the database layer; aiosqlite raises ValueError on a closed connection.
_DB_ERRORS: Final = (sqlite3.Error, ValueError, OSError)


# --------------------------------------------------------------------------- writes

_WriteFn = Callable[[aiosqlite.Connection, int], Awaitable[None]]


@dataclass(slots=True)
class _Write:
    apply: _WriteFn  # runs inside the batch transaction; gets the write's time (µs)
    future: asyncio.Future[None]
    what: str  # for error messages
    urgent: bool  # a caller waits on durability: do not hold the batch open for more


async def _put_parts(db: aiosqlite.Connection, conversation_id: str, row: _MessageRow) -> None:
    """Make the message's parts exactly ``row.parts``, rewriting only changed ones."""
    await db.executemany(
        "INSERT INTO parts (conversation_id, message_id, idx, kind, data) VALUES (?, ?, ?, ?, ?)"
        " ON CONFLICT (conversation_id, message_id, idx) DO UPDATE"
        " SET kind = excluded.kind, data = excluded.data"
        " WHERE parts.data IS NOT excluded.data",
        [(conversation_id, row.id, idx, kind, data) for idx, (kind, data) in enumerate(row.parts)],
    )
    await db.execute(
        "DELETE FROM parts WHERE conversation_id = ? AND message_id = ? AND idx >= ?",
        (conversation_id, row.id, len(row.parts)),
    )


async def _touch_conversation(
    db: aiosqlite.Connection, conversation_id: str, now_us: int, added: int
) -> None:
    await db.execute(
        "INSERT INTO conversations (id, create_time, update_time, message_count)"
        " VALUES (?, ?, ?, ?)"
        " ON CONFLICT (id) DO UPDATE SET update_time = excluded.update_time,"
        " message_count = message_count + excluded.message_count",
        (conversation_id, now_us, now_us, added),
    )


_INSERT_MESSAGE: Final = (
    "INSERT INTO messages"
    " (conversation_id, id, seq, role, create_time, create_time_nanos, metadata)"
    " VALUES (?, ?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE conversation_id = ?),"
    " ?, ?, ?, ?)"
)


def _insert_params(conversation_id: str, row: _MessageRow) -> tuple[Any, ...]:
    return (
        conversation_id,
        row.id,
        conversation_id,
        row.role,
        row.create_time_us,
        row.create_time_nanos,
        row.metadata,
    )


async def _upsert_message(
    db: aiosqlite.Connection, conversation_id: str, row: _MessageRow, now_us: int
) -> None:
    """Insert ``row`` at the end, or replace it in place (same seq) when its id exists."""
    existing = await db.execute_fetchall(
        "SELECT 1 FROM messages WHERE conversation_id = ? AND id = ?", (conversation_id, row.id)
    )
    exists = bool(list(existing))
    await _touch_conversation(db, conversation_id, now_us, 0 if exists else 1)
    if exists:
        await db.execute(
            "UPDATE messages SET role = ?, create_time = ?, create_time_nanos = ?, metadata = ?"
            " WHERE conversation_id = ? AND id = ?",
            (
                row.role,
                row.create_time_us,
                row.create_time_nanos,
                row.metadata,
                conversation_id,
                row.id,
            ),
        )
    else:
        await db.execute(_INSERT_MESSAGE, _insert_params(conversation_id, row))
    await _put_parts(db, conversation_id, row)


class SqliteStore:
    """:class:`~server.store.base.Store` on one SQLite database file, for one process.

    ``path`` is the database file; missing parent directories are created at
    :meth:`open`. ``checkpoint_batch_ms`` (milliseconds, >= 0) is how long the
    writer may wait after a :meth:`save_message` to gather more writes into the
    same transaction; :meth:`start_turn` and :meth:`finish_turn` cut the wait
    short. 0 commits as soon as the writer is free (writes that queued while it
    was busy still share one transaction).

    Durability: a write's coroutine returns once its transaction has committed.
    With ``synchronous=NORMAL`` a commit survives a process crash; an OS crash
    or power loss may lose the last commits. A cancelled write call may still
    be applied.

    Methods raise :class:`StoreError` when the database fails or the store is
    not open, and :class:`ValueError` for arguments no backend could store
    (empty message id, naive datetime, invalid Timestamp, unknown turn state).
    All calls must come from the event loop that ran :meth:`open`. Not for
    ``:memory:`` databases: the reader needs to share the writer's file.
    """

    def __init__(self, path: str | Path, *, checkpoint_batch_ms: float = 0) -> None:
        if str(path) in ("", ":memory:") or str(path).startswith("file:"):
            raise ValueError(f"SqliteStore needs a database file path, got {str(path)!r}")
        if checkpoint_batch_ms < 0:
            raise ValueError(f"checkpoint_batch_ms must be >= 0, got {checkpoint_batch_ms}")
        self._path = Path(path)
        self._batch_s = checkpoint_batch_ms / 1000
        self._writer_db: aiosqlite.Connection | None = None
        self._reader_db: aiosqlite.Connection | None = None
        self._writer_task: asyncio.Task[None] | None = None
        self._pending: collections.deque[_Write] = collections.deque()
        self._has_work = asyncio.Event()
        self._urgent = asyncio.Event()
        self._closing = False
        self._last_us = 0
        self._locks = LocalTurnLocks()

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    # ------------------------------------------------------------------ lifecycle

    async def open(self) -> None:
        """Connect, enable WAL, run pending migrations and start the writer task.

        Raises :class:`StoreError` when the file cannot be opened, a migration
        fails, or the database's schema is newer than this code knows. A no-op
        when already open; a closed store cannot be reopened (make a new one).
        """
        if self._writer_db is not None:
            return
        if self._closing:
            raise StoreError("sqlite store: closed; create a new SqliteStore to reopen")
        migrations = load_migrations()
        writer: aiosqlite.Connection | None = None
        reader: aiosqlite.Connection | None = None
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            writer = await aiosqlite.connect(self._path, isolation_level=None)
            mode = await self._fetch_one(writer, "PRAGMA journal_mode=WAL")
            if mode is None or str(mode[0]).lower() != "wal":
                # Still correct, only slower: readers then wait for the writer.
                _log.warning("sqlite store %s: WAL unavailable, journal_mode=%s", self._path, mode)
            await writer.execute("PRAGMA synchronous=NORMAL")
            await writer.execute("PRAGMA foreign_keys=ON")
            await writer.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            await self._migrate(writer, migrations)
            reader = await aiosqlite.connect(self._path, isolation_level=None)
            await reader.execute(f"PRAGMA busy_timeout={_BUSY_TIMEOUT_MS}")
            await reader.execute("PRAGMA query_only=ON")
        except BaseException as exc:
            for conn in (reader, writer):
                if conn is not None:
                    with suppress(Exception):
                        await conn.close()
            if isinstance(exc, _DB_ERRORS):
                raise _store_error(exc, f"opening {self._path}") from exc
            raise
        self._writer_db, self._reader_db = writer, reader
        self._writer_task = asyncio.create_task(self._run_writer(), name="sqlite-store-writer")

    async def close(self) -> None:
        """Apply every queued write, then close both connections. Idempotent."""
        self._closing = True
        self._has_work.set()
        self._urgent.set()  # end any checkpoint batching wait now
        task, self._writer_task = self._writer_task, None
        if task is not None:
            await task
        conns = (self._reader_db, self._writer_db)
        self._reader_db = self._writer_db = None
        errors: list[BaseException] = []
        for conn in conns:
            if conn is not None:
                try:
                    await conn.close()
                except _DB_ERRORS as exc:
                    errors.append(exc)
        if errors:
            raise _store_error(errors[0], f"closing {self._path}")

    async def _migrate(self, db: aiosqlite.Connection, migrations: Sequence[Migration]) -> None:
        await db.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)"
        )
        known = migrations[-1].version if migrations else 0
        newest_row = await self._fetch_one(db, "SELECT MAX(version) FROM schema_migrations")
        newest = newest_row[0] if newest_row is not None and newest_row[0] is not None else 0
        if newest > known:
            raise StoreError(
                f"sqlite store {self._path}: database schema version {newest} is newer than"
                f" version {known}, the newest this build of turnwire knows; upgrade turnwire"
            )
        for migration in migrations:
            if migration.version <= newest:
                continue
            await db.execute("BEGIN IMMEDIATE")
            try:
                # Re-check under the write lock: another process may have migrated meanwhile.
                done = await self._fetch_one(
                    db, "SELECT 1 FROM schema_migrations WHERE version = ?", (migration.version,)
                )
                if done is None:
                    for statement in migration.statements:
                        await db.execute(statement)
                    await db.execute(
                        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                        (migration.version, migration.name, self._now_us()),
                    )
                await db.execute("COMMIT")
            except BaseException as exc:
                await self._rollback(db)
                if isinstance(exc, _DB_ERRORS):
                    raise _store_error(exc, f"migration {migration.name}") from exc
                raise
            _log.info("sqlite store %s: applied migration %s", self._path, migration.name)

    # ------------------------------------------------------------------ reads

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record (times tz-aware UTC), or ``None`` when it does not exist."""
        rows = await self._read(
            "get_conversation",
            "SELECT id, create_time, update_time, message_count FROM conversations WHERE id = ?",
            (conversation_id,),
        )
        return _conversation_from_row(rows[0]) if rows else None

    async def list_conversations(
        self, page_size: int, page_token: str
    ) -> tuple[list[ConversationRecord], str]:
        """Up to ``page_size`` (>= 1) conversations, most recently updated first.

        Ties on update time are ordered by id, descending. Returns the records
        and the token of the next page ("" on the last page); pass "" for the
        first page. Pagination is by key, so a conversation updated between
        pages moves to the front and is not seen again. Raises
        :class:`InvalidPageToken` for a token this store did not issue and
        :class:`ValueError` when ``page_size`` < 1.
        """
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        columns = "SELECT id, create_time, update_time, message_count FROM conversations"
        order = " ORDER BY update_time DESC, id DESC LIMIT ?"
        if page_token:
            update_us, after_id = _decode_page_token(page_token)
            rows = await self._read(
                "list_conversations",
                columns + " WHERE (update_time, id) < (?, ?)" + order,
                (update_us, after_id, page_size + 1),
            )
        else:
            rows = await self._read("list_conversations", columns + order, (page_size + 1,))
        records = [_conversation_from_row(row) for row in rows[:page_size]]
        next_token = ""
        if len(rows) > page_size:
            last = rows[page_size - 1]
            next_token = _encode_page_token(last[2], last[0])
        return records, next_token

    async def load_messages(self, conversation_id: str) -> list[message_pb2.Message]:
        """All messages of the conversation in append order ([] when none or no conversation)."""
        # One statement, so messages and parts come from one consistent snapshot.
        rows = await self._read(
            "load_messages",
            "SELECT m.id, m.role, m.create_time, m.create_time_nanos, m.metadata, p.data"
            " FROM messages AS m LEFT JOIN parts AS p"
            " ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
            " WHERE m.conversation_id = ? ORDER BY m.seq, p.idx",
            (conversation_id,),
        )
        messages: list[message_pb2.Message] = []
        current: message_pb2.Message | None = None
        try:
            for message_id, role, create_us, create_nanos, metadata, part in rows:
                if current is None or current.id != message_id:
                    current = _build_message(message_id, role, create_us, create_nanos, metadata)
                    messages.append(current)
                if part is not None:
                    current.parts.add().MergeFromString(part)
        except DecodeError as exc:
            raise StoreError(
                f"sqlite store: conversation {conversation_id!r} has a corrupt message: {exc}"
            ) from exc
        return messages

    async def running_turns(self) -> list[TurnRecord]:
        """Turns whose state is ``running``, oldest start first."""
        rows = await self._read(
            "running_turns",
            "SELECT request_id, conversation_id, assistant_message_id, continuation, model,"
            " state, start_time, end_time, error, recovery_count FROM turns"
            " WHERE state = 'running' ORDER BY start_time, request_id",
            (),
        )
        return [_turn_from_row(row) for row in rows]

    # ------------------------------------------------------------------ writes

    async def start_turn(self, turn: TurnRecord, messages: Sequence[message_pb2.Message]) -> None:
        """Durably create the conversation if missing, append ``messages`` and insert ``turn``.

        One transaction, committed when this returns. ``messages`` get the next
        positions in order. Raises :class:`MessageIdConflict` (storing nothing)
        when a message id already exists in ``turn.conversation_id`` or repeats
        within ``messages``; :class:`StoreError` when ``turn.request_id``
        already exists; :class:`ValueError` for a message without parts (never
        stored) or an invalid argument.
        """
        _check_turn(turn)
        conversation_id = turn.conversation_id
        rows = [_message_row(m) for m in messages]
        seen: set[str] = set()
        for row in rows:
            if not row.parts:
                raise ValueError(f"message {row.id!r} has no parts; such messages are not stored")
            if row.id in seen:
                raise MessageIdConflict(conversation_id, row.id)
            seen.add(row.id)
        turn_params = (
            turn.request_id,
            conversation_id,
            turn.assistant_message_id,
            int(turn.continuation),
            turn.model,
            turn.state,
            _to_us(turn.start_time, "start_time"),
            None if turn.end_time is None else _to_us(turn.end_time, "end_time"),
            turn.error,
            turn.recovery_count,
        )

        async def apply(db: aiosqlite.Connection, now_us: int) -> None:
            if rows:
                marks = ", ".join("?" * len(rows))
                taken = {
                    r[0]
                    for r in await db.execute_fetchall(
                        f"SELECT id FROM messages WHERE conversation_id = ? AND id IN ({marks})",
                        (conversation_id, *(row.id for row in rows)),
                    )
                }
                for row in rows:
                    if row.id in taken:
                        raise MessageIdConflict(conversation_id, row.id)
            await _touch_conversation(db, conversation_id, now_us, len(rows))
            if rows:
                await db.executemany(_INSERT_MESSAGE, [_insert_params(conversation_id, row) for row in rows])
                await db.executemany(
                    "INSERT INTO parts (conversation_id, message_id, idx, kind, data) VALUES (?, ?, ?, ?, ?)",
                    [
                        (conversation_id, row.id, idx, kind, data)
                        for row in rows
                        for idx, (kind, data) in enumerate(row.parts)
                    ],
                )
            try:
                await db.execute(
                    "INSERT INTO turns (request_id, conversation_id, assistant_message_id,"
                    " continuation, model, state, start_time, end_time, error, recovery_count)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    turn_params,
                )
            except sqlite3.IntegrityError as exc:
                raise TurnAlreadyExists(turn.request_id) from exc

        await self._submit(apply, f"start_turn({turn.request_id!r})", urgent=True)

    async def save_message(self, conversation_id: str, message: message_pb2.Message) -> None:
        """Insert ``message``, or replace the one with its id in place (same position).

        The checkpoint of a streaming reply: group-committed with other queued
        writes, applied in call order, committed when this returns. Creates the
        conversation if missing and bumps its update time. A message without
        parts is not stored (the call is a no-op). Raises :class:`ValueError`
        for an empty id or invalid create_time.
        """
        row = _message_row(message)
        if not row.parts:
            return

        async def apply(db: aiosqlite.Connection, now_us: int) -> None:
            await _upsert_message(db, conversation_id, row, now_us)

        await self._submit(apply, f"save_message({conversation_id!r}, {row.id!r})", urgent=False)

    async def finish_turn(self, turn: TurnRecord, message: message_pb2.Message | None) -> None:
        """Durably upsert the assistant ``message`` and record ``turn``'s end.

        One transaction, committed when this returns. ``message`` (when given
        and it has parts; a message without parts is never stored) is inserted
        or replaced as by :meth:`save_message`. Updates the turn row's state,
        end_time, error and recovery_count. Raises :class:`StoreError` when no
        turn ``turn.request_id`` exists (nothing is stored then).
        """
        _check_turn(turn)
        row = _message_row(message) if message is not None else None
        if row is not None and not row.parts:
            row = None
        params = (
            turn.state,
            None if turn.end_time is None else _to_us(turn.end_time, "end_time"),
            turn.error,
            turn.recovery_count,
            turn.request_id,
        )

        async def apply(db: aiosqlite.Connection, now_us: int) -> None:
            if row is not None:
                await _upsert_message(db, turn.conversation_id, row, now_us)
            cursor = await db.execute(
                "UPDATE turns SET state = ?, end_time = ?, error = ?, recovery_count = ?"
                " WHERE request_id = ?",
                params,
            )
            if cursor.rowcount != 1:
                raise StoreError(f"no turn {turn.request_id!r} to finish")

        await self._submit(apply, f"finish_turn({turn.request_id!r})", urgent=True)

    def turn_lock(self, conversation_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the conversation's in-process turn lock (FIFO); see :class:`LocalTurnLocks`."""
        return self._locks.hold(conversation_id)

    # ------------------------------------------------------------------ internals

    def _now_us(self) -> int:
        # Strictly increasing within the process, so update order is total.
        now = time.time_ns() // 1000
        self._last_us = now if now > self._last_us else self._last_us + 1
        return self._last_us

    async def _submit(self, apply: _WriteFn, what: str, *, urgent: bool) -> None:
        task = self._writer_task
        if task is None or task.done() or self._closing:
            raise StoreError(f"sqlite store: {what}: store is not open")
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append(_Write(apply, future, what, urgent))
        self._has_work.set()
        if urgent:
            self._urgent.set()
        await future

    async def _run_writer(self) -> None:
        """Apply queued writes in call order, everything pending in one transaction."""
        batch: list[_Write] = []
        try:
            while True:
                if not self._pending:
                    if self._closing:
                        return
                    self._has_work.clear()
                    await self._has_work.wait()
                    continue
                if self._batch_s > 0 and not self._urgent.is_set():
                    with suppress(TimeoutError):
                        await asyncio.wait_for(self._urgent.wait(), self._batch_s)
                batch = list(self._pending)
                self._pending.clear()
                self._urgent.clear()
                await self._apply_batch(batch)
                batch = []
        finally:
            # Empty after a normal close; on cancellation, fail whoever still waits.
            err = StoreError("sqlite store: writer stopped before the write was applied")
            for write in (*batch, *self._pending):
                if not write.future.done():
                    write.future.set_exception(err)
            self._pending.clear()

    async def _apply_batch(self, batch: list[_Write]) -> None:
        db = self._writer_db
        assert db is not None
        outcomes: list[BaseException | None] = []
        try:
            await db.execute("BEGIN IMMEDIATE")
            for write in batch:
                # A savepoint per write: one failing write (an id conflict) leaves the others.
                await db.execute("SAVEPOINT write")
                try:
                    await write.apply(db, self._now_us())
                except Exception as exc:
                    await db.execute("ROLLBACK TO write")
                    outcomes.append(exc)
                else:
                    outcomes.append(None)
                await db.execute("RELEASE write")
            await db.execute("COMMIT")
        except Exception as exc:
            await self._rollback(db)
            what = f"writing {len(batch)} queued write(s) ({batch[0].what}, ...)"
            for write in batch:
                if not write.future.done():
                    write.future.set_exception(_store_error(exc, what))
            return
        for write, outcome in zip(batch, outcomes, strict=True):
            if write.future.done():  # the caller was cancelled; the write still happened
                continue
            if outcome is None:
                write.future.set_result(None)
            elif isinstance(outcome, _DB_ERRORS):
                write.future.set_exception(_store_error(outcome, write.what))
            else:
                write.future.set_exception(outcome)

    @staticmethod
    async def _rollback(db: aiosqlite.Connection) -> None:
        if db.in_transaction:
            with suppress(*_DB_ERRORS):
                await db.execute("ROLLBACK")

    @staticmethod
    async def _fetch_one(db: aiosqlite.Connection, sql: str, params: Iterable[Any] = ()) -> Any | None:
        rows = list(await db.execute_fetchall(sql, params))
        return rows[0] if rows else None

    async def _read(self, what: str, sql: str, params: Iterable[Any]) -> list[Any]:
        db = self._reader_db
        if db is None:
            raise StoreError(f"sqlite store: {what}: store is not open")
        try:
            return list(await db.execute_fetchall(sql, params))
        except _DB_ERRORS as exc:
            raise _store_error(exc, what) from exc
