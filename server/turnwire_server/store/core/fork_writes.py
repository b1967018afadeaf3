"""Forking a conversation and deleting one that has forks, once for both drivers (core programs,
:mod:`turnwire_server.store.core.sql`; the sharing rules are :mod:`.fork_rules`, docs/forks.md).

``fork_conversation`` writes O(1) rows whatever the source's length: the new conversation's row,
one ``fork_ancestors`` row per conversation along the source's chain, the source's raised
``seq_floor`` and, when it applies, a copy of the source's compaction row. Deleting a source
first copies what each direct fork still shares into the fork (the shared messages then belong
to the forks); deleting with forks deletes every conversation forked from it, directly or not,
in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from turnwire_server.store.core.fork_rules import (
    INHERITED,
    children_read,
    inherited_among_read,
    materialize_writes,
    push_writes,
)
from turnwire_server.store.core.reads import LOAD_COMPACTION_SQL
from turnwire_server.store.core.rows import CONVERSATION_COLUMNS, conversation_from_row
from turnwire_server.store.core.sql import Dialect, Program, Statement, in_marks
from turnwire_server.store.errors import ConversationExists, ForkPointNotFound, ForkSourceNotFound
from turnwire_server.store.records import ConversationRecord

__all__ = [
    "delete_guard_reads",
    "delete_guard_writes",
    "fork_conversation",
    "release_forks",
]


def _visible_seqs(conversation_id: str, ids: Sequence[str]) -> Statement:
    """``(id, seq)`` of the messages of ``ids`` in ``conversation_id``'s history (its own or
    inherited)."""
    marks = in_marks(len(ids))
    return Statement(
        f"SELECT id, seq FROM messages WHERE conversation_id = ? AND id IN ({marks})"
        f" UNION ALL SELECT m.id, m.seq{INHERITED} AND m.id IN ({marks})",
        (conversation_id, *ids, conversation_id, *ids),
        fetch=True,
    )


def fork_conversation(
    source_id: str, message_id: str, fork_id: str, dialect: Dialect, now_us: int
) -> Program[ConversationRecord]:
    """``Store.fork_conversation``: conversation ``fork_id`` holding ``source_id``'s history up
    to and including ``message_id``, sharing its rows. Raises :class:`ForkSourceNotFound`,
    :class:`ConversationExists` (``fork_id`` is taken) or :class:`ForkPointNotFound`
    (``message_id`` is not in the source's history); any of these writes nothing."""
    locks = [
        statement
        for conversation_id in sorted({source_id, fork_id})
        for statement in dialect.lock_conversation(conversation_id)
    ]
    found = yield [
        *locks,
        Statement("SELECT 1 FROM conversations WHERE id = ?", (source_id,), fetch=True),
        Statement("SELECT 1 FROM conversations WHERE id = ?", (fork_id,), fetch=True),
        _visible_seqs(source_id, (message_id,)),
        Statement(
            "SELECT ancestor_id, depth, through_seq FROM fork_ancestors WHERE conversation_id = ?",
            (source_id,),
            fetch=True,
        ),
        Statement(LOAD_COMPACTION_SQL, (source_id,), fetch=True),
    ]
    source, taken, point, ancestors, compaction = found[len(locks) :]
    if not source:
        raise ForkSourceNotFound(source_id)
    if taken:
        raise ConversationExists(fork_id)
    if not point:
        raise ForkPointNotFound(source_id, message_id)
    through = int(point[0][1])
    compaction_ids: list[str] = []
    if compaction:
        through_message, elided = compaction[0][1], json.loads(compaction[0][3])
        compaction_ids = list(dict.fromkeys([through_message, *(pair[0] for pair in elided)]))
    counted = yield [
        Statement(
            "SELECT (SELECT COUNT(*) FROM messages WHERE conversation_id = ? AND seq <= ?)"
            f" + (SELECT COUNT(*){INHERITED} AND m.seq <= ?)",
            (source_id, through, source_id, through),
            fetch=True,
        ),
        *([_visible_seqs(source_id, compaction_ids)] if compaction_ids else []),
    ]
    message_count = int(counted[0][0][0])
    lineage = [(fork_id, source_id, 1, through)] + [
        (fork_id, ancestor, int(depth) + 1, min(int(seq), through)) for ancestor, depth, seq in ancestors
    ]
    writes = [
        Statement(
            "INSERT INTO conversations (id, create_time, update_time, message_count,"
            " forked_from_conversation_id, forked_from_message_id, seq_floor) VALUES (?, ?, ?, ?, ?, ?, ?)",
            (fork_id, now_us, now_us, message_count, source_id, message_id, through),
        ),
        Statement(
            "INSERT INTO fork_ancestors (conversation_id, ancestor_id, depth, through_seq)"
            " VALUES (?, ?, ?, ?)",
            lineage,
            many=True,
        ),
        # The source never puts a new message at a position this fork shares (docs/forks.md).
        Statement(
            "UPDATE conversations SET seq_floor = CASE WHEN seq_floor > ? THEN seq_floor ELSE ? END"
            " WHERE id = ?",
            (through, through, source_id),
        ),
    ]
    if compaction_ids:
        copied = _compaction_copy(compaction[0], dict(counted[1]), through, fork_id)
        if copied is not None:
            writes.append(copied)
    writes.append(
        Statement(f"SELECT {CONVERSATION_COLUMNS} FROM conversations WHERE id = ?", (fork_id,), fetch=True)
    )
    done = yield writes
    return conversation_from_row(done[-1][0])


def _compaction_copy(
    row: Sequence[Any], seqs: dict[str, int], through: int, fork_id: str
) -> Statement | None:
    """The source's compaction row (``row``: :data:`LOAD_COMPACTION_SQL`'s) for the fork, when
    it covers only messages the fork holds (its ``through_message_id`` at or before the fork
    point), its elided calls cut to those; None when it reaches past the fork point (the fork's
    history is then sent whole until it is compacted on its own)."""
    covered = seqs.get(row[1])
    if covered is None or covered > through:
        return None
    elided = [pair for pair in json.loads(row[3]) if seqs.get(pair[0], through + 1) <= through]
    return Statement(
        "INSERT INTO compactions (conversation_id, through_message_id, summary, elided_calls, reason,"
        " strategy, tokens_before, tokens_after, create_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (fork_id, row[1], row[2], json.dumps(elided), row[4], row[5], row[6], row[7], row[8]),
    )


def release_forks(conversation_id: str, children: Sequence[Any], dialect: Dialect) -> list[Statement]:
    """Statements (before ``conversation_id`` is deleted) that copy into each direct fork
    (``children``: :func:`~.fork_rules.children_read`'s rows) every message it still shares, so
    it stays readable without its source, then forget the sharing of and with
    ``conversation_id`` (the deeper forks then read their nearer, now whole, ancestor)."""
    writes: list[Statement] = []
    for (child,) in sorted(children):
        writes += dialect.lock_conversation(child)
        writes += materialize_writes(child)
    writes.append(
        Statement(
            "DELETE FROM fork_ancestors WHERE conversation_id = ? OR ancestor_id = ?",
            (conversation_id, conversation_id),
        )
    )
    return writes


def delete_guard_reads(conversation_id: str, ids: Sequence[str]) -> list[Statement]:
    """The reads :func:`delete_guard_writes` decides on, for a write that deletes messages
    ``ids`` of ``conversation_id`` (under its lock)."""
    return [inherited_among_read(conversation_id, ids), children_read(conversation_id)]


def delete_guard_writes(
    conversation_id: str, ids: Sequence[str], found: Sequence[Any], dialect: Dialect
) -> list[Statement]:
    """Statements (before the messages ``ids`` are deleted; ``found``: the rows of
    :func:`delete_guard_reads`): the conversation detached from its sources when it inherits one
    of them (else deleting its copy would uncover the shared one), then a copy for each fork that
    shares one of them."""
    inherited, children = found
    writes = materialize_writes(conversation_id) if inherited and inherited[0][0] else []
    return writes + push_writes(conversation_id, ids, children, dialect)
