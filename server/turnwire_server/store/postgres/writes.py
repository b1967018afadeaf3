"""The PostgreSQL store's writes not yet moved into the shared core (``start_turn`` is there:
:mod:`turnwire_server.store.core.turn_writes`): the same rules as the SQLite driver's
(:mod:`turnwire_server.store.sqlite.writes`, ``.transcript``, ``.streams``, ``.submissions``,
``.tool_writes``), statement for statement where it can be.

Each function here runs inside ONE transaction the caller opened (``conn.transaction()``) and
raises to roll it back (the domain errors of :mod:`turnwire_server.store.base`, or a
``psycopg`` error). ``now_us`` is the write's time, µs since the epoch.

Concurrency: SQLite applies writes one at a time; here several connections write at once, so every
write that reads and then changes a conversation first takes the conversation's lock with
:func:`~turnwire_server.store.postgres.db.lock_conversation` (a transaction-level advisory lock on
the id, then ``SELECT … FOR UPDATE`` of its row). Writers of one conversation therefore serialize
and each sees what the previous one committed (READ COMMITTED: every statement reads the latest
commits), which is what makes ``answer_tool_calls`` complete a batch exactly once and keeps message
positions gap-free. :func:`create_submission` serializes on one global advisory lock (acceptance
order ``seq`` is global, as in SQLite).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Collection, Sequence
from typing import Any, Final

from google.protobuf.message import DecodeError

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import (
    AddMode,
    AddResult,
    AnsweredToolCalls,
    SubmissionRecord,
    SubmissionState,
    ToolCallAnswer,
)
from turnwire_server.store.core.message_writes import upsert_message
from turnwire_server.store.core.rows import (
    LOAD_MESSAGES_SQL,
    MessageRow,
    build_message,
    conversation_from_row,
    message_insert_params,
    message_row,
    messages_from_rows,
    to_us,
)
from turnwire_server.store.core.sql import Statement, just
from turnwire_server.store.core.stream_rows import pack_events
from turnwire_server.store.core.submission_rows import SUBMISSION_COLUMNS, submission_from_row
from turnwire_server.store.core.submission_rules import repeated_submission
from turnwire_server.store.core.tool_answers import answer_calls
from turnwire_server.store.core.turn_writes import (
    INSERT_MESSAGE,
    TOUCH_CONVERSATION,
    StartTurn,
    StartTurnPlan,
    start_turn_writes,
)
from turnwire_server.store.errors import (
    ConversationNotFound,
    MessageBeingWritten,
    MessageIdConflict,
    StoreCorrupted,
    TooManySubmissions,
    UnknownMessage,
)
from turnwire_server.store.postgres.db import (
    CONVERSATION_LOCK_CLASS,
    DIALECT,
    Conn,
    all_rows,
    fetch_one,
    lock_conversation,
    native,
    run,
    run_many,
    run_program,
    send_conversation_lock,
)
from turnwire_server.store.waiting_calls import close_call, expired_text, is_waiting

__all__ = [
    "CONVERSATION_LOCK_CLASS",
    "SUBMISSIONS_LOCK_KEY",
    "Conn",
    "add_messages",
    "answer_tool_calls",
    "append_events",
    "create_submission",
    "delete_conversation",
    "end_submission",
    "expire_pending_tool_calls",
    "expire_submissions",
    "lock_conversation",
    "prepare_add",
    "start_new_turn",
]

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

_OPEN: Final = ("pending", "running")


# --------------------------------------------------------------------------- helpers


async def _insert_message(conn: Conn, conversation_id: str, row: MessageRow) -> None:
    inserted = Statement(INSERT_MESSAGE, message_insert_params(conversation_id, row))
    await run_program(conn, just([inserted, *DIALECT.insert_parts(conversation_id, (row,))]))


async def _put_parts(conn: Conn, conversation_id: str, row: MessageRow) -> None:
    """Make the message's parts exactly ``row.parts``, rewriting only changed ones."""
    await run_program(conn, just(DIALECT.replace_parts(conversation_id, row)))


async def _touch_conversation(conn: Conn, conversation_id: str, now_us: int, added: int) -> None:
    """Create the conversation if missing; set its update time and add ``added`` to its count."""
    await run(conn, native(TOUCH_CONVERSATION), (conversation_id, now_us, now_us, added))


