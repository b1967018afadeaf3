"""The store's records: what the :class:`~turnwire_server.store.base.Store` protocols take and
return (turns, conversations, compactions, streams, submissions, tool-call answers), plain frozen
dataclasses and literal state types."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from turnwire.types import Cost
from turnwire_client.v1 import message_pb2

__all__ = [
    "AddMode",
    "AddResult",
    "AnsweredToolCalls",
    "BudgetAsk",
    "BudgetCharge",
    "BudgetGrant",
    "BudgetKey",
    "BudgetLimits",
    "BudgetSpend",
    "CompactionRecord",
    "ConversationRecord",
    "ConversationView",
    "HeldTurn",
    "StreamRecord",
    "SubmissionRecord",
    "SubmissionState",
    "ToolCallAnswer",
    "ToolCallAnswerKind",
    "TurnAdmission",
    "TurnLease",
    "TurnRecord",
    "TurnState",
    "renewed_lease",
]

TurnState = Literal["running", "completed", "error", "aborted", "interrupted", "skipped"]
"""A turn record's state; ``running`` until the turn ends."""

SubmissionState = Literal["pending", "running", "completed", "error", "aborted", "skipped"]
"""A submission's state (docs/semantics.md §7): ``pending → running → completed | error |
aborted | skipped``; ``aborted`` is final even against a late completion."""

AddMode = Literal["append", "upsert"]
"""How :meth:`Store.add_messages` treats a message whose id is stored (docs/semantics.md §1):
``append`` leaves one with the same content as it is and refuses other content; ``upsert``
replaces it in place."""


ToolCallAnswerKind = Literal["output", "error", "approve", "deny"]
"""What the client answered: a result (``output``), a failed result (``error``), an approval or a
denial."""


@dataclass(frozen=True, slots=True)
class ToolCallAnswer:
    """The client's answer to one waiting tool call (docs/semantics.md §6).

    ``output`` needs ``output_json`` (JSON text, stored exactly) and answers a client call;
    ``error`` answers a client call with ``text`` as the error (``Tool execution denied by
    user`` when empty); ``approve`` and ``deny`` answer an approval request, ``text`` being
    the denial's reason (default ``Tool execution denied by user``).
    """

    tool_call_id: str
    kind: ToolCallAnswerKind
    output_json: str = ""
    text: str = ""


@dataclass(frozen=True, slots=True)
class AnsweredToolCalls:
    """The outcome of :meth:`Store.answer_tool_calls`.

    ``message`` is the assistant message holding the calls, as stored now; ``waiting`` the
    ids of its calls that still wait for the client. ``completed`` is true for exactly one
    write per message: the one that answered its last waiting call.
    """

    message: message_pb2.Message
    waiting: tuple[str, ...]
    completed: bool


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """A conversation's metadata. Times are timezone-aware UTC."""

    conversation_id: str
    create_time: dt.datetime
    update_time: dt.datetime
    message_count: int
    forked_from_conversation_id: str = ""
    """The conversation this one was forked from ("" when it was not; docs/forks.md). Kept when
    that conversation is deleted."""
    forked_from_message_id: str = ""
    """The message of that conversation it was forked at ("" when it was not forked)."""


@dataclass(frozen=True, slots=True)
class ConversationView:
    """A conversation as ``GetConversation`` shows it, read on one snapshot of the store
    (:meth:`~turnwire_server.store.transcripts.TranscriptStore.conversation_view`): a turn
    whose checkpoint writes its reply between two reads is either a partial reply or a turn
    without reply, never neither or both (docs/semantics.md §5)."""

    record: ConversationRecord
    messages: Sequence[message_pb2.Message]
    """All messages, oldest first; read-only (shared with the store's message cache)."""
    partial_replies: dict[str, TurnRecord]
    """``{assistant message id: its latest turn}`` for each reply whose latest turn (a
    continuation writes the same message) is ``running``, ``aborted``, ``error`` or
    ``interrupted``, whether or not the reply is stored yet (a page lists those among its
    messages); complete replies are absent."""
    turns_without_reply: list[TurnRecord]
    """Turns in those states whose assistant message does not exist (none stored yet, none
    before the turn ended, or removed by a rollback): the most recently started (at most the
    limit asked for), oldest first (ties by request id)."""
    cost: Cost | None
    """What the conversation's ended turns cost together (``TurnRecord.cost_usd``), their
    sources joined by ``, `` in the order the turns started; None when one of them has an
    unknown cost or none has ended (docs/cost.md)."""


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One turn as the store knows it.

    ``error`` is a serialized ``google.rpc.Status``: why the turn ended, when it ended
    ``error``, or ``aborted`` / ``interrupted`` with a reason (``SHUTTING_DOWN``,
    ``ROLLED_BACK``, ``SLOW_CONSUMER`` …); ``recovery_count`` counts recoveries (crash, stall)
    spent on this turn;
    ``spec`` is what a recovery needs to run the turn again (JSON text: body, client
    tools, continuation; see ``turnwire_server.engine.turn_spec``), None for turns
    stored before it existed. ``owner`` is the replica running it and ``lease_until`` when its
    lease lapses unless renewed (a lapsed running turn is recovered by another replica);
    ``lease_epoch`` is the lease's fencing token, 0 when the turn starts and incremented by
    every claim (takeover), so a write carrying :attr:`lease` is refused once another replica
    claimed the turn (docs/semantics.md §5, "Fencing"). ``cost_usd`` is what the turn cost in US
    dollars, written with its end (None: unknown, docs/cost.md), ``cost_source`` where its prices
    came from; read by :meth:`~turnwire_server.store.transcripts.TranscriptStore.conversation_view` and
    :meth:`~turnwire_server.store.transcripts.TranscriptStore.list_turns`. ``timeline`` is the serialized
    ``turnwire.v1.TurnTimeline`` of what took its time, written with its end (None: running, or
    ended before timelines were stored, docs/inspector.md); the store never decodes it.
    """

    request_id: str
    conversation_id: str
    assistant_message_id: str
    continuation: bool
    model: str
    state: TurnState
    start_time: dt.datetime
    end_time: dt.datetime | None = None
    error: bytes | None = None
    recovery_count: int = 0
    spec: str | None = None
    owner: str = ""
    lease_until: dt.datetime | None = None
    lease_epoch: int = 0
    cost_usd: float | None = None
    cost_source: str | None = None
    timeline: bytes | None = None

    @property
    def lease(self) -> TurnLease:
        """The fencing token this record's writes carry."""
        return TurnLease(self.request_id, self.owner, self.lease_epoch)


