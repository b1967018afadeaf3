"""``Store.start_turn``'s write, once for both drivers: its statements, and its decision as a pure
function over the rows it reads (see :mod:`turnwire_server.store.core.sql` for how a driver runs it).

Idempotent input (docs/semantics.md §11): a message whose id is already stored with the same
role and parts is not stored again; with other content it is :class:`MessageIdConflict`; a
re-sent message that already has a completed reply is :class:`MessageAlreadyAnswered`. A
request id whose earlier turn ended in error, aborted or interrupted is retried (its record
replaced) when the request re-sends the same input; any other repeat is
:class:`TurnAlreadyExists`. A submission of the turn's id is marked running, or refused with
:class:`SubmissionNotPending` when it no longer waits (docs/semantics.md §7). Nothing is
written when any of these is raised.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from turnwire_client.v1 import message_pb2
from turnwire_server.store.core import budget_writes
from turnwire_server.store.core.fork_rules import claim_reads
from turnwire_server.store.core.rows import MessageRow, check_turn, message_insert_params, message_row, to_us
from turnwire_server.store.core.sql import Dialect, Program, Statement, in_marks, joined
from turnwire_server.store.errors import (
    MessageAlreadyAnswered,
    MessageIdConflict,
    SubmissionNotPending,
    TurnAlreadyExists,
)
from turnwire_server.store.records import BudgetCharge, BudgetGrant, BudgetLimits, TurnRecord

__all__ = [
    "CURRENT_VERSION",
    "INSERT_MESSAGE",
    "TOUCH_CONVERSATION",
    "StartTurn",
    "StartTurnPlan",
    "StoredMessage",
    "decide_start_turn",
    "prepare_start_turn",
    "start_turn",
    "start_turn_writes",
]

CURRENT_VERSION: Final = "(SELECT history_version FROM conversations WHERE id = ?)"
"""The conversation ``?``'s history version, as a value: what a write that bumped it
(:data:`TOUCH_CONVERSATION`) writes its message and part rows at (migration 0014)."""

INSERT_MESSAGE: Final = (
    "INSERT INTO messages"
    " (conversation_id, id, seq, role, create_time, create_time_nanos, metadata, version)"
    " VALUES (?, ?, (SELECT CASE WHEN s.top_seq > s.floor_seq THEN s.top_seq ELSE s.floor_seq END + 1"
    " FROM (SELECT COALESCE((SELECT MAX(seq) FROM messages WHERE conversation_id = ?), 0) AS top_seq,"
    " COALESCE((SELECT seq_floor FROM conversations WHERE id = ?), 0) AS floor_seq) AS s),"
    f" ?, ?, ?, ?, {CURRENT_VERSION})"
)
"""Append a message at the conversation's next position (:func:`message_insert_params`): after
its last message and after its ``seq_floor`` (a fork's fork point; the last position a fork of
it shares: docs/forks.md), at the conversation's history version: only after
:data:`TOUCH_CONVERSATION` in the same transaction."""

TOUCH_CONVERSATION: Final = (
    "INSERT INTO conversations (id, create_time, update_time, message_count, history_version)"
    " VALUES (?, ?, ?, ?, 1)"
    " ON CONFLICT (id) DO UPDATE SET update_time = excluded.update_time,"
    " message_count = conversations.message_count + excluded.message_count,"
    " history_version = conversations.history_version + 1"
)
"""Create the conversation if missing; set its update time, add to its message count and bump
its history version once for the write's messages and parts, which it then writes at the new
version (:data:`CURRENT_VERSION`; migration 0014: rows written so skip the per-row triggers):
``(conversation_id, now_us, now_us, added)``."""

_INSERT_TURN: Final = (
    "INSERT INTO turns (request_id, conversation_id, assistant_message_id,"
    " continuation, model, state, start_time, end_time, error, recovery_count, spec, owner,"
    " lease_until, lease_epoch) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
_MARK_SUBMISSION_RUNNING: Final = (
    "UPDATE submissions SET state = 'running', start_time = COALESCE(start_time, ?) WHERE id = ?"
)
_RETRYABLE_STATES: Final = frozenset({"error", "aborted", "interrupted"})
_OPEN_SUBMISSION: Final = ("pending", "running")


@dataclass(frozen=True, slots=True)
class StartTurn:
    """``start_turn``'s arguments, validated and serialized in the caller's task."""

    turn: TurnRecord
    rows: tuple[MessageRow, ...]
    turn_params: tuple[Any, ...]
    """The ``turns`` row's values, in :data:`_INSERT_TURN`'s order."""


def prepare_start_turn(turn: TurnRecord, messages: Sequence[message_pb2.Message]) -> StartTurn:
    """Validate ``start_turn``'s arguments (before anything is queued or sent).

    Raises :class:`ValueError` for an invalid argument or a message without parts, and
    :class:`MessageIdConflict` when a message id repeats within ``messages``.
    """
    check_turn(turn)
    rows = tuple(message_row(m) for m in messages)
    seen: set[str] = set()
    for row in rows:
        if not row.parts:
            raise ValueError(f"message {row.id!r} has no parts; such messages are not stored")
        if row.id in seen:
            raise MessageIdConflict(turn.conversation_id, row.id)
        seen.add(row.id)
    turn_params = (
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
        turn.lease_epoch,
    )
    return StartTurn(turn, rows, turn_params)


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A re-sent message as stored: its role, its parts ``(kind, bytes)`` in order, and whether a
    completed reply follows it."""

    role: int
    parts: list[tuple[str | None, bytes]]
    answered: bool


