"""How both stores encode values in rows: times, messages, turn and conversation rows.

Pure functions with no connection of their own; used by both drivers' reads and writes.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, get_args

from google.protobuf.message import DecodeError

from turnwire_client.v1 import message_pb2
from turnwire_server.store.core.fork_rules import INHERITED_FROM, INHERITED_WHERE
from turnwire_server.store.errors import StoreCorrupted, StoreError
from turnwire_server.store.records import CompactionRecord, ConversationRecord, TurnRecord, TurnState

__all__ = [
    "COMPACTION_COLUMNS",
    "CONVERSATION_COLUMNS",
    "LOAD_MESSAGES_SQL",
    "TURN_COLUMNS",
    "TURN_LISTING_COLUMNS",
    "MessageRow",
    "build_message",
    "check_turn",
    "compaction_from_row",
    "compaction_params",
    "conversation_from_row",
    "message_insert_params",
    "message_row",
    "messages_from_rows",
    "time_from_us",
    "to_us",
    "turn_from_row",
]

_TURN_STATES: Final[frozenset[str]] = frozenset(get_args(TurnState))
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_US: Final = dt.timedelta(microseconds=1)
# google.protobuf.Timestamp's valid range: 0001-01-01T00:00:00Z .. 9999-12-31T23:59:59Z.
_TS_MIN_SECONDS: Final = -62_135_596_800
_TS_MAX_SECONDS: Final = 253_402_300_799

# --------------------------------------------------------------------------- times


def to_us(value: dt.datetime, what: str) -> int:
    """``value`` as integer microseconds since the Unix epoch.

    Raises :class:`ValueError` naming ``what`` when ``value`` is naive.
    """
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{what} must be a timezone-aware datetime, got {value!r}")
    return (value - _EPOCH) // _ONE_US


def _from_us(us: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=us)


def _opt_from_us(us: int | None) -> dt.datetime | None:
    return None if us is None else _from_us(us)


# --------------------------------------------------------------------------- messages


@dataclass(frozen=True, slots=True)
class MessageRow:
    """A message ready to write: validated and serialized in the caller's task.

    ``create_time_us`` is microseconds since the epoch (``None`` when unset) and
    ``create_time_nanos`` the sub-microsecond remainder (0..999); ``metadata``
    is the serialized Struct (``None`` when unset); ``parts`` are
    ``(oneof name or None, serialized Part)`` in order.
    """

    id: str
    role: int
    create_time_us: int | None
    create_time_nanos: int
    metadata: bytes | None
    parts: tuple[tuple[str | None, bytes], ...]


def message_row(message: message_pb2.Message) -> MessageRow:
    """``message`` as a :class:`MessageRow`.

    Raises :class:`ValueError` for an empty id or a create_time outside
    ``google.protobuf.Timestamp``'s range.
    """
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
    return MessageRow(message.id, int(message.role), create_us, create_nanos, metadata, parts)


def message_insert_params(conversation_id: str, row: MessageRow) -> tuple[Any, ...]:
    """The parameters of both backends' message INSERT: ``(conversation_id, id, conversation_id,
    conversation_id (for the next-position subquery), role, create_time_us, create_time_nanos,
    metadata, conversation_id (for the version))``."""
    return (
        conversation_id,
        row.id,
        conversation_id,
        conversation_id,
        row.role,
        row.create_time_us,
        row.create_time_nanos,
        row.metadata,
        conversation_id,
    )


def build_message(
    message_id: str, role: int, create_us: int | None, create_nanos: int, metadata: bytes | None
) -> message_pb2.Message:
    """A message without parts from its ``messages`` row columns (the inverse of :func:`message_row`).

    Raises :class:`google.protobuf.message.DecodeError` for corrupt metadata.
    """
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


_MESSAGE_WITH_PARTS: Final = (
    "SELECT m.id, m.role, m.create_time, m.create_time_nanos, m.metadata, p.data, m.seq AS seq, p.idx AS idx"
)
_PARTS_OF_M: Final = " LEFT JOIN parts AS p ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
LOAD_MESSAGES_SQL: Final = (
    _MESSAGE_WITH_PARTS + " FROM messages AS m" + _PARTS_OF_M + " WHERE m.conversation_id = ?"
    " UNION ALL "
    + _MESSAGE_WITH_PARTS
    + INHERITED_FROM
    + _PARTS_OF_M
    + INHERITED_WHERE
    + " ORDER BY seq, idx"
)
"""A conversation's messages with their parts, a fork's shared ones included (docs/forks.md),
in one statement (one consistent snapshot); the parameters are the conversation id, twice. Rows
for :func:`messages_from_rows`."""


def messages_from_rows(
    conversation_id: str, rows: Iterable[Any], store: str = "sqlite"
) -> list[message_pb2.Message]:
    """The messages of :data:`LOAD_MESSAGES_SQL`'s rows, in order. Raises :class:`StoreCorrupted`
    (naming the ``store``) for a message that cannot be decoded."""
    messages: list[message_pb2.Message] = []
    current: message_pb2.Message | None = None
    try:
        for message_id, role, create_us, create_nanos, metadata, part, _, _ in rows:
            if current is None or current.id != message_id:
                metadata_bytes = None if metadata is None else bytes(metadata)
                current = build_message(message_id, role, create_us, create_nanos, metadata_bytes)
                messages.append(current)
            if part is not None:
                current.parts.add().MergeFromString(bytes(part))
    except (DecodeError, RecursionError) as exc:
        raise StoreCorrupted(
            f"{store} store: conversation {conversation_id!r} has a message that cannot be decoded: {exc}"
        ) from exc
    return messages


def time_from_us(us: int | None) -> dt.datetime | None:
    """Microseconds since the epoch as a tz-aware UTC datetime; None stays None."""
    return _opt_from_us(us)


# --------------------------------------------------------------------------- turns, conversations


def check_turn(turn: TurnRecord) -> None:
    """Raise :class:`ValueError` when ``turn.state`` is not a :data:`TurnState`."""
    if turn.state not in _TURN_STATES:
        raise ValueError(f"turn {turn.request_id!r}: unknown state {turn.state!r}")


TURN_COLUMNS: Final = (
    "request_id, conversation_id, assistant_message_id, continuation, model, state, start_time,"
    " end_time, error, recovery_count, spec, owner, lease_until, lease_epoch"
)
"""The ``turns`` columns :func:`turn_from_row` reads, in its order."""

TURN_LISTING_COLUMNS: Final = TURN_COLUMNS + ", cost_usd, cost_source, timeline"
""":data:`TURN_COLUMNS` and what ``Store.list_turns`` adds: the cost and the timeline."""


def turn_from_row(row: Any) -> TurnRecord:
    """A ``turns`` row (columns in table order) as a :class:`TurnRecord` (times tz-aware UTC).

    Raises :class:`StoreError` for a state this code does not know.
    """
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
        spec=row[10] if len(row) > 10 else None,
        owner=(row[11] or "") if len(row) > 11 else "",
        lease_until=_opt_from_us(row[12]) if len(row) > 12 else None,
        lease_epoch=int(row[13] or 0) if len(row) > 13 else 0,
        cost_usd=row[14] if len(row) > 14 else None,
        cost_source=row[15] if len(row) > 15 else None,
        timeline=None if len(row) <= 16 or row[16] is None else bytes(row[16]),
    )


CONVERSATION_COLUMNS: Final = (
    "id, create_time, update_time, message_count, forked_from_conversation_id, forked_from_message_id"
)
"""The ``conversations`` columns :func:`conversation_from_row` reads, in its order."""


def conversation_from_row(row: Any) -> ConversationRecord:
    """A ``conversations`` row (:data:`CONVERSATION_COLUMNS`) as a record."""
    return ConversationRecord(
        conversation_id=row[0],
        create_time=_from_us(row[1]),
        update_time=_from_us(row[2]),
        message_count=row[3],
        forked_from_conversation_id=row[4] or "",
        forked_from_message_id=row[5] or "",
    )


# --------------------------------------------------------------------------- compactions

COMPACTION_COLUMNS: Final = (
    "conversation_id, through_message_id, summary, elided_calls, reason, strategy,"
    " tokens_before, tokens_after, create_time"
)
"""The ``compactions`` columns, in the order of :func:`compaction_params` and
:func:`compaction_from_row`."""


def compaction_params(record: CompactionRecord) -> tuple[Any, ...]:
    """``record`` as the values of :data:`COMPACTION_COLUMNS`. Raises :class:`ValueError` for an
    invalid create_time."""
    return (
        record.conversation_id,
        record.through_message_id,
        record.summary.SerializeToString() if record.summary is not None else None,
        json.dumps([list(pair) for pair in record.elided_calls]),
        record.reason,
        record.strategy,
        record.tokens_before,
        record.tokens_after,
        to_us(record.create_time, "create_time"),
    )


def compaction_from_row(row: Any) -> CompactionRecord:
    """A ``compactions`` row (:data:`COMPACTION_COLUMNS`) as a record. Raises
    :class:`StoreCorrupted` when its summary or call list cannot be decoded."""
    summary = None
    try:
        if row[2] is not None:
            summary = message_pb2.Message.FromString(bytes(row[2]))
        elided = json.loads(row[3])
        if not isinstance(elided, list) or not all(
            isinstance(c, list) and len(c) == 2 and all(isinstance(i, str) for i in c) for c in elided
        ):
            raise ValueError("elided_calls is not a list of [message id, tool call id] pairs")
    except (DecodeError, ValueError) as error:
        raise StoreCorrupted(
            f"the compaction of conversation {row[0]!r} cannot be decoded: {error}"
        ) from error
    return CompactionRecord(
        conversation_id=row[0],
        through_message_id=row[1],
        summary=summary,
        elided_calls=tuple((message_id, call_id) for message_id, call_id in elided),
        reason=row[4],
        strategy=row[5],
        tokens_before=row[6],
        tokens_after=row[7],
        create_time=_from_us(row[8]),
    )