@dataclass(frozen=True, slots=True)
class TurnLease:
    """Who may write for a running turn (docs/semantics.md §5, "Fencing"): the turn
    ``request_id``, its ``owner`` (a replica id) and the ``epoch`` of the owner's claim. A turn
    write carrying a lease is refused with :class:`~turnwire_server.store.errors.LeaseLost`
    (nothing written) unless the stored turn has both, checked inside the write's own
    transaction."""

    request_id: str
    owner: str
    epoch: int


@dataclass(frozen=True, slots=True)
class HeldTurn:
    """A running turn as a lease renewal found it (``ReplicaStore.renew_leases``): its fencing
    token (``lease``) and its ``start_time`` (tz-aware UTC; a later attempt under the same
    request id is another turn), the two a release of its lease is fenced by
    (``ReplicaStore.release_leases``)."""

    lease: TurnLease
    start_time: dt.datetime


@dataclass(frozen=True, slots=True)
class CompactionRecord:
    """The latest compaction of a conversation's history (docs/semantics.md §9): what the model
    is sent instead of the stored messages, which never change.

    The model sees ``summary`` (None: no summary) in place of the messages up to and including
    ``through_message_id`` (``""`` with no summary), then the messages after it, with the
    outputs of the tool calls ``elided_calls`` (``(message id, tool call id)`` pairs) replaced
    by a placeholder. ``reason`` is
    ``reactive``, ``proactive`` or ``threshold``; ``strategy`` the strategy's name;
    ``tokens_before`` / ``tokens_after`` the counted tokens of the view before and after.
    """

    conversation_id: str
    through_message_id: str
    summary: message_pb2.Message | None
    elided_calls: tuple[tuple[str, str], ...]
    reason: str
    strategy: str
    tokens_before: int
    tokens_after: int
    create_time: dt.datetime


@dataclass(frozen=True, slots=True)
class TurnAdmission:
    """What :meth:`Store.admit_turn` read with the commit of the turn's input, so the turn need not
    read it again before its model call.

    ``history`` is the conversation's messages as that commit left them (read-only, as
    :meth:`Store.load_messages` gives them), None when the backend did not read them (the
    caller loads them); ``compaction`` its compaction record when ``compaction_read`` (None: it
    has none), unread otherwise. ``budget`` is the grant of the first step's reservation the
    commit carried (``admit_turn``'s ``budget``), None when it carried none.
    """

    history: Sequence[message_pb2.Message] | None = None
    compaction: CompactionRecord | None = None
    compaction_read: bool = False
    budget: BudgetGrant | None = None


@dataclass(frozen=True, slots=True)
class StreamRecord:
    """A turn's stored event stream (for ResumeTurn). Times tz-aware UTC.

    ``last_sequence_number`` is the highest stored event's; ``end_time`` is set once its
    TurnEnd is stored; ``events_expired`` once retention removed its events.
    """

    request_id: str
    conversation_id: str
    last_sequence_number: int
    create_time: dt.datetime
    end_time: dt.datetime | None
    events_expired: bool


