"""The writes that edit a transcript outside a turn, once for both drivers (core programs,
:mod:`turnwire_server.store.core.sql`): ``Store.add_messages``, ``Store.delete_conversation``,
``Store.answer_tool_calls`` and ``Store.expire_pending_tool_calls``.

Rules: docs/semantics.md §1 (AddMessages), §6 and §12 (tool calls that wait for the client,
deleting). Every write that reads and then changes a conversation takes its lock first (the
dialect's ``lock_conversation``: nothing on SQLite, whose writer applies writes one at a time),
so of concurrent answers to one message exactly one completes it, and message positions stay
gap-free.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence
from typing import Any, Final

from google.protobuf.message import DecodeError

from turnwire_client.v1 import message_pb2
from turnwire_server.store.core.budget_writes import conversation_deleted
from turnwire_server.store.core.fork_rules import (
    CHILDREN_SQL,
    DESCENDANTS_SQL,
    children_read,
    claim_reads,
    push_writes,
)
from turnwire_server.store.core.fork_writes import release_forks
from turnwire_server.store.core.message_writes import upsert_message
from turnwire_server.store.core.rows import (
    CONVERSATION_COLUMNS,
    LOAD_MESSAGES_SQL,
    MessageRow,
    build_message,
    conversation_from_row,
    message_insert_params,
    message_row,
    messages_from_rows,
)
from turnwire_server.store.core.sql import Dialect, Program, Statement
from turnwire_server.store.core.tool_answers import answer_calls
from turnwire_server.store.core.turn_writes import INSERT_MESSAGE, TOUCH_CONVERSATION
from turnwire_server.store.errors import (
    ConversationNotFound,
    MessageBeingWritten,
    MessageIdConflict,
    StoreCorrupted,
    UnknownMessage,
)
from turnwire_server.store.records import AddMode, AddResult, AnsweredToolCalls, ToolCallAnswer
from turnwire_server.store.waiting_calls import close_call, expired_text, is_waiting

__all__ = [
    "add_messages",
    "adding",
    "answer_tool_calls",
    "delete_conversation",
    "expire_pending_tool_calls",
    "prepare_add",
    "prepare_answers",
]

_CONVERSATION: Final = "SELECT 1 FROM conversations WHERE id = ?"
_STORED: Final = "SELECT role, metadata FROM messages WHERE conversation_id = ? AND id = ?"
_STORED_PARTS: Final = (
    "SELECT kind, data FROM parts WHERE conversation_id = ? AND message_id = ? ORDER BY idx"
)
_RUNNING_REPLY: Final = (
    "SELECT request_id FROM turns"
    " WHERE conversation_id = ? AND assistant_message_id = ? AND state = 'running' LIMIT 1"
)
_UPDATE_METADATA: Final = "UPDATE messages SET metadata = ? WHERE conversation_id = ? AND id = ?"
_RECORD: Final = f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?"

_CONVERSATION_TABLES: Final = (
    # Children first; turn_events hang off turn_streams by request id.
    "DELETE FROM turn_events WHERE request_id IN"
    " (SELECT request_id FROM turn_streams WHERE conversation_id = ?)",
    "DELETE FROM turn_streams WHERE conversation_id = ?",
    # Its submissions' webhook deliveries (docs/webhooks.md, "Retention"): pending ones too.
    "DELETE FROM webhook_attempts WHERE delivery_id IN"
    " (SELECT id FROM webhook_deliveries WHERE conversation_id = ?)",
    "DELETE FROM webhook_deliveries WHERE conversation_id = ?",
    "DELETE FROM submissions WHERE conversation_id = ?",
    "DELETE FROM compactions WHERE conversation_id = ?",
    "DELETE FROM parts WHERE conversation_id = ?",
    "DELETE FROM messages WHERE conversation_id = ?",
    "DELETE FROM turns WHERE conversation_id = ?",
    "DELETE FROM conversations WHERE id = ?",
)

# A waiting call's serialized Part holds ToolCallPart.state as field 4 (tag byte 0x20) set to 2
# (input-available) or 3 (approval-requested). Filtering on those bytes in SQL (the dialect's
# ``contains_bytes``) skips decoding every other stored call; the survivors are decoded and
# checked exactly.
_WAITING_TAGS: Final = (b"\x20\x02", b"\x20\x03")


def _blob(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


# --------------------------------------------------------------------------- add_messages


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


def adding(
    conversation_id: str,
    messages: Sequence[message_pb2.Message],
    *,
    mode: AddMode,
    allow_missing: bool,
    replace_only: Collection[str],
) -> Callable[[Dialect, int], Program[AddResult]]:
    """:func:`add_messages`' maker (``maker(dialect, now_us)``), its messages validated here, in
    the caller's task (:func:`prepare_add`'s :class:`ValueError`)."""
    rows = prepare_add(messages)
    only = frozenset(replace_only)

    def make(dialect: Dialect, now_us: int) -> Program[AddResult]:
        return add_messages(
            conversation_id,
            rows,
            mode=mode,
            allow_missing=allow_missing,
            replace_only=only,
            dialect=dialect,
            now_us=now_us,
        )

    return make


def add_messages(
    conversation_id: str,
    rows: Sequence[MessageRow],
    *,
    mode: AddMode,
    allow_missing: bool,
    replace_only: Collection[str],
    dialect: Dialect,
    now_us: int,
) -> Program[AddResult]:
    """``Store.add_messages`` (``rows`` from :func:`prepare_add`).

    New ids are appended in order, with create_time the write's time when unset. A stored id:
    same role and parts (and metadata, in ``upsert`` mode) is unchanged; otherwise ``append``
    raises :class:`MessageIdConflict` and ``upsert`` replaces parts and metadata in place
    (position and create_time kept). ``upsert`` never changes a message's role
    (:class:`MessageIdConflict`) and never touches the assistant message of a ``running`` turn
    (:class:`MessageBeingWritten`). :class:`ConversationNotFound` when the conversation is
    missing and not ``allow_missing``; :class:`UnknownMessage` for an id of ``replace_only`` that
    is not stored. Any of these writes nothing. All reads go in one batch.
    """
    reads = [
        *dialect.lock_conversation(conversation_id),
        # A fork judges (and replaces) a message it shares on its own copy (docs/forks.md).
        *claim_reads(conversation_id, [row.id for row in rows]),
        Statement(_CONVERSATION, (conversation_id,), fetch=True),
    ]
    first = len(reads)
    for row in rows:
        reads += [
            Statement(_STORED, (conversation_id, row.id), fetch=True),
            Statement(_STORED_PARTS, (conversation_id, row.id), fetch=True),
            Statement(_RUNNING_REPLY, (conversation_id, row.id), fetch=True),
        ]
    reads.append(children_read(conversation_id))
    found = yield reads
    children = found.pop()
    exists = bool(found[first - 1])
    if not exists and not allow_missing:
        raise ConversationNotFound(conversation_id)
    added: list[MessageRow] = []
    updated: list[MessageRow] = []
    unchanged = 0
    for index, row in enumerate(rows):
        stored, parts, running = found[first + 3 * index : first + 3 * index + 3]
        if not stored:
            if row.id in replace_only:
                raise UnknownMessage(conversation_id, row.id)
            create_us = now_us if row.create_time_us is None else row.create_time_us
            added.append(dataclasses.replace(row, create_time_us=create_us))
            continue
        role, metadata = stored[0]
        same_parts = [(kind, bytes(data)) for kind, data in parts] == list(row.parts)
        if role == row.role and same_parts and (mode == "append" or _blob(metadata) == row.metadata):
            unchanged += 1
        elif mode == "append" or role != row.role:
            raise MessageIdConflict(conversation_id, row.id)
        elif running:
            raise MessageBeingWritten(conversation_id, row.id, running[0][0])
        else:
            updated.append(row)
    writes: list[Statement] = []
    if added or updated or not exists:
        writes.append(Statement(TOUCH_CONVERSATION, (conversation_id, now_us, now_us, len(added))))
    if added:
        writes.append(
            Statement(
                INSERT_MESSAGE, [message_insert_params(conversation_id, row) for row in added], many=True
            )
        )
        writes += dialect.insert_parts(conversation_id, added)
    writes += push_writes(conversation_id, [row.id for row in updated], children, dialect)
    for row in updated:
        writes.append(Statement(_UPDATE_METADATA, (row.metadata, conversation_id, row.id)))
        writes += dialect.replace_parts(conversation_id, row)
    writes.append(Statement(_RECORD, (conversation_id,), fetch=True))
    done = yield writes
    return AddResult(conversation_from_row(done[-1][0]), len(added), len(updated), unchanged)


# --------------------------------------------------------------------------- delete_conversation


def delete_conversation(
    conversation_id: str, dialect: Dialect, *, with_forks: bool = False
) -> Program[tuple[bool, list[str]]]:
    """``Store.delete_conversation``: every row of the conversation (the driver's own tables
    first: the dialect's ``conversation_tables``); whether there was one, and the forks deleted
    with it. Its forks keep what they share with it (their own copies, docs/forks.md);
    ``with_forks`` deletes every conversation forked from it, directly or not, in the same
    transaction instead."""
    locks = list(dialect.lock_conversation(conversation_id))
    found = yield [
        *locks,
        Statement(DESCENDANTS_SQL if with_forks else CHILDREN_SQL, (conversation_id,), fetch=True),
    ]
    forks = sorted(row[0] for row in found[-1])
    writes: list[Statement] = []
    if with_forks:
        for fork in forks:
            writes += dialect.lock_conversation(fork)
            writes += _deletion(fork, dialect)
        writes.append(Statement("DELETE FROM fork_ancestors WHERE ancestor_id = ?", (conversation_id,)))
    else:
        writes += release_forks(conversation_id, found[-1], dialect)
    statements = _deletion(conversation_id, dialect)
    counts = yield [*writes, *statements]
    removed: int = sum(count for count in counts[-len(statements) :] if isinstance(count, int))
    return removed > 0, forks if with_forks else []


def _deletion(conversation_id: str, dialect: Dialect) -> list[Statement]:
    """Statements deleting every row of one conversation, its sharing with sources included,
    each counting what it removed."""
    statements = [*dialect.conversation_tables, *_CONVERSATION_TABLES]
    return [
        Statement("DELETE FROM fork_ancestors WHERE conversation_id = ?", (conversation_id,)),
        *(Statement(sql, (conversation_id,), count=True) for sql in statements),
        *conversation_deleted(conversation_id),
    ]


# --------------------------------------------------------------------------- tool calls


def prepare_answers(answers: Sequence[ToolCallAnswer]) -> tuple[ToolCallAnswer, ...]:
    """``answer_tool_calls``' answers, checked in the caller's task (:class:`ValueError` for none)."""
    if not answers:
        raise ValueError("no tool call answers to record")
    return tuple(answers)


def answer_tool_calls(
    conversation_id: str,
    answers: Sequence[ToolCallAnswer],
    expired_before: Any,
    dialect: Dialect,
    now_us: int,
) -> Program[AnsweredToolCalls]:
    """``Store.answer_tool_calls``: one read-modify-write under the conversation's lock (and its
    messages' rows locked as read, the dialect's ``lock_rows``), so of concurrent answers to one
    message exactly one completes it. Raises what
    :func:`~turnwire_server.store.core.tool_answers.answer_calls` raises."""
    reads = list(dialect.lock_conversation(conversation_id))
    if dialect.lock_rows:
        reads.append(
            Statement(
                "SELECT 1 FROM messages WHERE conversation_id = ?" + dialect.lock_rows, (conversation_id,)
            )
        )
    reads.append(Statement(LOAD_MESSAGES_SQL, (conversation_id, conversation_id), fetch=True))
    found = yield reads
    messages = messages_from_rows(conversation_id, found[-1], dialect.name)
    message, outcome = answer_calls(conversation_id, messages, answers, expired_before=expired_before)
    yield from upsert_message(conversation_id, message_row(message), dialect, now_us)
    return outcome


def expire_pending_tool_calls(cutoff_us: int, dialect: Dialect, now_us: int) -> Program[int]:
    """``Store.expire_pending_tool_calls``: close every waiting call of an assistant message
    created before ``cutoff_us`` with an errored result naming the expiry; returns how many.
    Takes the conversations' locks in id order."""
    maybe_waiting = " OR ".join(dialect.contains_bytes("p.data", tag) for tag in _WAITING_TAGS)
    found = yield [
        Statement(
            "SELECT DISTINCT m.conversation_id, m.id FROM messages AS m JOIN parts AS p"
            " ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
            " WHERE m.role = ? AND m.create_time < ? AND p.kind = 'tool_call' AND (" + maybe_waiting + ")",
            (message_pb2.ROLE_ASSISTANT, cutoff_us),
            fetch=True,
        )
    ]
    candidates = sorted((conversation_id, message_id) for conversation_id, message_id in found[0])
    if not candidates:
        return 0
    reads: list[Statement] = []
    for conversation_id in sorted({conversation_id for conversation_id, _ in candidates}):
        reads += dialect.lock_conversation(conversation_id)
    first = len(reads)
    for conversation_id, message_id in candidates:
        reads += [
            Statement(
                "SELECT role, create_time, create_time_nanos, metadata FROM messages"
                " WHERE conversation_id = ? AND id = ?",
                (conversation_id, message_id),
                fetch=True,
            ),
            Statement(
                "SELECT data FROM parts WHERE conversation_id = ? AND message_id = ? ORDER BY idx",
                (conversation_id, message_id),
                fetch=True,
            ),
        ]
    loaded = yield reads
    text = expired_text()
    expired = 0
    for index, (conversation_id, message_id) in enumerate(candidates):
        head, parts = loaded[first + 2 * index : first + 2 * index + 2]
        if not head:
            continue  # deleted meanwhile (another connection)
        message = _message(dialect, message_id, head[0], parts)
        changed = False
        for part in message.parts:
            if part.WhichOneof("kind") == "tool_call" and is_waiting(part.tool_call):
                close_call(part.tool_call, text)
                changed = True
                expired += 1
        if changed:
            yield from upsert_message(conversation_id, message_row(message), dialect, now_us)
    return expired


def _message(dialect: Dialect, message_id: str, head: Any, parts: list[Any]) -> message_pb2.Message:
    try:
        message = build_message(message_id, head[0], head[1], head[2], _blob(head[3]))
        for (data,) in parts:
            message.parts.add().MergeFromString(bytes(data))
    except (DecodeError, RecursionError) as exc:
        raise StoreCorrupted(
            f"{dialect.name} store: message {message_id!r} cannot be decoded: {exc}"
        ) from exc
    return message
