"""How forked conversations share messages, in SQL both dialects accept (docs/forks.md).

A fork reads its source's messages up to the fork point from the source's own rows (migration
0011, ``fork_ancestors``): forking stores O(1) rows whatever the history's length. What a
conversation *sees* is its own messages, then each ancestor's messages up to that ancestor's
``through_seq`` that neither the conversation nor a nearer ancestor holds under the same id
(:data:`INHERITED`). Shared rows are never changed for a fork's sake; every write that changes
a message keeps the other side as it was, copy-on-write:

* a conversation changing a message it inherits first takes its own copy (:func:`claim_reads`),
  then changes the copy;
* a conversation changing a message its forks see first gives each direct fork that has no copy
  of it a copy of the current version (:func:`push_writes`), under that fork's lock; deeper forks
  then see their nearer ancestor's copy;
* deleting a message a conversation inherits, or deleting a source, first copies every inherited
  message into the conversation (``detach``: :func:`materialize_writes`), an O(history) write
  that only these rare writes pay.

So a fork's history changes only by its own writes, which is what keeps the per-turn delta read
of :mod:`turnwire_server.store.core.message_cache` right: shared rows never change under it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from turnwire_server.store.core.sql import Dialect, Statement, in_marks

__all__ = [
    "CHILDREN_SQL",
    "DESCENDANTS_SQL",
    "INHERITED",
    "INHERITED_FROM",
    "INHERITED_WHERE",
    "MESSAGE_COLUMNS",
    "children_read",
    "claim_reads",
    "inherited_among_read",
    "materialize_writes",
    "push_writes",
]

MESSAGE_COLUMNS: Final = "id, seq, role, create_time, create_time_nanos, metadata"
"""The ``messages`` columns a copy carries (not ``version``: the copy is versioned by trigger)."""

# Only a source's own source can be shadowed by a nearer one: the depth test first spares the
# common single-level fork the subquery (PostgreSQL then plans it per row, not as a hash of every
# ancestor message).
_CLOSER: Final = (
    " AND (a.depth = 1 OR NOT EXISTS (SELECT 1 FROM fork_ancestors AS b JOIN messages AS n"
    " ON n.conversation_id = b.ancestor_id AND n.seq <= b.through_seq"
    " WHERE b.conversation_id = a.conversation_id AND b.depth < a.depth AND n.id = m.id))"
)

INHERITED_FROM: Final = (
    " FROM fork_ancestors AS a JOIN messages AS m"
    " ON m.conversation_id = a.ancestor_id AND m.seq <= a.through_seq"
)
INHERITED_WHERE: Final = (
    " WHERE a.conversation_id = ?"
    " AND NOT EXISTS (SELECT 1 FROM messages AS o"
    " WHERE o.conversation_id = a.conversation_id AND o.id = m.id)" + _CLOSER
)
INHERITED: Final = INHERITED_FROM + INHERITED_WHERE
"""``FROM … WHERE …`` of the messages (alias ``m``; ``a`` its ``fork_ancestors`` row) conversation
``?`` inherits and does not hold itself. Add conditions with ``AND``."""

_COPY_MESSAGES: Final = (
    f"INSERT INTO messages (conversation_id, {MESSAGE_COLUMNS})"
    " SELECT a.conversation_id, m.id, m.seq, m.role, m.create_time, m.create_time_nanos, m.metadata"
)
# The parts of a message the conversation has just taken a copy of: it holds the message but no
# part of it yet (a stored message always has parts), from the row its copy was taken from (the
# same rule as INHERITED, without "not held": the copy is held now).
_COPY_PARTS: Final = (
    "INSERT INTO parts (conversation_id, message_id, idx, kind, data)"
    " SELECT a.conversation_id, p.message_id, p.idx, p.kind, p.data"
    " FROM fork_ancestors AS a JOIN messages AS m"
    " ON m.conversation_id = a.ancestor_id AND m.seq <= a.through_seq"
    " JOIN parts AS p ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
    " WHERE a.conversation_id = ?"
    " AND EXISTS (SELECT 1 FROM messages AS o WHERE o.conversation_id = a.conversation_id AND o.id = m.id)"
    " AND NOT EXISTS (SELECT 1 FROM parts AS q WHERE q.conversation_id = a.conversation_id"
    " AND q.message_id = m.id)" + _CLOSER
)

DESCENDANTS_SQL: Final = "SELECT DISTINCT conversation_id FROM fork_ancestors WHERE ancestor_id = ?"
"""Every conversation forked from ``?``, directly or through other forks."""

CHILDREN_SQL: Final = "SELECT conversation_id FROM fork_ancestors WHERE ancestor_id = ? AND depth = 1"
"""The direct forks of conversation ``?`` (one column: the fork's id)."""


def _ids_filter(ids: Sequence[str]) -> str:
    return f" AND m.id IN ({in_marks(len(ids))})"


def claim_reads(conversation_id: str, ids: Sequence[str]) -> list[Statement]:
    """Statements (run before a write's reads, after the conversation's lock) that give
    ``conversation_id`` its own copy of each message of ``ids`` it inherits, so the write's
    reads and writes see only its own rows. Nothing for a conversation that is not a fork."""
    if not ids:
        return []
    where = _ids_filter(ids)
    return [
        Statement(_COPY_MESSAGES + INHERITED + where, (conversation_id, *ids)),
        Statement(_COPY_PARTS + where, (conversation_id, *ids)),
    ]


def children_read(conversation_id: str) -> Statement:
    """The read :func:`push_writes` decides on: the conversation's direct forks."""
    return Statement(CHILDREN_SQL, (conversation_id,), fetch=True)


def push_writes(
    conversation_id: str, ids: Sequence[str], children: Sequence[Any], dialect: Dialect
) -> list[Statement]:
    """Statements (run before the write changes or deletes messages ``ids`` of
    ``conversation_id``) giving each direct fork (``children``:
    :func:`children_read`'s rows) that sees one of them and holds no copy a copy of the version
    it sees, each fork locked first. Nothing without forks."""
    if not children or not ids:
        return []
    writes: list[Statement] = []
    for (child,) in sorted(children):
        writes += dialect.lock_conversation(child)
    where = _ids_filter(ids)
    params = (conversation_id, *ids)
    writes.append(
        Statement(
            f"INSERT INTO messages (conversation_id, {MESSAGE_COLUMNS})"
            " SELECT c.conversation_id, m.id, m.seq, m.role, m.create_time, m.create_time_nanos, m.metadata"
            " FROM fork_ancestors AS c JOIN messages AS m"
            " ON m.conversation_id = c.ancestor_id AND m.seq <= c.through_seq"
            " WHERE c.ancestor_id = ? AND c.depth = 1"
            + where
            + " AND NOT EXISTS (SELECT 1 FROM messages AS o"
            " WHERE o.conversation_id = c.conversation_id AND o.id = m.id)",
            params,
        )
    )
    writes.append(
        Statement(
            "INSERT INTO parts (conversation_id, message_id, idx, kind, data)"
            " SELECT c.conversation_id, p.message_id, p.idx, p.kind, p.data"
            " FROM fork_ancestors AS c JOIN messages AS m"
            " ON m.conversation_id = c.ancestor_id AND m.seq <= c.through_seq"
            " JOIN parts AS p ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
            " WHERE c.ancestor_id = ? AND c.depth = 1" + where + " AND NOT EXISTS (SELECT 1 FROM parts AS q"
            " WHERE q.conversation_id = c.conversation_id AND q.message_id = m.id)",
            params,
        )
    )
    return writes


def inherited_among_read(conversation_id: str, ids: Sequence[str]) -> Statement:
    """How many of ``ids`` ``conversation_id`` inherits without holding a copy (a delete of one
    must :func:`materialize_writes` first: a deleted copy would uncover the shared message)."""
    return Statement("SELECT COUNT(*)" + INHERITED + _ids_filter(ids), (conversation_id, *ids), fetch=True)


def materialize_writes(conversation_id: str) -> list[Statement]:
    """Statements copying every message ``conversation_id`` inherits into its own rows, then
    ending its sharing (its ``fork_ancestors`` rows): a detached conversation reads only its own
    rows. O(inherited messages); the caller holds its lock."""
    return [
        Statement(_COPY_MESSAGES + INHERITED, (conversation_id,)),
        Statement(_COPY_PARTS, (conversation_id,)),
        Statement("DELETE FROM fork_ancestors WHERE conversation_id = ?", (conversation_id,)),
    ]