@dataclass(frozen=True, slots=True)
class SubmissionRecord:
    """One submission (docs/semantics.md §7). Times tz-aware UTC.

    ``request`` is the accepted request, serialized by the API layer (opaque to the store);
    ``seq`` its order of acceptance (assigned by the store, from 1); ``error`` a serialized
    ``google.rpc.Status`` when it failed or was aborted; ``owner`` the replica that queued its
    turn, holding it while ``lease_until`` is renewed; ``principal`` who submitted it ("" when
    authentication is off): its turn runs under that principal's budgets (docs/cost.md).
    ``webhook_endpoint`` / ``webhook_url``: where its end is reported (docs/webhooks.md), a
    configured endpoint's name or a per-request URL, at most one of them; written when it is
    created (the delivery row made at its end copies them).
    """

    submission_id: str
    conversation_id: str
    idempotency_key: str | None
    state: SubmissionState
    request: bytes
    create_time: dt.datetime
    start_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    error: bytes | None = None
    seq: int = 0
    owner: str = ""
    lease_until: dt.datetime | None = None
    principal: str = ""
    webhook_endpoint: str | None = None
    webhook_url: str | None = None


@dataclass(frozen=True, slots=True)
class AddResult:
    """What :meth:`Store.add_messages` did: the conversation after the write and how many messages
    were appended (``added``), replaced in place (``updated``) or already stored with the same
    content (``unchanged``); the three add up to the number of messages given."""

    conversation: ConversationRecord
    added: int
    updated: int
    unchanged: int


def renewed_lease(turn: TurnRecord, lease_seconds: float) -> TurnRecord:
    """``turn`` with its lease running ``lease_seconds`` from now (None stays None): a turn that
    waited in the queue gets the lease it would have had had it not waited."""
    if turn.lease_until is None:
        return turn
    until = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=lease_seconds)
    return dataclasses.replace(turn, lease_until=until)


class BudgetKey(NamedTuple):
    """One budget's row (docs/cost.md, "Budgets"): ``scope`` (``turn``, ``conversation``,
    ``tenant/day``, ``tenant/month``, ``principal/day``, ``principal/month``), ``key`` (the
    request id, conversation id, tenant, or ``tenant/principal``) and
    ``period`` (``""``, or the UTC day ``2026-12-02`` / month ``2026-12`` it counts). A named
    tuple: a charge hashes, compares and sorts its keys dozens of times, in C this way."""

    scope: str
    key: str
    period: str = ""


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """A budget to charge: its ``key``, its limits (``tokens``: input plus output tokens;
    ``usd``: US dollars; None: no limit of that kind) and the ``conversation_id`` whose deletion
    removes its row (None: a tenant's or a principal's)."""

    key: BudgetKey
    tokens: int | None = None
    usd: float | None = None
    conversation_id: str | None = None

    def exhausted_by(self, spend: BudgetSpend) -> bool:
        """True when ``spend`` (spent plus reserved) leaves no room under these limits for a step
        of one token, or of any cost: the rule that refuses a new turn (docs/cost.md, "Budgets")."""
        if self.tokens is not None and spend.spent_tokens + spend.reserved_tokens >= self.tokens:
            return True
        return self.usd is not None and spend.spent_usd + spend.reserved_usd >= self.usd


@dataclass(frozen=True, slots=True)
class BudgetSpend:
    """A budget's state: what settled steps spent and running steps reserved, in tokens and US
    dollars."""

    spent_tokens: int = 0
    spent_usd: float = 0.0
    reserved_tokens: int = 0
    reserved_usd: float = 0.0


@dataclass(frozen=True, slots=True)
class BudgetAsk:
    """What a model step asks to reserve: its prompt (``prompt_tokens``, an estimate, costing
    ``prompt_usd``) plus up to ``max_output`` output tokens at ``usd_per_output_token`` each, at
    least ``min_output`` of them. Linear in the output, so the store can grant the most that
    fits every budget in the transaction that reserves it."""

    prompt_tokens: int
    prompt_usd: float
    usd_per_output_token: float
    max_output: int
    min_output: int = 1


@dataclass(frozen=True, slots=True)
class BudgetCharge:
    """One charge of turn ``request_id`` (``lease``: its fencing token, None: unfenced) against
    ``budgets``: settle what the turn reserved (its last step's actual use ``spent``, tokens and
    US dollars, None for a step that ended without usage or a dollar amount unknown: charged
    what it reserved; an earlier attempt's reservation, lost to a crash or a takeover: charged
    what it reserved), then reserve ``ask`` (None: settle only, the turn is ending)."""

    request_id: str
    conversation_id: str
    lease: TurnLease | None
    budgets: tuple[BudgetLimits, ...]
    spent: tuple[int | None, float | None] | None = None
    ask: BudgetAsk | None = None


@dataclass(frozen=True, slots=True)
class BudgetGrant:
    """What a charge reserved: ``output_tokens`` the step may produce (0 when nothing was asked
    or it was refused), the reservation (``tokens``, ``usd``), ``refused`` (the first budget with
    no room for ``ask.min_output``; nothing reserved then, the settlement still stored) and the
    budgets' states after it (``spends``), and the budgets as charged (``budgets``: a turn's own
    with the lower limits its request stored)."""

    output_tokens: int = 0
    tokens: int = 0
    usd: float = 0.0
    refused: BudgetKey | None = None
    spends: dict[BudgetKey, BudgetSpend] = field(default_factory=dict)
    budgets: tuple[BudgetLimits, ...] = ()