async def _upsert_message(conn: Conn, conversation_id: str, row: MessageRow, now_us: int) -> None:
    """The shared :func:`~turnwire_server.store.core.message_writes.upsert_message`; the caller holds
    the conversation lock."""
    await run_program(conn, upsert_message(conversation_id, row, DIALECT, now_us))


async def _turn_recorded(conn: Conn, request_id: str) -> Any:
    """A cursor whose one row says whether turn ``request_id`` is recorded (not yet fetched)."""
    return await conn.execute(b"SELECT EXISTS (SELECT 1 FROM turns WHERE request_id = %s)", (request_id,))


async def _stored_parts(conn: Conn, conversation_id: str, message_id: str) -> list[tuple[str | None, bytes]]:
    rows = await all_rows(
        conn,
        "SELECT kind, data FROM parts WHERE conversation_id = %s AND message_id = %s ORDER BY idx",
        (conversation_id, message_id),
    )
    return [(kind, bytes(data)) for kind, data in rows]


# --------------------------------------------------------------------------- turns


_SUBMISSION_NOT_PENDING: Final = (
    # Fails the transaction (a cast no text passes) when the turn is a submission that is no
    # longer pending: nothing is written and the caller starts the turn the checking way.
    "SELECT ('turnwire: submission ' || id || ' is ' || state)::int FROM submissions"
    " WHERE id = %s AND state NOT IN ('pending', 'running')"
)


async def start_new_turn(conn: Conn, start: StartTurn, now_us: int) -> None:
    """``Store.start_turn`` for the common case, without a read to wait for: a new request id
    whose messages are all new, so the plan is known before anything is read (the shared
    :func:`~turnwire_server.store.core.turn_writes.start_turn_writes`). Writes only; meant for
    pipeline mode (nothing waits for the server). The uncommon cases make the transaction fail
    instead of deciding: a request id already recorded or a message id already stored (a
    retry, a re-sent message) by their primary keys (``UniqueViolation``), a submission no
    longer pending by :data:`_SUBMISSION_NOT_PENDING` (``InvalidTextRepresentation``); the
    caller rolls back and runs the shared :func:`~turnwire_server.store.core.turn_writes.start_turn`,
    which applies their rules."""
    await send_conversation_lock(conn, start.turn.conversation_id)
    await run(conn, _SUBMISSION_NOT_PENDING, (start.turn.request_id,))
    plan = StartTurnPlan(new_rows=start.rows, replace_earlier=False, submission_running=True)
    await run_program(conn, just(start_turn_writes(start, plan, DIALECT, now_us)))


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
    :func:`~turnwire_server.store.sqlite.transcript.add_messages_write`."""
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
    :func:`~turnwire_server.store.sqlite.streams.append_events_write` (arguments checked by the
    caller). Nothing is written when no turn ``request_id`` is recorded."""
    numbers = [number for number, _ in events]
    await send_conversation_lock(conn, conversation_id)
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
    :func:`~turnwire_server.store.sqlite.submissions.create_submission_write`, under the global
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
    rows = await all_rows(
        conn,
        "SELECT id FROM submissions WHERE state = 'pending' AND create_time < %s"
        " ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED",
        (before_us, limit),
    )
    ids = [row[0] for row in rows]
    await run_many(
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
    completes it. Raises what :func:`~turnwire_server.store.core.tool_answers.answer_calls` raises."""
    await lock_conversation(conn, conversation_id)
    await run(conn, "SELECT 1 FROM messages WHERE conversation_id = %s FOR UPDATE", (conversation_id,))
    loaded = await all_rows(conn, native(LOAD_MESSAGES_SQL), (conversation_id,))
    messages = messages_from_rows(conversation_id, loaded, "postgres")
    message, outcome = answer_calls(conversation_id, messages, answers, expired_before=expired_before)
    await _upsert_message(conn, conversation_id, message_row(message), now_us)
    return outcome


async def expire_pending_tool_calls(conn: Conn, cutoff_us: int, now_us: int) -> int:
    """``Store.expire_pending_tool_calls``: close every waiting call of an assistant message created
    before ``cutoff_us``; returns how many. Locks the conversations in id order."""
    rows = await all_rows(
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
        for (data,) in await all_rows(
            conn,
            "SELECT data FROM parts WHERE conversation_id = %s AND message_id = %s ORDER BY idx",
            (conversation_id, message_id),
        ):
            message.parts.add().MergeFromString(bytes(data))
    except (DecodeError, RecursionError) as exc:
        raise StoreCorrupted(f"postgres store: message {message_id!r} cannot be decoded: {exc}") from exc
    return message
