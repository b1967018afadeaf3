"""Decoded messages kept between reads of a conversation, refreshed by a delta read (issue 17: a
turn's cost should not grow with its history).

Migration 0006 (``history_versions``, both backends) keeps a per-conversation change counter
(``conversations.history_version``, bumped by every insert, update or delete of a message or a
part), each message's counter value at its last change (``messages.version``) and a removal
counter (``conversations.history_epoch``, bumped when a message goes). The store's own message
writes bump it once per write and write their rows at the new value; triggers version every row
written without one (another replica, an operator; migration 0014). :data:`HISTORY_SQL` (one
statement, so one snapshot) returns the conversation's counters and only the messages whose
version is above the one the reader holds; when the epoch or the conversation's ``create_time``
(a deleted and recreated conversation) differ from the held ones, it returns every message. So the
database stays the only truth: another replica's append, a checkpoint rewriting a reply, a
deletion, a rollback are all seen on the very next read, at the cost of the changed rows only.

Callers share the kept messages (issue 17: no per-turn copy of the whole history): a read
returns a tuple of the very message objects kept here, the same objects on every read until the
database changes them (then the changed ones are new objects). Nobody may change them in place:
whoever needs a changed message copies that one message (``CopyFrom``) and changes the copy (the
engine's repairs and approved calls do so; hooks see copies, ``turnwire_server.hooks.readonly``).
So an object's identity stands for its content, which the provider adapters' conversion caches
rely on (``turnwire_server.providers.convert``).

What is kept counts against the process's one cache budget (``turnwire_server.cache_budget``,
``memory.cache_bytes``; issue 32 item 11): a conversation's entry costs its messages' stored
bytes (parts and metadata, as read) plus :data:`MESSAGE_OVERHEAD_BYTES` each.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import DecodeError

from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CACHES, CacheRegion
from turnwire_server.store.core.rows import build_message
from turnwire_server.store.errors import StoreCorrupted

MESSAGE_OVERHEAD_BYTES: Final = 1_700
"""RSS a decoded message costs beyond its stored bytes: the protobuf objects of the message and
its parts, its entry in the id map and the tuples holding it. ``bench/cache_entry_sizes.py``
measured 1,900 bytes of RSS per kept 150-byte text message and 5,340 per 4 KiB one (CPython 3.11,
protobuf 7 upb, 20,000 messages in a fresh process): their stored bytes plus 1,700 cover both."""

_HISTORY_SQL: Final = (
    "SELECT c.create_time, c.history_epoch, c.history_version,"
    " m.id, m.seq AS seq, m.role, m.create_time, m.create_time_nanos, m.metadata, p.data, p.idx AS idx"
    " FROM conversations AS c"
    " LEFT JOIN messages AS m{indexed} ON m.conversation_id = c.id AND m.version >"
    " CASE WHEN c.create_time = {p} AND c.history_epoch = {p} THEN {p} ELSE -1 END"
    " LEFT JOIN parts AS p ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
    " WHERE c.id = {p}"
    # A fork's shared messages (docs/forks.md, store/core/fork_rules.py), on a whole read only:
    # they never change under the fork (a change is the fork's own copy, caught above).
    " UNION ALL SELECT c.create_time, c.history_epoch, c.history_version,"
    " m.id, m.seq, m.role, m.create_time, m.create_time_nanos, m.metadata, p.data, p.idx"
    " FROM conversations AS c JOIN fork_ancestors AS a ON a.conversation_id = c.id"
    " JOIN messages AS m ON m.conversation_id = a.ancestor_id AND m.seq <= a.through_seq"
    " LEFT JOIN parts AS p ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
    " WHERE c.id = {p} AND NOT (c.create_time = {p} AND c.history_epoch = {p})"
    " AND NOT EXISTS (SELECT 1 FROM messages AS o WHERE o.conversation_id = c.id AND o.id = m.id)"
    " AND (a.depth = 1 OR NOT EXISTS (SELECT 1 FROM fork_ancestors AS b JOIN messages AS n"
    " ON n.conversation_id = b.ancestor_id AND n.seq <= b.through_seq"
    " WHERE b.conversation_id = c.id AND b.depth < a.depth AND n.id = m.id))"
    " ORDER BY seq, idx"
)

HISTORY_SQL: Final = _HISTORY_SQL.format(p="?", indexed="")
"""A conversation's counters and its messages changed since a held version, with their parts, by
message then part; on a whole read of a fork, the messages it shares with its sources too.
Parameters: :attr:`HistoryRead.params`. No row when there is no such conversation; one row
with NULL message columns when nothing changed. (SQLite without statistics scans the
conversation's messages in ``seq`` order here: right for a whole read.)"""

HISTORY_DELTA_SQL: Final = _HISTORY_SQL.format(p="?", indexed=" INDEXED BY messages_by_version")
""":data:`HISTORY_SQL` for SQLite when a version is held: through ``messages_by_version``, so
only the changed messages are visited (SQLite's planner, without ``ANALYZE`` statistics, would
rather walk every message in ``seq`` order to skip the sort)."""

HISTORY_SQL_POSTGRES: Final = _HISTORY_SQL.format(p="%s", indexed="")
""":data:`HISTORY_SQL` with PostgreSQL's placeholders (its planner has statistics)."""

_NONE: Final = -1  # below every stored counter: "nothing held", so everything is returned
_MESSAGE: Final = operator.itemgetter(1)  # the message of a ``(seq, message)``


@dataclass(frozen=True, slots=True)
class _History:
    """What a reader holds of one conversation: the counters it was read at, its messages by
    id, in ``seq`` order, each ``(seq, message)``, and ``ordered``, the same messages as the tuple
    reads hand out. Never mutated once built (reads in flight may still build on it)."""

    create_time: int
    epoch: int
    version: int
    messages: dict[str, tuple[int, message_pb2.Message, int]]
    """``{id: (seq, message, counted bytes)}``."""
    ordered: tuple[message_pb2.Message, ...]
    size_bytes: int
    """What the entry counts against the cache budget: the messages' counted bytes summed."""


@dataclass(frozen=True, slots=True)
class HistoryRead:
    """One read in flight: run ``sql`` with ``params``, then give the rows to
    :meth:`DecodedMessages.messages`."""

    conversation_id: str
    base: _History | None
    sql: str
    """The statement to run: :data:`HISTORY_SQL`, :data:`HISTORY_DELTA_SQL` or
    :data:`HISTORY_SQL_POSTGRES`."""

    @property
    def params(self) -> tuple[int | str, ...]:
        """``(create_time, epoch, version, conversation id, conversation id, create_time,
        epoch)`` for :data:`HISTORY_SQL`."""
        base = self.base
        conversation_id = self.conversation_id
        if base is None:
            return (_NONE, _NONE, _NONE, conversation_id, conversation_id, _NONE, _NONE)
        return (
            base.create_time,
            base.epoch,
            base.version,
            conversation_id,
            conversation_id,
            base.create_time,
            base.epoch,
        )


class DecodedMessages:
    """A least-recently-read cache of decoded messages per conversation, bounded in bytes by the
    process's cache budget (``region``, default a new region of
    :data:`turnwire_server.cache_budget.CACHES`): a conversation whose entry would not fit the
    whole budget is read whole, without the cache.

    ``backend`` (``sqlite`` or ``postgres``) picks the statements and names the store in errors.
    Not thread-safe: call it from the event loop (the store's readers), not from a writer thread.
    """

    def __init__(self, backend: str, *, region: CacheRegion | None = None) -> None:
        self.backend = backend
        self.region = CACHES.region(f"{backend} decoded messages") if region is None else region

    def read(self, conversation_id: str) -> HistoryRead:
        """A read of ``conversation_id`` building on what is held of it."""
        base: _History | None = self.region.get(conversation_id)  # type: ignore[assignment]
        if self.backend == "postgres":
            sql = HISTORY_SQL_POSTGRES
        else:
            sql = HISTORY_SQL if base is None else HISTORY_DELTA_SQL
        return HistoryRead(conversation_id, base, sql)

    def messages(self, read: HistoryRead, rows: Iterable[Any]) -> Sequence[message_pb2.Message]:
        """The conversation's messages, in order, from ``read``'s base and :data:`HISTORY_SQL`'s
        ``rows`` for it (() when there is no such conversation): a tuple of the kept message
        objects themselves, shared with every other reader, so read-only (see the module
        docstring; copy a message to change it). O(changed messages) when the conversation is
        held and only appended to. Raises :class:`StoreCorrupted` for a message that cannot be
        decoded."""
        conversation_id = read.conversation_id
        history = self._merged(read, rows)
        self._keep(conversation_id, history)
        return () if history is None else history.ordered

    def _merged(self, read: HistoryRead, rows: Iterable[Any]) -> _History | None:
        base = read.base
        counters: tuple[int, int, int] | None = None
        changed: list[tuple[str, int, message_pb2.Message, int]] = []
        try:
            for create_time, epoch, version, message_id, seq, decoded, size in _grouped(rows):
                counters = (create_time, epoch, version)
                if message_id is not None:
                    changed.append((message_id, seq, decoded, size))
        except (DecodeError, RecursionError) as exc:
            raise StoreCorrupted(
                f"{self.backend} store: conversation {read.conversation_id!r} has a message that cannot "
                f"be decoded: {exc}"
            ) from exc
        if counters is None:
            return None
        create_time, epoch, version = counters
        whole = base is None or base.create_time != create_time or base.epoch != epoch
        if base is not None and not whole and not changed:
            if base.version == version:
                return base
            return _History(create_time, epoch, version, base.messages, base.ordered, base.size_bytes)
        messages: dict[str, tuple[int, message_pb2.Message, int]] = {}
        size_bytes = 0
        if not whole and base is not None:
            messages, size_bytes = dict(base.messages), base.size_bytes
        last = next(reversed(messages.values()))[0] if messages else 0
        in_order = True
        appended = True  # only new messages, after the held ones: the held tuple is extended
        for message_id, seq, decoded, size in changed:
            held = messages.get(message_id)
            if held is not None:
                appended = False
                size_bytes -= held[2]
            if (held is None and seq < last) or (held is not None and held[0] != seq):
                in_order = False
            messages[message_id] = (seq, decoded, size)
            size_bytes += size
            last = max(last, seq)
        if not in_order:
            messages = dict(sorted(messages.items(), key=lambda item: item[1][0]))
        if in_order and appended and base is not None and not whole:
            ordered = base.ordered + tuple(change[2] for change in changed)
        else:
            ordered = tuple(map(_MESSAGE, messages.values()))
        return _History(create_time, epoch, version, messages, ordered, size_bytes)

    def _keep(self, conversation_id: str, history: _History | None) -> None:
        region = self.region
        held: _History | None = region.get(conversation_id)  # type: ignore[assignment]
        if history is None:
            region.discard(conversation_id)
            return
        if held is not None and held.create_time == history.create_time and held.version > history.version:
            history = held  # a read that finished later saw an older snapshot: keep the newer one
        region.put(conversation_id, history, history.size_bytes)


def _grouped(
    rows: Iterable[Any],
) -> Iterable[tuple[int, int, int, str | None, int, message_pb2.Message, int]]:
    """``(create_time, epoch, version, message id, seq, decoded message, counted bytes)`` per
    message of the rows (``(None, 0, None, 0)`` for the message columns of a row without a
    message); PostgreSQL's bytea columns come back as memoryview. The counted bytes are the
    stored parts' and metadata's lengths plus :data:`MESSAGE_OVERHEAD_BYTES`."""
    current: message_pb2.Message | None = None
    head: tuple[int, int, int, str | None, int] | None = None
    size = 0
    for (
        create_time,
        epoch,
        version,
        message_id,
        seq,
        role,
        create_us,
        create_nanos,
        metadata,
        part,
        _,
    ) in rows:
        if message_id is None:
            yield (create_time, epoch, version, None, 0, message_pb2.Message(), 0)
            continue
        if current is None or head is None or head[3] != message_id:
            if current is not None and head is not None:
                yield (*head, current, size)
            head = (create_time, epoch, version, message_id, seq)
            meta = None if metadata is None else bytes(metadata)
            current = build_message(message_id, role, create_us, create_nanos, meta)
            size = MESSAGE_OVERHEAD_BYTES + len(message_id) + (0 if meta is None else len(meta))
        if part is not None:
            current.parts.add().MergeFromString(bytes(part))
            size += len(part)
    if current is not None and head is not None:
        yield (*head, current, size)