@dataclass(frozen=True, slots=True)
class StartTurnPlan:
    """What ``start_turn`` writes, as :func:`decide_start_turn` found it."""

    new_rows: tuple[MessageRow, ...]
    """The input messages not stored yet (appended, in order)."""
    replace_earlier: bool
    """An ended turn of the same request id is retried: its record goes first."""
    submission_running: bool
    """A submission of the turn's id exists and is marked running."""


def decide_start_turn(
    start: StartTurn,
    submission_state: str | None,
    earlier_state: str | None,
    stored: Mapping[str, StoredMessage],
) -> StartTurnPlan:
    """The rules of the module docstring over what the transaction read: the state of the
    submission and of the earlier turn of the turn's request id (None: there is none), and the
    stored messages among the input's ids. Raises :class:`SubmissionNotPending`,
    :class:`MessageIdConflict`, :class:`MessageAlreadyAnswered`, :class:`TurnAlreadyExists`."""
    turn = start.turn
    if submission_state is not None and submission_state not in _OPEN_SUBMISSION:
        raise SubmissionNotPending(turn.request_id, submission_state)
    new_rows = tuple(row for row in start.rows if not _stored_identically(turn.conversation_id, row, stored))
    if earlier_state is not None and (earlier_state not in _RETRYABLE_STATES or new_rows):
        # A retry re-sends the same input (all of it stored already); new input under an old
        # request id is another request, and the id is taken.
        raise TurnAlreadyExists(turn.request_id, earlier_state)
    return StartTurnPlan(new_rows, earlier_state is not None, submission_state is not None)


def _stored_identically(conversation_id: str, row: MessageRow, stored: Mapping[str, StoredMessage]) -> bool:
    found = stored.get(row.id)
    if found is None:
        return False
    if found.role != row.role or found.parts != list(row.parts):
        raise MessageIdConflict(conversation_id, row.id)
    if found.answered:
        raise MessageAlreadyAnswered(conversation_id, row.id)
    return True


def start_turn_reads(start: StartTurn, dialect: Dialect) -> list[Statement]:
    """The reads :func:`decide_start_turn` decides on, in one batch (after the conversation's
    lock): the submission, the earlier turn, and the input's stored messages with their parts
    (one row a part, in order) and whether a completed reply follows each."""
    turn, ids = start.turn, [row.id for row in start.rows]
    reads = [
        Statement(
            f"SELECT state FROM submissions WHERE id = ?{dialect.lock_rows}", (turn.request_id,), fetch=True
        ),
        Statement(
            f"SELECT state FROM turns WHERE request_id = ?{dialect.lock_rows}", (turn.request_id,), fetch=True
        ),
    ]
    if ids:
        reads.append(
            Statement(
                "SELECT m.id, m.role, p.kind, p.data,"
                " EXISTS (SELECT 1 FROM messages AS later JOIN turns AS t"
                "  ON t.conversation_id = later.conversation_id AND t.assistant_message_id = later.id"
                "  WHERE later.conversation_id = m.conversation_id AND later.seq > m.seq"
                "  AND t.state = 'completed')"
                " FROM messages AS m LEFT JOIN parts AS p"
                " ON p.conversation_id = m.conversation_id AND p.message_id = m.id"
                f" WHERE m.conversation_id = ? AND m.id IN ({in_marks(len(ids))}) ORDER BY m.seq, p.idx",
                (turn.conversation_id, *ids),
                fetch=True,
            )
        )
    return reads


