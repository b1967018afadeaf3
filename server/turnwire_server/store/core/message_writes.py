"""A turn's checkpoints and end, once for both drivers: ``Store.save_message``,
``Store.finish_turn`` and ``Store.roll_back_turn`` as core write programs
(:mod:`turnwire_server.store.core.sql`), with the message upsert they share.

A reply never overwrites someone else's message: upserting a stored id of another role is
:class:`MessageIdConflict` (ids of a turn's replies are the server's own, see
``turnwire_server.engine.ids``; this is the store's second line). A write of a turn that is no
longer recorded (its conversation was deleted while it ran) writes nothing: ``save_message``
silently (a late checkpoint; docs/semantics.md §12, deleting), ``finish_turn`` and
``roll_back_turn`` raising :class:`TurnNotFound`, so a reply never brings the conversation back.
A write of a turn another replica took over writes nothing and raises :class:`LeaseLost`
(:mod:`.fencing`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from turnwire_client.v1 import message_pb2
from turnwire_server.store.core.fencing import holds_lease, lease_read
from turnwire_server.store.core.fork_rules import INHERITED, children_read, claim_reads, push_writes
from turnwire_server.store.core.fork_writes import delete_guard_reads, delete_guard_writes
from turnwire_server.store.core.rows import MessageRow, check_turn, message_insert_params, message_row, to_us
from turnwire_server.store.core.sql import Dialect, Program, Statement, in_marks
from turnwire_server.store.core.stream_writes import EventBatch, prepare_events, stream_read, stream_writes
from turnwire_server.store.core.turn_writes import CURRENT_VERSION, INSERT_MESSAGE, TOUCH_CONVERSATION
from turnwire_server.store.core.webhook_writes import deliveries_on_end
from turnwire_server.store.errors import MessageIdConflict, TurnNotFound
from turnwire_server.store.records import TurnLease, TurnRecord

__all__ = [
    "FinishTurn",
    "finish_turn",
    "prepare_finish_turn",
    "prepare_roll_back",
    "prepare_save_message",
    "roll_back_turn",
    "save_message",
    "submission_end",
    "upsert_found",
    "upsert_message",
    "upsert_reads",
    "upsert_writes",
    "upserting",
]

_STORED_ROLE: Final = (
    # The message's role where the conversation holds it (second column 0), else where it
    # inherits it from a source (1: a fork's shared message, docs/forks.md), else no row.
    "SELECT role, 0 FROM messages WHERE conversation_id = ? AND id = ?"
    " UNION ALL SELECT m.role, 1" + INHERITED + " AND m.id = ?"
)
_UPDATE_MESSAGE: Final = (
    "UPDATE messages SET role = ?, create_time = ?, create_time_nanos = ?, metadata = ?,"
    f" version = {CURRENT_VERSION} WHERE conversation_id = ? AND id = ?"
)
_END_SUBMISSION: Final = (
    "UPDATE submissions SET state = ?, end_time = ?, error = ? WHERE id = ? AND state = 'running'"
)
_SUBMISSION_END: Final[dict[str, str]] = {
    "completed": "completed",
    "error": "error",
    "aborted": "aborted",
    "interrupted": "error",
    "skipped": "skipped",
}


def submission_end(turn_state: str) -> str | None:
    """The state a running submission ends in when its turn ends ``turn_state`` (docs/semantics.md
    §7); None while the turn still runs (a recovery counted): nothing ends."""
    return _SUBMISSION_END.get(turn_state)


def stored_role_read(conversation_id: str, row: MessageRow) -> Statement:
    """The read :func:`upsert_writes` decides on: ``(role, inherited)`` of the message the
    conversation holds or, a fork, shares with a source; no row for a new one."""
    return Statement(_STORED_ROLE, (conversation_id, row.id, conversation_id, row.id), fetch=True)


def upsert_writes(
    conversation_id: str, row: MessageRow, stored_role: list[Any], dialect: Dialect, now_us: int
) -> list[Statement]:
    """Insert ``row`` at the end, or replace it in place (same seq) when its id is stored
    (``stored_role``: :func:`stored_role_read`'s rows). Raises :class:`MessageIdConflict` when
    the stored message has another role."""
    if stored_role and stored_role[0][0] != row.role:
        raise MessageIdConflict(conversation_id, row.id)
    touch = Statement(TOUCH_CONVERSATION, (conversation_id, now_us, now_us, 0 if stored_role else 1))
    if not stored_role:
        inserted = Statement(INSERT_MESSAGE, message_insert_params(conversation_id, row))
        return [touch, inserted, *dialect.insert_parts(conversation_id, (row,))]
    updated = Statement(
        _UPDATE_MESSAGE,
        (
            row.role,
            row.create_time_us,
            row.create_time_nanos,
            row.metadata,
            conversation_id,
            conversation_id,
            row.id,
        ),
    )
    return [touch, updated, *dialect.replace_parts(conversation_id, row)]


def upsert_reads(conversation_id: str, row: MessageRow) -> list[Statement]:
    """The reads :func:`upserting` decides on (after the conversation's lock): the message's
    stored role, held or shared (a fork's, docs/forks.md), and the conversation's forks.
    :func:`upsert_found` picks their rows out of a batch's."""
    return [stored_role_read(conversation_id, row), children_read(conversation_id)]


def upsert_found(found: list[Any], first: int) -> tuple[list[Any], list[Any]]:
    """The stored role and forks rows of :func:`upsert_reads` put at ``first`` in a batch."""
    return found[first], found[first + 1]


def upserting(
    conversation_id: str, row: MessageRow, found: tuple[list[Any], list[Any]], dialect: Dialect, now_us: int
) -> list[Statement]:
    """:func:`upsert_writes`, after the conversation took its own copy of a message it shares
    (a fork's: the write then changes the copy, docs/forks.md) and its forks that see the message
    got theirs of the version they see. A message the conversation does not share costs no
    statement for that (issue 33: two a write before)."""
    stored_role, children = found
    claims = claim_reads(conversation_id, (row.id,)) if stored_role and stored_role[0][1] else []
    return [
        *claims,
        *push_writes(conversation_id, (row.id,), children, dialect),
        *upsert_writes(conversation_id, row, stored_role, dialect, now_us),
    ]


def upsert_message(conversation_id: str, row: MessageRow, dialect: Dialect, now_us: int) -> Program[None]:
    """:func:`upsert_writes` with its reads, for a write that holds the conversation's lock."""
    found = yield upsert_reads(conversation_id, row)
    yield upserting(conversation_id, row, upsert_found(found, 0), dialect, now_us)


def prepare_save_message(message: message_pb2.Message) -> MessageRow | None:
    """``save_message``'s row (None when ``message`` has no parts: such messages are not stored).
    Raises :class:`ValueError` for an empty id or invalid create_time."""
    row = message_row(message)
    return row if row.parts else None


def save_message(
    conversation_id: str, row: MessageRow, lease: TurnLease | None, dialect: Dialect, now_us: int
) -> Program[None]:
    """``Store.save_message``: upsert ``row``; with a turn's ``lease``, nothing when no such turn
    is recorded, and :class:`LeaseLost` when another replica took it over."""
    locks = dialect.lock_conversation(conversation_id)
    reads = [*locks, *upsert_reads(conversation_id, row)]
    if lease is not None:
        reads.append(lease_read(lease.request_id, dialect))
    found = yield reads
    if lease is not None and not holds_lease(found[-1], lease):
        return
    yield upserting(conversation_id, row, upsert_found(found, len(locks)), dialect, now_us)


class FinishTurn:
    """``finish_turn``'s (and ``roll_back_turn``'s) arguments, validated and serialized in the
    caller's task: the turn, its reply's row, and the last events of its stream (None: none)."""

    __slots__ = ("end_us", "events", "row", "turn")

    def __init__(self, turn: TurnRecord, row: MessageRow | None, events: EventBatch | None) -> None:
        self.turn = turn
        self.row = row
        self.events = events
        self.end_us = None if turn.end_time is None else to_us(turn.end_time, "end_time")


def _event_batch(events: Sequence[tuple[int, bytes]], stream_ended: bool) -> EventBatch | None:
    return prepare_events(events, ended=stream_ended) if events or stream_ended else None


def prepare_finish_turn(
    turn: TurnRecord,
    message: message_pb2.Message | None,
    events: Sequence[tuple[int, bytes]] = (),
    *,
    stream_ended: bool = False,
) -> FinishTurn:
    """Validate ``finish_turn``'s arguments; a message without parts is not stored. Raises
    :class:`ValueError` for an invalid argument (events as ``append_events`` refuses them)."""
    check_turn(turn)
    row = message_row(message) if message is not None else None
    return FinishTurn(
        turn, row if row is not None and row.parts else None, _event_batch(events, stream_ended)
    )


def _submission_ending(turn: TurnRecord, token: list[Any], now_us: int) -> list[Statement]:
    """The end of the submission of ``turn``'s id that ``turn``'s end ends, when one is running
    (``token``: :func:`~.fencing.lease_read`'s rows with ``running_submission``; a turn of a
    ``Chat`` call has none, and its write runs no statement for it): its end state, and its
    webhook outbox row, in this transaction (docs/semantics.md §7)."""
    ended = submission_end(turn.state)
    if ended is None or not token[0][2]:
        return []
    return [
        Statement(_END_SUBMISSION, (ended, now_us, turn.error, turn.request_id)),
        *deliveries_on_end([turn.request_id]),
    ]


def _stream_reads(finish: FinishTurn, dialect: Dialect) -> list[Statement]:
    """The read a finish's stream events need (none without events)."""
    return [] if finish.events is None else [stream_read(finish.turn.request_id, dialect)]


def _stream_tail(finish: FinishTurn, stream: list[Any], dialect: Dialect, now_us: int) -> list[Statement]:
    """A finish's stream events (docs/semantics.md §8: a turn's last events and its TurnEnd are
    durable with its end state, in one transaction); ``stream``: :func:`stream_read`'s rows."""
    if finish.events is None:
        return []
    turn = finish.turn
    return stream_writes(
        turn.conversation_id, turn.request_id, finish.events, stream, dialect=dialect, now_us=now_us
    )


def finish_turn(finish: FinishTurn, dialect: Dialect, now_us: int) -> Program[None]:
    """``Store.finish_turn``: upsert the reply (when it has parts), end the turn and its running
    submission, store its stream's last events (when given). Raises :class:`TurnNotFound`
    (writing nothing) when the turn is not recorded, :class:`LeaseLost` when another replica
    holds it (``finish.turn.lease`` is not the stored one)."""
    turn, row = finish.turn, finish.row
    stream_reads = _stream_reads(finish, dialect)
    reads = [*dialect.lock_conversation(turn.conversation_id)]
    first = len(reads)
    if row is not None:
        reads += upsert_reads(turn.conversation_id, row)
    reads.append(lease_read(turn.request_id, dialect, running_submission=True))
    reads.extend(stream_reads)
    found = yield reads
    stream = found.pop() if stream_reads else []
    if not holds_lease(found[-1], turn.lease):
        raise TurnNotFound(turn.request_id)
    token = found[-1]
    writes = (
        []
        if row is None
        else upserting(turn.conversation_id, row, upsert_found(found, first), dialect, now_us)
    )
    writes.extend(_stream_tail(finish, stream, dialect, now_us))
    writes.append(
        Statement(
            "UPDATE turns SET state = ?, end_time = ?, error = ?, recovery_count = ?, cost_usd = ?,"
            " cost_source = ?, timeline = ? WHERE request_id = ?",
            (
                turn.state,
                finish.end_us,
                turn.error,
                turn.recovery_count,
                turn.cost_usd,
                turn.cost_source,
                turn.timeline,
                turn.request_id,
            ),
        )
    )
    writes.extend(_submission_ending(turn, token, now_us))
    yield writes


def prepare_roll_back(
    turn: TurnRecord,
    message_ids: Sequence[str],
    events: Sequence[tuple[int, bytes]] = (),
    *,
    stream_ended: bool = False,
) -> tuple[FinishTurn, list[str]]:
    """Validate ``roll_back_turn``'s arguments: the turn, the message ids once each, and the
    stream's last events."""
    check_turn(turn)
    return FinishTurn(turn, None, _event_batch(events, stream_ended)), list(dict.fromkeys(message_ids))


def roll_back_turn(
    finish: FinishTurn, message_ids: Sequence[str], dialect: Dialect, now_us: int
) -> Program[None]:
    """``Store.roll_back_turn``: remove ``message_ids`` (parts first) from the turn's conversation
    and end the turn and its running submission, store its stream's last events (when given).
    Raises :class:`TurnNotFound` (writing nothing) when the turn is not recorded,
    :class:`LeaseLost` when another replica holds it."""
    turn, conversation_id = finish.turn, finish.turn.conversation_id
    stream_reads = _stream_reads(finish, dialect)
    reads = [*dialect.lock_conversation(conversation_id)]
    if message_ids:
        marks = in_marks(len(message_ids))
        reads += delete_guard_reads(conversation_id, message_ids)
        reads.append(
            Statement(
                f"SELECT COUNT(*) FROM messages WHERE conversation_id = ? AND id IN ({marks})",
                (conversation_id, *message_ids),
                fetch=True,
            )
        )
    reads.append(lease_read(turn.request_id, dialect, running_submission=True))
    reads.extend(stream_reads)
    found = yield reads
    stream = found.pop() if stream_reads else []
    if not holds_lease(found[-1], turn.lease):
        raise TurnNotFound(turn.request_id)
    token = found[-1]
    writes: list[Statement] = []
    if message_ids:
        # Inherited ones among them become the conversation's own first (then deleted too).
        removed = found[-2][0][0] + found[-4][0][0]
        writes += delete_guard_writes(conversation_id, message_ids, found[-4:-2], dialect)
        params = (conversation_id, *message_ids)
        writes.append(
            Statement(f"DELETE FROM parts WHERE conversation_id = ? AND message_id IN ({marks})", params)
        )
        writes.append(
            Statement(f"DELETE FROM messages WHERE conversation_id = ? AND id IN ({marks})", params)
        )
        if removed:
            writes.append(
                Statement(
                    "UPDATE conversations SET message_count = message_count - ?, update_time = ?"
                    " WHERE id = ?",
                    (removed, now_us, conversation_id),
                )
            )
    writes.append(
        Statement(
            "UPDATE turns SET state = ?, end_time = ?, error = ?, cost_usd = ?, cost_source = ?,"
            " timeline = ? WHERE request_id = ?",
            (
                turn.state,
                finish.end_us,
                turn.error,
                turn.cost_usd,
                turn.cost_source,
                turn.timeline,
                turn.request_id,
            ),
        )
    )
    writes.extend(_submission_ending(turn, token, now_us))
    writes.extend(_stream_tail(finish, stream, dialect, now_us))
    yield writes
