"""What each PostgreSQL store write does, in SQL: the same rules as the SQLite writes
(:mod:`~turnwire_server.store.sqlite_writes`, ``sqlite_transcript``, ``sqlite_streams``,
``sqlite_submissions``, ``sqlite_tool_writes``), statement for statement where it can be.

Each function here runs inside ONE transaction the caller opened (``conn.transaction()``) and
raises to roll it back (the domain errors of :mod:`turnwire_server.store.base`, or a
``psycopg`` error). ``now_us`` is the write's time, µs since the epoch.

Concurrency: SQLite applies writes one at a time; here several connections write at once,
so every write that reads and then changes a conversation first takes the conversation's
lock with :func:`lock_conversation` (a transaction-level advisory lock on the id, then
``SELECT … FOR UPDATE`` of its row). Writers of one conversation therefore serialize and
each sees what the previous one committed (READ COMMITTED: every statement reads the latest
commits), which is what makes ``answer_tool_calls`` complete a batch exactly once and keeps
message positions gap-free. :func:`create_submission` serializes on one global advisory lock
(acceptance order ``seq`` is global, as in SQLite).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Collection, Iterable, Mapping, Sequence
from typing import Any, Final, TypeAlias

import psycopg
from google.protobuf.message import DecodeError

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import (
    AddMode,
    AddResult,
    AnsweredToolCalls,
    SubmissionRecord,
    SubmissionState,
    ToolCallAnswer,
    TurnRecord,
)
from turnwire_server.store.errors import (
    ConversationNotFound,
    MessageAlreadyAnswered,
    MessageBeingWritten,
    MessageIdConflict,
    StoreCorrupted,
    SubmissionNotPending,
    TooManySubmissions,
    TurnAlreadyExists,
    TurnNotFound,
    UnknownMessage,
)
from turnwire_server.store.sqlite_rows import (
    MessageRow,
    build_message,
    check_turn,
    conversation_from_row,
    message_insert_params,
    message_row,
    to_us,
)
from turnwire_server.store.sqlite_streams import pack_events
from turnwire_server.store.sqlite_submissions import SUBMISSION_COLUMNS, submission_from_row
from turnwire_server.store.submission_rules import repeated_submission
from turnwire_server.store.tool_answers import answer_calls, close_call, expired_text, is_waiting

__all__ = [
    "CONVERSATION_LOCK_CLASS",
    "LOAD_MESSAGES_SQL",
    "SUBMISSIONS_LOCK_KEY",
    "Conn",
    "add_messages",
    "answer_tool_calls",
    "append_events",
    "create_submission",
    "delete_conversation",
    "end_submission",
    "expire_events",
    "expire_pending_tool_calls",
    "expire_submissions",
    "finish_turn",
    "lock_conversation",
    "messages_from_rows",
    "prepare_add",
    "prepare_turn",
    "save_message",
    "start_new_turn",
    "start_turn",
]

Conn: TypeAlias = "psycopg.AsyncConnection[Any]"
"""A connection of the store's pool (autocommit; writes open their own transaction)."""

CONVERSATION_LOCK_CLASS: Final = 0x7477  # "tw"
"""First key of a conversation's advisory lock; the second is ``hashtext(conversation_id)``."""

SUBMISSIONS_LOCK_KEY: Final = 0x7475726E_73756273  # "turnsubs"
"""The advisory lock key serializing :func:`create_submission` (global acceptance order)."""

QUEUE_LOCK_CLASS: Final = 0x7471  # "tq"
"""First key of the advisory lock serializing the ticket takers of a conversation's turn queue
(second: ``hashtext(conversation_id)``); not the write lock, so taking a ticket never waits for a
commit of the conversation's running turn."""

UNOWNED_LEASE: Final = 1 << 62
"""The lease of the queue ticket of a submission no replica claimed yet: it never lapses, so the
submission keeps its place in line until a replica claims it (and the ticket gets its lease) or
it ends without running (and the ticket goes)."""

_FREE_UNOWNED_TICKETS: Final = (
    "WITH gone AS (DELETE FROM turn_queue WHERE request_id = ANY(%s) AND owner = ''"
    " RETURNING conversation_id) SELECT pg_notify('turnwire_queue', conversation_id) FROM gone"
)
"""Delete the unclaimed tickets of submissions that end without running; wake the line."""

LOAD_MESSAGES_SQL: Final = (
    "SELECT m.id, m.role, m.create_time, m.create_time_nanos, m.metadata, p.data"
    " FROM messages AS m LEFT JOIN parts AS p"
    " ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
    " WHERE m.conversation_id = %s ORDER BY m.seq, p.idx"
)
"""A conversation's messages with their parts, in one statement (one snapshot)."""

_RETRYABLE_STATES: Final = frozenset({"error", "aborted", "interrupted"})
_OPEN: Final = ("pending", "running")
_FROM_TURN: Final[dict[str, str]] = {
    "completed": "completed",
    "error": "error",
    "aborted": "aborted",
    "interrupted": "error",
    "skipped": "skipped",
}