def stored_messages(rows: Iterable[Any]) -> dict[str, StoredMessage]:
    """:func:`start_turn_reads`' message rows by message id."""
    found: dict[str, StoredMessage] = {}
    for message_id, role, kind, data, answered in rows:
        message = found.get(message_id)
        if message is None:
            message = found[message_id] = StoredMessage(role, [], bool(answered))
        if data is not None:
            message.parts.append((kind, bytes(data)))
    return found


def start_turn_writes(
    start: StartTurn, plan: StartTurnPlan, dialect: Dialect, now_us: int
) -> list[Statement]:
    """``plan``'s statements: the earlier turn's record out, the submission running, the
    conversation touched, the new messages and their parts appended, the turn's row in."""
    turn, conversation_id = start.turn, start.turn.conversation_id
    writes: list[Statement] = []
    if plan.replace_earlier:
        writes.append(Statement("DELETE FROM turns WHERE request_id = ?", (turn.request_id,)))
    if plan.submission_running:
        writes.append(Statement(_MARK_SUBMISSION_RUNNING, (now_us, turn.request_id)))
    writes.append(Statement(TOUCH_CONVERSATION, (conversation_id, now_us, now_us, len(plan.new_rows))))
    if plan.new_rows:
        writes.append(
            Statement(
                INSERT_MESSAGE,
                [message_insert_params(conversation_id, row) for row in plan.new_rows],
                many=True,
            )
        )
        writes.extend(dialect.insert_parts(conversation_id, plan.new_rows))
    writes.append(Statement(_INSERT_TURN, start.turn_params))
    return writes


def start_turn(
    start: StartTurn,
    dialect: Dialect,
    now_us: int,
    budget: BudgetCharge | None = None,
    refuse: Sequence[BudgetLimits] = (),
) -> Program[BudgetGrant | None]:
    """``Store.start_turn``: the conversation's lock, :func:`start_turn_reads` in one batch,
    :func:`decide_start_turn`, then :func:`start_turn_writes` (sent without waiting). With
    ``budget``, the turn's first reservation (``Store.admit_turn``'s) rides the same transaction,
    batch by batch (:func:`~.budget_writes.charge_budget`, ``admitting``), and its grant is
    returned (None without). ``refuse`` (``Store.admit_turn``'s): the budgets whose exhaustion
    refuses the turn, checked in the same transaction
    (:func:`~.budget_writes.admission_budget`); raises
    :class:`~turnwire_server.store.errors.BudgetSpent`, nothing stored."""
    started = _start_turn(start, dialect, now_us)
    if budget is None and not refuse:
        yield from started
        return None
    _, grant = yield from joined(
        started, budget_writes.admission_budget(budget, refuse, dialect, admitting=True)
    )
    return grant


def _start_turn(start: StartTurn, dialect: Dialect, now_us: int) -> Program[None]:
    locked = list(dialect.lock_conversation(start.turn.conversation_id))
    # A fork's input that repeats a message it shares is judged on its own copy (docs/forks.md).
    claims = claim_reads(start.turn.conversation_id, [row.id for row in start.rows])
    reads = start_turn_reads(start, dialect)
    found = yield [*locked, *claims, *reads]
    submission, earlier, *messages = found[len(locked) + len(claims) :]
    plan = decide_start_turn(
        start,
        submission[0][0] if submission else None,
        earlier[0][0] if earlier else None,
        stored_messages(messages[0]) if messages else {},
    )
    yield start_turn_writes(start, plan, dialect, now_us)