# --------------------------------------------------------------------------- helpers


async def fetch_one(conn: Conn, sql: str, params: Sequence[Any] = ()) -> Any:
    """The first row of ``sql`` (None when there is none)."""
    cur = await conn.execute(sql.encode(), params)
    return await cur.fetchone()


async def _all(conn: Conn, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    cur = await conn.execute(sql.encode(), params)
    return list(await cur.fetchall())


async def run(conn: Conn, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> int:
    """Execute ``sql``; the number of rows it changed."""
    cur = await conn.execute(sql.encode(), params)
    return cur.rowcount


async def _run_many(conn: Conn, sql: str, params: Iterable[Sequence[Any]]) -> None:
    rows = list(params)
    if rows:
        async with conn.cursor() as cur:
            await cur.executemany(sql.encode(), rows)


def messages_from_rows(conversation_id: str, rows: Iterable[Any]) -> list[message_pb2.Message]:
    """The messages of :data:`LOAD_MESSAGES_SQL`'s rows, in order. Raises :class:`StoreCorrupted`
    for a message that cannot be decoded."""
    messages: list[message_pb2.Message] = []
    current: message_pb2.Message | None = None
    try:
        for message_id, role, create_us, create_nanos, metadata, part in rows:
            if current is None or current.id != message_id:
                metadata_bytes = None if metadata is None else bytes(metadata)
                current = build_message(message_id, role, create_us, create_nanos, metadata_bytes)
                messages.append(current)
            if part is not None:
                current.parts.add().MergeFromString(bytes(part))
    except (DecodeError, RecursionError) as exc:
        raise StoreCorrupted(
            f"postgres store: conversation {conversation_id!r} has a message that cannot be decoded: {exc}"
        ) from exc
    return messages


async def lock_conversation(conn: Conn, conversation_id: str) -> bool:
    """Take the conversation's write lock for the rest of the transaction; True when it exists.

    An advisory transaction lock on the id (so writers that create the conversation serialize
    too), then ``SELECT … FOR UPDATE`` of its row.
    """
    await conn.execute(
        b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (CONVERSATION_LOCK_CLASS, conversation_id)
    )
    return (
        await fetch_one(conn, "SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,))
        is not None
    )


_LOCKED: Final[contextvars.ContextVar[frozenset[str]]] = contextvars.ContextVar(
    "turnwire_locked_conversations", default=frozenset()
)
"""Conversations whose locks the running group commit took up front (:func:`conversations_locked`)."""


async def _lock(conn: Conn, conversation_id: str) -> None:
    """:func:`lock_conversation` without waiting for it (in pipeline mode its statements go out
    with the write's next ones), and nothing when the group commit holds the lock already."""
    if conversation_id in _LOCKED.get():
        return
    await conn.execute(
        b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (CONVERSATION_LOCK_CLASS, conversation_id)
    )
    await conn.execute(b"SELECT 1 FROM conversations WHERE id = %s FOR UPDATE", (conversation_id,))


@contextlib.asynccontextmanager
async def conversations_locked(conn: Conn, conversation_ids: Iterable[str]) -> AsyncIterator[None]:
    """Take the write locks of ``conversation_ids`` for the rest of the transaction, in id order
    and two statements for all of them (a group commit's writes would take them one by one);
    the writes run inside the block do not take them again."""
    ordered = sorted(set(conversation_ids))
    await conn.execute(
        b"SELECT pg_advisory_xact_lock(%s, hashtext(c)) FROM unnest(%s::text[]) AS c",
        (CONVERSATION_LOCK_CLASS, ordered),
    )
    await conn.execute(b"SELECT 1 FROM conversations WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (ordered,))
    token = _LOCKED.set(frozenset(ordered))
    try:
        yield
    finally:
        _LOCKED.reset(token)


_INSERT_MESSAGE: Final = (
    "INSERT INTO messages"
    " (conversation_id, id, seq, role, create_time, create_time_nanos, metadata)"
    " VALUES (%s, %s, (SELECT COALESCE(MAX(seq), 0) + 1 FROM messages WHERE conversation_id = %s),"
    " %s, %s, %s, %s)"
)


_PARTS_OF_ROW: Final = (
    # A message's parts from two arrays, one statement however many parts (idx from 0).
    " INSERT INTO parts (conversation_id, message_id, idx, kind, data)"
    " SELECT %(c)s, %(m)s, p.idx - 1, p.kind, p.data"
    " FROM unnest(%(kinds)s::text[], %(datas)s::bytea[]) WITH ORDINALITY AS p(kind, data, idx)"
)


def _parts_params(conversation_id: str, row: MessageRow) -> dict[str, Any]:
    return {
        "c": conversation_id,
        "m": row.id,
        "n": len(row.parts),
        "kinds": [kind for kind, _ in row.parts],
        "datas": [data for _, data in row.parts],
    }


async def _insert_message(conn: Conn, conversation_id: str, row: MessageRow) -> None:
    await run(conn, _INSERT_MESSAGE, message_insert_params(conversation_id, row))
    await run(conn, _PARTS_OF_ROW, _parts_params(conversation_id, row))


async def _put_parts(conn: Conn, conversation_id: str, row: MessageRow) -> None:
    """Make the message's parts exactly ``row.parts``, rewriting only changed ones."""
    await run(
        conn,
        "WITH gone AS (DELETE FROM parts"
        " WHERE conversation_id = %(c)s AND message_id = %(m)s AND idx >= %(n)s)"
        + _PARTS_OF_ROW
        + " ON CONFLICT (conversation_id, message_id, idx) DO UPDATE"
        " SET kind = excluded.kind, data = excluded.data"
        " WHERE parts.data IS DISTINCT FROM excluded.data",
        _parts_params(conversation_id, row),
    )


async def _touch_conversation(conn: Conn, conversation_id: str, now_us: int, added: int) -> None:
    """Create the conversation if missing; set its update time and add ``added`` to its count."""
    await run(
        conn,
        "INSERT INTO conversations (id, create_time, update_time, message_count)"
        " VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (id) DO UPDATE SET update_time = excluded.update_time,"
        " message_count = conversations.message_count + excluded.message_count",
        (conversation_id, now_us, now_us, added),
    )


_STORED_ROLE: Final = b"SELECT role FROM messages WHERE conversation_id = %s AND id = %s"


async def _upsert_message(
    conn: Conn, conversation_id: str, row: MessageRow, now_us: int, stored_role: Any = None
) -> None:
    """Insert ``row`` at the end, or replace it in place (same seq) when its id exists; raises
    :class:`MessageIdConflict` when the stored message has another role. Caller holds the
    conversation lock. ``stored_role``: a cursor of :data:`_STORED_ROLE` the caller already
    sent (pipeline mode: read with the caller's other reads in one round trip)."""
    if stored_role is None:
        stored_role = await conn.execute(_STORED_ROLE, (conversation_id, row.id))
    found = await stored_role.fetchone()
    if found is not None and found[0] != row.role:
        raise MessageIdConflict(conversation_id, row.id)
    await _touch_conversation(conn, conversation_id, now_us, 0 if found is not None else 1)
    if found is not None:
        await run(
            conn,
            "UPDATE messages SET role = %s, create_time = %s, create_time_nanos = %s, metadata = %s"
            " WHERE conversation_id = %s AND id = %s",
            (row.role, row.create_time_us, row.create_time_nanos, row.metadata, conversation_id, row.id),
        )
        await _put_parts(conn, conversation_id, row)
    else:
        await _insert_message(conn, conversation_id, row)


async def _turn_recorded(conn: Conn, request_id: str) -> Any:
    """A cursor whose one row says whether turn ``request_id`` is recorded (not yet fetched)."""
    return await conn.execute(b"SELECT EXISTS (SELECT 1 FROM turns WHERE request_id = %s)", (request_id,))


async def _stored_parts(conn: Conn, conversation_id: str, message_id: str) -> list[tuple[str | None, bytes]]:
    rows = await _all(
        conn,
        "SELECT kind, data FROM parts WHERE conversation_id = %s AND message_id = %s ORDER BY idx",
        (conversation_id, message_id),
    )
    return [(kind, bytes(data)) for kind, data in rows]


# --------------------------------------------------------------------------- turns


def prepare_turn(turn: TurnRecord, messages: Sequence[message_pb2.Message]) -> list[MessageRow]:
    """Validate ``start_turn``'s arguments in the caller's task; the message rows to write.

    Raises :class:`ValueError` for an invalid argument or a message without parts, and
    :class:`MessageIdConflict` when an id repeats within ``messages``.
    """
    check_turn(turn)
    rows = [message_row(m) for m in messages]
    seen: set[str] = set()
    for row in rows:
        if not row.parts:
            raise ValueError(f"message {row.id!r} has no parts; such messages are not stored")
        if row.id in seen:
            raise MessageIdConflict(turn.conversation_id, row.id)
        seen.add(row.id)
    to_us(turn.start_time, "start_time")
    if turn.end_time is not None:
        to_us(turn.end_time, "end_time")
    return rows


_START_READS: Final = (
    # The submission and the earlier turn of this request id, locked; then each re-sent message
    # as stored (role, parts in order) and whether a completed reply follows it. One flight.
    "SELECT state FROM submissions WHERE id = %s FOR UPDATE",
    "SELECT state FROM turns WHERE request_id = %s FOR UPDATE",
    "SELECT m.id, m.role,"
    " ARRAY(SELECT p.kind FROM parts AS p"
    "  WHERE p.conversation_id = m.conversation_id AND p.message_id = m.id ORDER BY p.idx),"
    " ARRAY(SELECT p.data FROM parts AS p"
    "  WHERE p.conversation_id = m.conversation_id AND p.message_id = m.id ORDER BY p.idx),"
    " EXISTS (SELECT 1 FROM messages AS later JOIN turns AS t"
    "  ON t.conversation_id = later.conversation_id AND t.assistant_message_id = later.id"
    "  WHERE later.conversation_id = m.conversation_id AND later.seq > m.seq AND t.state = 'completed')"
    " FROM messages AS m WHERE m.conversation_id = %s AND m.id = ANY(%s)",
)


async def start_turn(conn: Conn, turn: TurnRecord, rows: Sequence[MessageRow], now_us: int) -> None:
    """``Store.start_turn``: the rules of :func:`~turnwire_server.store.sqlite_writes.start_turn_write`
    (idempotent input, retry of an ended request id, the submission marked running).

    Meant for pipeline mode (``conn.pipeline()``): its reads go out together and wait for one
    round trip, its writes for none (the caller's commit syncs them).

    Raises :class:`MessageIdConflict`, :class:`MessageAlreadyAnswered`,
    :class:`TurnAlreadyExists`, :class:`SubmissionNotPending`.
    """
    conversation_id = turn.conversation_id
    await _lock(conn, conversation_id)
    submission_sql, turn_sql, messages_sql = _START_READS
    cursors = [
        await conn.execute(submission_sql.encode(), (turn.request_id,)),
        await conn.execute(turn_sql.encode(), (turn.request_id,)),
        await conn.execute(messages_sql.encode(), (conversation_id, [row.id for row in rows])),
    ]
    submission, earlier, stored = [list(await cur.fetchall()) for cur in cursors]
    if submission and submission[0][0] not in _OPEN:
        raise SubmissionNotPending(turn.request_id, submission[0][0])
    stored_by_id = {
        message_id: (role, [(kind, bytes(data)) for kind, data in zip(kinds, datas, strict=True)], answered)
        for message_id, role, kinds, datas, answered in stored
    }
    new_rows = [row for row in rows if not _stored_identically(conversation_id, row, stored_by_id)]
    if earlier:
        if earlier[0][0] not in _RETRYABLE_STATES or new_rows:
            raise TurnAlreadyExists(turn.request_id)
        await run(conn, "DELETE FROM turns WHERE request_id = %s", (turn.request_id,))
    if submission:
        await run(
            conn,
            "UPDATE submissions SET state = 'running', start_time = COALESCE(start_time, %s) WHERE id = %s",
            (now_us, turn.request_id),
        )
    await _touch_conversation(conn, conversation_id, now_us, len(new_rows))
    for row in new_rows:
        await _insert_message(conn, conversation_id, row)
    await _insert_turn(conn, turn)


_SUBMISSION_NOT_PENDING: Final = (
    # Fails the transaction (a cast no text passes) when the turn is a submission that is no
    # longer pending: nothing is written and the caller starts the turn the checking way.
    "SELECT ('turnwire: submission ' || id || ' is ' || state)::int FROM submissions"
    " WHERE id = %s AND state NOT IN ('pending', 'running')"
)


async def start_new_turn(conn: Conn, turn: TurnRecord, rows: Sequence[MessageRow], now_us: int) -> None:
    """``Store.start_turn`` for the common case, without a read to wait for: a new request id
    whose messages are all new. Writes only; meant for pipeline mode (nothing waits for the
    server). The uncommon cases make the transaction fail instead of deciding: a request id
    already recorded or a message id already stored (a retry, a re-sent message) by their
    primary keys (``UniqueViolation``), a submission no longer pending by
    :data:`_SUBMISSION_NOT_PENDING` (``InvalidTextRepresentation``); the caller rolls back
    and runs :func:`start_turn`, which applies their rules."""
    conversation_id = turn.conversation_id
    await _lock(conn, conversation_id)
    await run(conn, _SUBMISSION_NOT_PENDING, (turn.request_id,))
    await run(
        conn,
        "UPDATE submissions SET state = 'running', start_time = COALESCE(start_time, %s) WHERE id = %s",
        (now_us, turn.request_id),
    )
    await _touch_conversation(conn, conversation_id, now_us, len(rows))
    for row in rows:
        await _insert_message(conn, conversation_id, row)
    await _insert_turn(conn, turn)


async def _insert_turn(conn: Conn, turn: TurnRecord) -> None:
    await run(
        conn,
        "INSERT INTO turns (request_id, conversation_id, assistant_message_id,"
        " continuation, model, state, start_time, end_time, error, recovery_count, spec, owner,"
        " lease_until) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            turn.request_id,
            turn.conversation_id,
            turn.assistant_message_id,
            int(turn.continuation),
            turn.model,
            turn.state,
            to_us(turn.start_time, "start_time"),
            None if turn.end_time is None else to_us(turn.end_time, "end_time"),
            turn.error,
            turn.recovery_count,
            turn.spec,
            turn.owner or None,
            None if turn.lease_until is None else to_us(turn.lease_until, "lease_until"),
        ),
    )


def _stored_identically(
    conversation_id: str,
    row: MessageRow,
    stored: Mapping[str, tuple[int, list[tuple[str | None, bytes]], bool]],
) -> bool:
    """Whether ``row`` is stored already with the same role and parts (then it is not written
    again). Raises :class:`MessageIdConflict` when stored otherwise, :class:`MessageAlreadyAnswered`
    when a completed reply follows it."""
    found = stored.get(row.id)
    if found is None:
        return False
    role, parts, answered = found
    if role != row.role or parts != list(row.parts):
        raise MessageIdConflict(conversation_id, row.id)
    if answered:
        raise MessageAlreadyAnswered(conversation_id, row.id)
    return True


async def save_message(
    conn: Conn, conversation_id: str, row: MessageRow, turn_request_id: str, now_us: int
) -> None:
    """``Store.save_message``: upsert ``row`` (it has parts), a no-op when ``turn_request_id``
    names no recorded turn."""
    await _lock(conn, conversation_id)
    recorded = await _turn_recorded(conn, turn_request_id) if turn_request_id else None
    stored_role = await conn.execute(_STORED_ROLE, (conversation_id, row.id))
    if recorded is not None and not (await recorded.fetchone())[0]:
        return
    await _upsert_message(conn, conversation_id, row, now_us, stored_role)


async def finish_turn(conn: Conn, turn: TurnRecord, row: MessageRow | None, now_us: int) -> None:
    """``Store.finish_turn``: upsert ``row`` (when given), end the turn and its submission.

    Raises :class:`TurnNotFound` (writing nothing) when no turn ``turn.request_id`` exists.
    """
    await _lock(conn, turn.conversation_id)
    recorded = await _turn_recorded(conn, turn.request_id)
    stored_role = None if row is None else await conn.execute(_STORED_ROLE, (turn.conversation_id, row.id))
    if not (await recorded.fetchone())[0]:
        raise TurnNotFound(turn.request_id)
    if row is not None:
        await _upsert_message(conn, turn.conversation_id, row, now_us, stored_role)
    await run(
        conn,
        "UPDATE turns SET state = %s, end_time = %s, error = %s, recovery_count = %s WHERE request_id = %s",
        (
            turn.state,
            None if turn.end_time is None else to_us(turn.end_time, "end_time"),
            turn.error,
            turn.recovery_count,
            turn.request_id,
        ),
    )
    state = _FROM_TURN.get(turn.state)
    if state is not None:  # None: still running (a recovery counted), nothing ends
        await run(
            conn,
            "UPDATE submissions SET state = %s, end_time = %s, error = %s"
            " WHERE id = %s AND state = 'running'",
            (state, now_us, turn.error, turn.request_id),
        )


async def roll_back_turn(conn: Conn, turn: TurnRecord, message_ids: Sequence[str], now_us: int) -> None:
    """``Store.roll_back_turn``: remove ``message_ids`` (parts first), end the turn and its
    submission, under the conversation's lock. Raises :class:`TurnNotFound` (writing nothing)."""
    conversation_id = turn.conversation_id
    await lock_conversation(conn, conversation_id)
    recorded = await _turn_recorded(conn, turn.request_id)
    if not (await recorded.fetchone())[0]:
        raise TurnNotFound(turn.request_id)
    ids = list(dict.fromkeys(message_ids))
    await run(
        conn, "DELETE FROM parts WHERE conversation_id = %s AND message_id = ANY(%s)", (conversation_id, ids)
    )
    removed = await run(
        conn, "DELETE FROM messages WHERE conversation_id = %s AND id = ANY(%s)", (conversation_id, ids)
    )
    if removed:
        await run(
            conn,
            "UPDATE conversations SET message_count = message_count - %s, update_time = %s WHERE id = %s",
            (removed, now_us, conversation_id),
        )
    await run(
        conn,
        "UPDATE turns SET state = %s, end_time = %s, error = %s WHERE request_id = %s",
        (
            turn.state,
            None if turn.end_time is None else to_us(turn.end_time, "end_time"),
            turn.error,
            turn.request_id,
        ),
    )
    await run(
        conn,
        "UPDATE submissions SET state = %s, end_time = %s, error = %s WHERE id = %s AND state = 'running'",
        (_FROM_TURN.get(turn.state, "aborted"), now_us, turn.error, turn.request_id),
    )


# --------------------------------------------------------------------------- transcript


def prepare_add(messages: Sequence[message_pb2.Message]) -> list[MessageRow]:
    """Validate ``add_messages``' messages in the caller's task; raises :class:`ValueError` for a
    message without parts, an id repeated, an empty id or an invalid create_time."""
    rows = [message_row(m) for m in messages]
    seen: set[str] = set()
    for row in rows:
        if not row.parts:
            raise ValueError(f"message {row.id!r} has no parts; such messages are not stored")
        if row.id in seen:
            raise ValueError(f"message id {row.id!r} appears twice in one AddMessages request")
        seen.add(row.id)
    return rows


async def add_messages(
    conn: Conn,
    conversation_id: str,
    rows: Sequence[MessageRow],
    *,
    mode: AddMode,
    allow_missing: bool,
    replace_only: Collection[str],
    now_us: int,
) -> AddResult:
    """``Store.add_messages``: the rules of
    :func:`~turnwire_server.store.sqlite_transcript.add_messages_write`."""
    exists = await lock_conversation(conn, conversation_id)
    if not exists and not allow_missing:
        raise ConversationNotFound(conversation_id)
    added: list[MessageRow] = []
    updated: list[MessageRow] = []
    unchanged = 0
    for row in rows:
        found = await fetch_one(
            conn,
            "SELECT role, metadata FROM messages WHERE conversation_id = %s AND id = %s",
            (conversation_id, row.id),
        )
        if found is None:
            if row.id in replace_only:
                raise UnknownMessage(conversation_id, row.id)
            create_us = now_us if row.create_time_us is None else row.create_time_us
            added.append(dataclasses.replace(row, create_time_us=create_us))
            continue
        role, metadata = found
        metadata = None if metadata is None else bytes(metadata)
        same_parts = await _stored_parts(conn, conversation_id, row.id) == list(row.parts)
        if role == row.role and same_parts and (mode == "append" or metadata == row.metadata):
            unchanged += 1
        elif mode == "append" or role != row.role:
            raise MessageIdConflict(conversation_id, row.id)
        else:
            running = await fetch_one(
                conn,
                "SELECT request_id FROM turns WHERE conversation_id = %s AND assistant_message_id = %s"
                " AND state = 'running' LIMIT 1",
                (conversation_id, row.id),
            )
            if running is not None:
                raise MessageBeingWritten(conversation_id, row.id, running[0])
            updated.append(row)
    if added or updated or not exists:
        await _touch_conversation(conn, conversation_id, now_us, len(added))
    for row in added:
        await _insert_message(conn, conversation_id, row)
    for row in updated:
        await run(
            conn,
            "UPDATE messages SET metadata = %s WHERE conversation_id = %s AND id = %s",
            (row.metadata, conversation_id, row.id),
        )
        await _put_parts(conn, conversation_id, row)
    record = await fetch_one(
        conn,
        "SELECT id, create_time, update_time, message_count FROM conversations WHERE id = %s",
        (conversation_id,),
    )
    return AddResult(conversation_from_row(record), len(added), len(updated), unchanged)


_CONVERSATION_TABLES: Final = (
    # Tickets of its pending submissions no replica claimed (the others go with their turns).
    "DELETE FROM turn_queue WHERE conversation_id = %s AND owner = ''",
    "DELETE FROM turn_events WHERE request_id IN"
    " (SELECT request_id FROM turn_streams WHERE conversation_id = %s)",
    "DELETE FROM turn_streams WHERE conversation_id = %s",
    "DELETE FROM submissions WHERE conversation_id = %s",
    "DELETE FROM compactions WHERE conversation_id = %s",
    "DELETE FROM parts WHERE conversation_id = %s",
    "DELETE FROM messages WHERE conversation_id = %s",
    "DELETE FROM turns WHERE conversation_id = %s",
    "DELETE FROM conversations WHERE id = %s",
)


async def delete_conversation(conn: Conn, conversation_id: str) -> bool:
    """``Store.delete_conversation``: every row of the conversation; False when there was none."""
    await lock_conversation(conn, conversation_id)
    removed = 0
    for statement in _CONVERSATION_TABLES:
        removed += await run(conn, statement, (conversation_id,))
    return removed > 0


async def expire_events(conn: Conn, before_us: int, limit: int) -> int:
    """``Store.expire_events``: drop the events of up to ``limit`` streams that ended before
    ``before_us`` and mark them expired; returns how many streams."""
    streams = await _all(
        conn,
        "SELECT request_id FROM turn_streams"
        " WHERE end_time IS NOT NULL AND events_expired = 0 AND end_time < %s"
        " ORDER BY end_time LIMIT %s FOR UPDATE SKIP LOCKED",
        (before_us, limit),
    )
    await _run_many(conn, "DELETE FROM turn_events WHERE request_id = %s", streams)
    await _run_many(conn, "UPDATE turn_streams SET events_expired = 1 WHERE request_id = %s", streams)
    return len(streams)


# --------------------------------------------------------------------------- event streams


async def append_events(
    conn: Conn,
    conversation_id: str,
    request_id: str,
    events: Sequence[tuple[int, bytes]],
    *,
    ended: bool,
    now_us: int,
) -> None:
    """``Store.append_events``: the rules of
    :func:`~turnwire_server.store.sqlite_streams.append_events_write` (arguments checked by the
    caller). Nothing is written when no turn ``request_id`` is recorded."""
    numbers = [number for number, _ in events]
    await _lock(conn, conversation_id)
    recorded = await _turn_recorded(conn, request_id)
    stream = await conn.execute(
        b"SELECT end_time FROM turn_streams WHERE request_id = %s FOR UPDATE", (request_id,)
    )
    if not (await recorded.fetchone())[0]:
        return
    found = await stream.fetchone()
    if found is not None and found[0] is not None and numbers and numbers[0] == 1:
        await run(conn, "DELETE FROM turn_streams WHERE request_id = %s", (request_id,))
    last = numbers[-1] if numbers else 0
    # The stream created or moved on, and readers following this turn from another replica woken
    # (delivered at commit), in one statement.
    await run(
        conn,
        "WITH stream AS (INSERT INTO turn_streams"
        " (request_id, conversation_id, last_sequence_number, create_time, end_time)"
        " VALUES (%(r)s, %(c)s, %(last)s, %(now)s, CASE WHEN %(ended)s THEN %(now)s END)"
        " ON CONFLICT (request_id) DO UPDATE"
        " SET last_sequence_number"
        " = GREATEST(turn_streams.last_sequence_number, excluded.last_sequence_number),"
        " end_time = COALESCE(excluded.end_time, turn_streams.end_time))"
        " SELECT pg_notify('turnwire_events', %(r)s)",
        {"r": request_id, "c": conversation_id, "last": last, "now": now_us, "ended": ended},
    )
    if events:
        # A batch retried after a failed commit starts at the same number: replace it.
        await run(
            conn,
            "INSERT INTO turn_events (request_id, first_sequence_number, last_sequence_number, data)"
            " VALUES (%s, %s, %s, %s) ON CONFLICT (request_id, first_sequence_number) DO UPDATE"
            " SET last_sequence_number = excluded.last_sequence_number, data = excluded.data",
            (request_id, numbers[0], last, pack_events(events)),
        )


# --------------------------------------------------------------------------- submissions


async def _select_submission(conn: Conn, where: str, params: Sequence[Any]) -> SubmissionRecord | None:
    row = await fetch_one(conn, f"SELECT {SUBMISSION_COLUMNS} FROM submissions WHERE {where}", params)
    return None if row is None else submission_from_row(row)


async def create_submission(
    conn: Conn, submission: SubmissionRecord, max_open: int
) -> tuple[SubmissionRecord, bool]:
    """``Store.create_submission``: the idempotency rules of
    :func:`~turnwire_server.store.sqlite_submissions.create_submission_write`, under the global
    submissions lock (so concurrent duplicates create one and ``seq`` follows acceptance).

    Raises :class:`SubmissionConflict`, :class:`TooManySubmissions`.
    """
    create_us = to_us(submission.create_time, "create_time")
    await conn.execute(b"SELECT pg_advisory_xact_lock(%s)", (SUBMISSIONS_LOCK_KEY,))
    by_id = await _select_submission(conn, "id = %s", (submission.submission_id,))
    by_key = (
        await _select_submission(
            conn,
            "conversation_id = %s AND idempotency_key = %s",
            (submission.conversation_id, submission.idempotency_key),
        )
        if submission.idempotency_key
        else None
    )
    existing = repeated_submission(submission, by_id, by_key)
    if existing is not None:
        return existing, False
    waiting = await fetch_one(
        conn,
        "SELECT COUNT(*) FROM submissions WHERE conversation_id = %s AND state IN ('pending', 'running')",
        (submission.conversation_id,),
    )
    if waiting[0] >= max_open:
        raise TooManySubmissions(submission.conversation_id, max_open)
    seq = (await fetch_one(conn, "SELECT COALESCE(MAX(seq), 0) + 1 FROM submissions"))[0]
    await run(
        conn,
        "INSERT INTO submissions (id, conversation_id, idempotency_key, state, request, seq, create_time,"
        " owner, lease_until) VALUES (%s, %s, %s, 'pending', %s, %s, %s, %s, %s)",
        (
            submission.submission_id,
            submission.conversation_id,
            submission.idempotency_key or None,
            submission.request,
            seq,
            create_us,
            submission.owner or None,
            None if submission.lease_until is None else to_us(submission.lease_until, "lease_until"),
        ),
    )
    # Its place in the conversation's turn queue, taken now: first in, first out by acceptance
    # whichever replica later runs it (that one's turn lock takes this ticket over). A place
    # reserved for it already (Store.reserve_place: a REJECT submission) is kept, with its owner.
    await conn.execute(
        b"SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (QUEUE_LOCK_CLASS, submission.conversation_id)
    )
    await run(
        conn,
        "WITH old AS (UPDATE turn_queue SET owner = %(o)s, lease_until = %(l)s"
        " WHERE conversation_id = %(c)s AND request_id = %(r)s RETURNING 1)"
        " INSERT INTO turn_queue (conversation_id, request_id, owner, lease_until)"
        " SELECT %(c)s, %(r)s, %(o)s, %(l)s WHERE NOT EXISTS (SELECT 1 FROM old)",
        {
            "c": submission.conversation_id,
            "r": submission.submission_id,
            "o": submission.owner,
            "l": UNOWNED_LEASE
            if submission.lease_until is None
            else to_us(submission.lease_until, "lease_until"),
        },
    )
    if not submission.owner:  # replicas with a free slot claim it (delivered at commit)
        await run(conn, "SELECT pg_notify('turnwire_submissions', '')")
    stored = await _select_submission(conn, "id = %s", (submission.submission_id,))
    assert stored is not None
    return stored, True


async def end_submission(
    conn: Conn,
    submission_id: str,
    state: SubmissionState,
    error: bytes | None,
    *,
    only_from: Sequence[str],
    now_us: int,
) -> SubmissionRecord | None:
    """``Store.end_submission``: set the final state when the current one is in ``only_from``;
    the record as stored afterwards."""
    await run(
        conn,
        "UPDATE submissions SET state = %s, end_time = %s, error = %s WHERE id = %s AND state = ANY(%s)",
        (state, now_us, error, submission_id, list(only_from)),
    )
    record = await _select_submission(conn, "id = %s", (submission_id,))
    if record is not None and record.state not in _OPEN:
        await run(conn, _FREE_UNOWNED_TICKETS, ([submission_id],))
    return record


async def expire_submissions(conn: Conn, before_us: int, limit: int, error: bytes, now_us: int) -> list[str]:
    """``Store.expire_submissions``: up to ``limit`` pending submissions accepted before
    ``before_us`` end ``error``; their ids."""
    rows = await _all(
        conn,
        "SELECT id FROM submissions WHERE state = 'pending' AND create_time < %s"
        " ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED",
        (before_us, limit),
    )
    ids = [row[0] for row in rows]
    await _run_many(
        conn,
        "UPDATE submissions SET state = 'error', end_time = %s, error = %s"
        " WHERE id = %s AND state = 'pending'",
        [(now_us, error, submission_id) for submission_id in ids],
    )
    await run(conn, _FREE_UNOWNED_TICKETS, (ids,))
    return ids


# --------------------------------------------------------------------------- tool calls

# A waiting call's serialized Part holds ToolCallPart.state as field 4 (tag byte 0x20) set to 2
# (input-available) or 3 (approval-requested); the SQL filter skips decoding other calls.
_MAYBE_WAITING: Final = (
    "(position('\\x2002'::bytea IN p.data) > 0 OR position('\\x2003'::bytea IN p.data) > 0)"
)


async def answer_tool_calls(
    conn: Conn,
    conversation_id: str,
    answers: Sequence[ToolCallAnswer],
    expired_before: dt.datetime | None,
    now_us: int,
) -> AnsweredToolCalls:
    """``Store.answer_tool_calls``: one read-modify-write under the conversation's lock (its row
    and its messages' rows ``FOR UPDATE``), so of concurrent answers to one message exactly one
    completes it. Raises what :func:`~turnwire_server.store.tool_answers.answer_calls` raises."""
    await lock_conversation(conn, conversation_id)
    await run(conn, "SELECT 1 FROM messages WHERE conversation_id = %s FOR UPDATE", (conversation_id,))
    messages = messages_from_rows(conversation_id, await _all(conn, LOAD_MESSAGES_SQL, (conversation_id,)))
    message, outcome = answer_calls(conversation_id, messages, answers, expired_before=expired_before)
    await _upsert_message(conn, conversation_id, message_row(message), now_us)
    return outcome


async def expire_pending_tool_calls(conn: Conn, cutoff_us: int, now_us: int) -> int:
    """``Store.expire_pending_tool_calls``: close every waiting call of an assistant message created
    before ``cutoff_us``; returns how many. Locks the conversations in id order."""
    rows = await _all(
        conn,
        "SELECT DISTINCT m.conversation_id, m.id FROM messages AS m JOIN parts AS p"
        " ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
        " WHERE m.role = %s AND m.create_time < %s AND p.kind = 'tool_call' AND " + _MAYBE_WAITING,
        (message_pb2.ROLE_ASSISTANT, cutoff_us),
    )
    text = expired_text()
    expired = 0
    locked: set[str] = set()
    for conversation_id, message_id in sorted(rows):
        if conversation_id not in locked:
            await lock_conversation(conn, conversation_id)
            locked.add(conversation_id)
        message = await _load_message(conn, conversation_id, message_id)
        if message is None:
            continue  # deleted meanwhile
        changed = False
        for part in message.parts:
            if part.WhichOneof("kind") == "tool_call" and is_waiting(part.tool_call):
                close_call(part.tool_call, text)
                changed = True
                expired += 1
        if changed:
            await _upsert_message(conn, conversation_id, message_row(message), now_us)
    return expired


async def _load_message(conn: Conn, conversation_id: str, message_id: str) -> message_pb2.Message | None:
    row = await fetch_one(
        conn,
        "SELECT role, create_time, create_time_nanos, metadata FROM messages"
        " WHERE conversation_id = %s AND id = %s",
        (conversation_id, message_id),
    )
    if row is None:
        return None
    try:
        message = build_message(message_id, row[0], row[1], row[2], None if row[3] is None else bytes(row[3]))
        for (data,) in await _all(
            conn,
            "SELECT data FROM parts WHERE conversation_id = %s AND message_id = %s ORDER BY idx",
            (conversation_id, message_id),
        ):
            message.parts.add().MergeFromString(bytes(data))
    except (DecodeError, RecursionError) as exc:
        raise StoreCorrupted(f"postgres store: message {message_id!r} cannot be decoded: {exc}") from exc
    return message
