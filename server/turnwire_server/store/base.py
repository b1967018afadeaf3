"""The store interface: conversations, messages and turn records.

One interface, two backends: SQLite (WAL, one process), the embedded default, and
PostgreSQL (``store/postgres/``), which several replicas share: it carries the turn lock of
:meth:`Store.turn_lock`, turn leases, cancel requests and event wake-ups across them. The
engine calls only what is here.

Durability rules (docs/semantics.md §8): :meth:`Store.start_turn` (and
:meth:`Store.admit_turn`, which starts a turn with its lock) returns only once the user's
messages are durable; :meth:`Store.finish_turn` returns only once the assistant message is
durable. Checkpoints (:meth:`Store.save_message`) may be batched by the backend (group commit)
but are applied in call order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from turnwire.types import Cost
from turnwire_client.v1 import message_pb2
from turnwire_server.store.records import (
    AddMode,
    AddResult,
    AnsweredToolCalls,
    BudgetAsk,
    BudgetCharge,
    BudgetGrant,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
    CompactionRecord,
    ConversationRecord,
    HeldTurn,
    StreamRecord,
    SubmissionRecord,
    SubmissionState,
    ToolCallAnswer,
    ToolCallAnswerKind,
    TurnAdmission,
    TurnLease,
    TurnRecord,
    TurnState,
    renewed_lease,
)
from turnwire_server.store.schedules import ScheduleStore
from turnwire_server.store.webhooks import WebhookStore

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
    "BudgetStore",
    "CompactionRecord",
    "ConversationRecord",
    "EngineStore",
    "HeldTurn",
    "MaintenanceStore",
    "ReachableStore",
    "ReplayStore",
    "ReplicaStore",
    "ScheduleStore",
    "Store",
    "StreamRecord",
    "StreamStore",
    "SubmissionRecord",
    "SubmissionState",
    "SubmissionStore",
    "ToolCallAnswer",
    "ToolCallAnswerKind",
    "TranscriptStore",
    "TurnAdmission",
    "TurnLease",
    "TurnRecord",
    "TurnRunStore",
    "TurnState",
    "TurnStore",
    "renewed_lease",
]


@runtime_checkable
class TranscriptStore(Protocol):
    """Conversations and their messages, read and written outside a turn (the API's transcript RPCs,
    compaction, tool-call answers)."""

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record, or ``None`` when it does not exist."""
        ...

    async def list_conversations(
        self, page_size: int, page_token: str, *, id_prefix: str = ""
    ) -> tuple[list[ConversationRecord], str]:
        """One page of conversations, most recently updated first; with ``id_prefix`` only those
        whose id starts with it (the API's tenant scope, api/tenancy.py).

        Returns the records and the next page token ("" on the last page).
        Raises :class:`InvalidPageToken` for a token it did not issue, whatever the
        token holds (never another error: the API reports it as the client's mistake).
        """
        ...

    async def load_messages(self, conversation_id: str) -> Sequence[message_pb2.Message]:
        """All messages of the conversation, oldest first (empty when none). Read-only: the
        messages may be shared with other readers and later reads (the SQL stores hand out their
        kept objects, ``store/core/message_cache.py``); copy one (``CopyFrom``) to change it."""
        ...

    async def partial_replies(self, conversation_id: str) -> dict[str, TurnRecord]:
        """``{assistant message id: its latest turn}`` for each reply whose latest turn (a
        continuation writes the same message) is ``running``, ``aborted``, ``error`` or
        ``interrupted``; complete replies are absent. One read."""
        ...

    async def conversation_cost(self, conversation_id: str) -> Cost | None:
        """What the conversation's ended turns cost together (``TurnRecord.cost_usd``), their
        sources joined by ``, `` in the order the turns started; None when one of them has an
        unknown cost or none has ended (docs/cost.md). One read."""
        ...

    async def turns_without_reply(self, conversation_id: str, limit: int) -> list[TurnRecord]:
        """The conversation's turns that are ``running``, ``aborted``, ``error`` or
        ``interrupted`` and whose assistant message does not exist (none stored yet, none
        before the turn ended, or removed by a rollback): the ``limit`` (>= 1) most recently
        started, oldest first (ties by request id). [] for an unknown conversation. One
        read, index-served (docs/semantics.md §5)."""
        ...

    async def list_turns(
        self, conversation_id: str, page_size: int, page_token: str, *, failed_only: bool = False
    ) -> tuple[list[TurnRecord], str]:
        """Up to ``page_size`` (>= 1) of the conversation's turns, most recently started first
        (ties by request id, descending), with their cost and timeline; only those that ended
        ``error``, ``aborted`` or ``interrupted`` with ``failed_only``. Returns the records and
        the next page's token ("" on the last page; pass "" for the first). Served by the
        ``turns_by_conversation`` index. Raises :class:`InvalidPageToken` for a token not issued
        for this listing, :class:`ValueError` when ``page_size`` < 1."""
        ...

    async def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        *,
        mode: AddMode,
        allow_missing: bool,
        replace_only: Collection[str] = (),
    ) -> AddResult:
        """Write ``messages`` into the transcript without a turn (docs/semantics.md §1, AddMessages).

        One transaction, all or nothing. New ids are appended in order. A stored id with the same
        role and parts counts as unchanged; with other content it is :class:`MessageIdConflict`
        in ``append`` mode and replaced in place (same position) in ``upsert`` mode, except the
        assistant message of a ``running`` turn (:class:`MessageBeingWritten`). Raises
        :class:`ConversationNotFound` when the conversation does not exist and not
        ``allow_missing`` (then it is created), :class:`ValueError` for a message without parts
        or an id repeated within ``messages``, and :class:`UnknownMessage` when an id of
        ``replace_only`` is not stored (those may replace, never be appended). Takes no turn lock.
        """
        ...

    async def answer_tool_calls(
        self,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        *,
        expired_before: dt.datetime | None,
    ) -> AnsweredToolCalls:
        """Record the client's ``answers`` into the assistant message holding the calls, atomically
        (docs/semantics.md §6, §12).

        One read-modify-write, applied alone: of concurrent calls answering the calls of one
        message, exactly one gets ``completed`` (the one that answered the last waiting call),
        so exactly one continuation runs. A client result needs a client call in
        ``input-available``; an approval answer a call in ``approval-requested``; either way no
        user message may follow the call's message (moved past). ``expired_before``: a call
        whose message was created before it has expired (None: no expiry).

        Raises, storing nothing: :class:`ToolCallNotFound`, :class:`ToolCallNotPending`,
        :class:`ToolCallExpired`, :class:`ToolCallsSpanMessages`; :class:`ValueError` for an
        empty ``answers``.
        """
        ...

    async def fork_conversation(
        self, conversation_id: str, message_id: str, fork_id: str
    ) -> ConversationRecord:
        """Create conversation ``fork_id`` holding ``conversation_id``'s history up to and
        including message ``message_id`` without copying it (O(1) rows, whatever the history's
        length), with the source's compaction when it covers only those messages; later changes
        on either side are copy-on-write (docs/forks.md). Returns the new conversation's record.

        Raises, storing nothing: :class:`ForkSourceNotFound`, :class:`ConversationExists` when
        ``fork_id`` is a conversation, :class:`ForkPointNotFound` when ``message_id`` is not in
        the source's history.
        """
        ...

    async def load_compaction(self, conversation_id: str) -> CompactionRecord | None:
        """The conversation's latest compaction, None when it has none. Raises
        :class:`StoreCorrupted` when it cannot be decoded."""
        ...

    async def save_compaction(self, record: CompactionRecord) -> None:
        """Durably make ``record`` its conversation's compaction (replacing the previous one).
        A no-op when the conversation no longer exists (it was deleted meanwhile)."""
        ...


@runtime_checkable
class TurnStore(Protocol):
    """A turn's lifecycle: its lock, its start (the input durable), checkpoints, its end."""

    def admit_turn(
        self,
        turn: TurnRecord,
        messages: Sequence[message_pb2.Message],
        *,
        lease_seconds: float,
        read_compaction: bool,
        queued: Callable[[bool], None],
        first: bool = False,
        budget: BudgetCharge | None = None,
    ) -> AbstractAsyncContextManager[TurnAdmission]:
        """Hold the conversation's turn lock and start ``turn`` in it: :meth:`turn_lock` (for
        ``turn.request_id``, held by ``turn.owner``) and then :meth:`start_turn`, released on
        exit; what that commit read comes back as a :class:`TurnAdmission` (with the compaction
        record when ``read_compaction``).

        ``budget`` (a :meth:`BudgetStore.charge_budget` with an ask, no settlement: the turn's
        first step's reservation) rides the input's commit, its grant in
        ``TurnAdmission.budget`` (None without ``budget``). It never refuses the admission: a
        grant that was refused reserved nothing (docs/cost.md, "What it costs per request").

        The backend may do both in one step: PostgreSQL takes the ticket, checks that it heads
        the queue, writes the input and reads the history in one transaction sent in one flight
        (one round trip before the model call), and takes the waiting path only when turns are
        ahead. ``queued(True)`` is called (in the caller's task) when the turn starts waiting for
        them, ``queued(False)`` once it holds the lock and its input is being written: in between
        the caller may cancel it, before and after not (the input's commit must not be cut
        short). ``queued`` may raise :class:`asyncio.CancelledError` to give up before waiting.
        A turn that waited has ``lease_until`` renewed to ``lease_seconds`` from its start.
        ``first`` puts it first in line as :meth:`turn_lock` does.
        Raises what :meth:`start_turn` and :meth:`turn_lock` raise (nothing stored, the lock
        released).
        """
        ...

    def turn_lock(
        self,
        conversation_id: str,
        *,
        request_id: str = "",
        owner: str = "",
        lease_seconds: float = 30.0,
        first: bool = False,
    ) -> AbstractAsyncContextManager[None]:
        """Hold the conversation's turn lock: one turn at a time, first in, first out.

        The SQLite backend holds it in the process (one process per database file). The
        PostgreSQL backend holds it across replicas: a ticket for ``request_id`` held by
        ``owner`` (whose leases :meth:`renew_leases` renews), lapsing ``lease_seconds`` after its
        last renewal if the owner dies. ``first`` waits right behind the holder and the places
        taken ``first`` before it, ahead of everyone else waiting (new input that interrupted or
        rolled back the running turn runs next, docs/semantics.md §5).
        """
        ...

    async def start_turn(
        self, turn: TurnRecord, messages: Sequence[message_pb2.Message]
    ) -> Sequence[message_pb2.Message] | None:
        """Durably create the conversation if needed, append ``messages`` and record ``turn``.

        One transaction. Returns the conversation's messages as it left them when the backend
        reads them without a round trip of their own (PostgreSQL: in the commit's flight), else
        None (SQLite: a read inside its single writer's transaction would hold up every other
        write; the caller loads them). Raises :class:`MessageIdConflict` (and stores nothing)
        when a message id already exists in the conversation.
        """
        ...

    async def save_message(
        self, conversation_id: str, message: message_pb2.Message, *, lease: TurnLease | None = None
    ) -> None:
        """Insert or replace ``message`` (by id): the checkpoint of a streaming reply.

        With a turn's ``lease`` the write belongs to that turn and is a no-op once no turn of that
        id is recorded: a checkpoint that lands after its conversation was deleted never brings
        the conversation back (docs/semantics.md §12, deleting); it raises :class:`LeaseLost`
        (writing nothing) once another replica took the turn over (docs/semantics.md §5,
        "Fencing").
        """
        ...

    async def finish_turn(
        self,
        turn: TurnRecord,
        message: message_pb2.Message | None,
        *,
        events: Sequence[tuple[int, bytes]] = (),
        stream_ended: bool = False,
        budget: BudgetCharge | None = None,
    ) -> BudgetGrant | None:
        """Durably store the final assistant ``message`` (when given) and ``turn``'s end state,
        with the last ``events`` of its stream, as :meth:`StreamStore.append_events` stores them
        (``stream_ended``: they hold its TurnEnd), and ``budget``'s settlement (a
        :meth:`BudgetStore.charge_budget` without an ask) in one transaction: a turn recorded
        ended always has its stream up to there (docs/semantics.md §8, resumable streams), and
        its budgets settled (docs/cost.md, "Budgets"). Returns the settlement's grant (None
        without ``budget``).

        Raises :class:`TurnNotFound` (storing nothing) when no turn ``turn.request_id`` is
        recorded, e.g. because its conversation was deleted while it ran, :class:`LeaseLost`
        (storing nothing) when ``turn.lease`` is no longer the stored turn's (another replica
        took it over, docs/semantics.md §5, "Fencing"), and :class:`ValueError` for events
        ``append_events`` refuses.
        """
        ...

    async def discard_reply(self, turn: TurnRecord, message_id: str) -> None:
        """Durably remove the partial reply ``message_id`` of ``turn`` (an overflowed attempt's,
        docs/semantics.md §9: never kept) and record ``turn.assistant_message_id`` (the next
        attempt's reply id) and ``turn.recovery_count``; one transaction. A missing message is
        not an error. Raises :class:`TurnNotFound` (changing nothing) when no turn
        ``turn.request_id`` is recorded, :class:`LeaseLost` as :meth:`finish_turn` does."""
        ...

    async def roll_back_turn(
        self,
        turn: TurnRecord,
        message_ids: Sequence[str],
        *,
        events: Sequence[tuple[int, bytes]] = (),
        stream_ended: bool = False,
    ) -> None:
        """ROLLBACK (docs/semantics.md §5, §12): durably remove the messages ``message_ids`` of
        ``turn``'s conversation (its input and its reply; missing ones are skipped) and record
        ``turn``'s end state and error (ending its submission too), with the last ``events`` of
        its stream as :meth:`finish_turn` stores them, in one transaction. Raises
        :class:`TurnNotFound` (changing nothing) when no turn ``turn.request_id`` is recorded,
        :class:`LeaseLost` as :meth:`finish_turn` does."""
        ...

    async def get_turn(self, request_id: str) -> TurnRecord | None:
        """The turn recorded under ``request_id``, or None."""
        ...


@runtime_checkable
class StreamStore(Protocol):
    """A turn's event stream, kept for ResumeTurn (docs/semantics.md §8)."""

    async def append_events(
        self,
        conversation_id: str,
        request_id: str,
        events: Sequence[tuple[int, bytes]],
        *,
        ended: bool,
        lease: TurnLease | None = None,
    ) -> None:
        """Durably store ``events`` (``(sequence_number, serialized TurnEvent)``, ascending) of
        a turn's stream, creating the stream on its first batch; ``ended`` marks the batch
        holding its TurnEnd. A batch starting at sequence number 1 for a stream that already
        ended replaces it (a retry under the same request id). With the turn's ``lease`` it
        raises :class:`LeaseLost` (storing nothing) once another replica took the turn over
        (docs/semantics.md §5, "Fencing")."""
        ...

    async def get_stream(self, request_id: str) -> StreamRecord | None:
        """The stream of ``request_id``, or None when none was stored (or it was deleted)."""
        ...

    async def load_events(self, request_id: str, after: int, before: int | None = None) -> list[bytes]:
        """Serialized events with ``after < sequence_number < before`` (no upper bound when
        ``before`` is None), in order."""
        ...

    async def wait_for_events(self, request_id: str, after: int, timeout_seconds: float) -> bool:
        """Wait until turn ``request_id`` has stored events past ``after`` or ended, at most
        ``timeout_seconds`` (a reader following a turn another replica runs). False when this
        store cannot follow other processes (one process per store: nothing else writes)."""
        ...


@runtime_checkable
class SubmissionStore(Protocol):
    """Submissions: accepted requests whose turns run detached (docs/semantics.md §7)."""

    async def create_submission(
        self, submission: SubmissionRecord, *, max_open: int
    ) -> tuple[SubmissionRecord, bool]:
        """Store ``submission`` (state ``pending``) unless it repeats one: returns the stored
        record and True when created, the existing one and False when the id or the
        (conversation, idempotency key) is already stored with the same request.

        A new submission takes its place in the conversation's turn queue at once (its turn's
        :meth:`turn_lock`, passed its id as ``request_id``, holds from that place, whichever
        replica runs it), so submissions run first in, first out by acceptance with the other
        turns of the conversation; a place :meth:`reserve_place` took under its id already (a
        REJECT submission, admitted only on an idle conversation) is that place, kept with the
        submission's owner and lease. ``submission.owner`` empty: no replica runs it yet, any may
        claim it (:meth:`claim_pending_submissions`); its place is kept meanwhile and given up
        when it ends without running (:meth:`end_submission`, :meth:`expire_submissions`,
        :meth:`delete_conversation`).

        Raises :class:`SubmissionConflict` when the id and the key name different
        submissions or the id is stored with another request, :class:`TooManySubmissions`
        past ``max_open`` pending or running submissions on the conversation. One
        transaction: concurrent duplicates create one submission.
        """
        ...

    async def get_submission(self, submission_id: str) -> SubmissionRecord | None:
        """The submission, or None."""
        ...

    async def list_submissions(
        self,
        page_size: int,
        page_token: str,
        *,
        conversation_id: str = "",
        state: str = "",
        id_prefix: str = "",
    ) -> tuple[list[SubmissionRecord], str]:
        """One page of submissions in acceptance order, optionally of one conversation and
        state, and of conversations whose id starts with ``id_prefix``; the next page token ("" on
        the last page). Raises :class:`InvalidPageToken` for a token not issued for these filters.

        A token names the page's last submission by its id less ``id_prefix`` (the API's
        submission keys carry their tenant's prefix, as conversation keys do) and its create
        time, never by anything of the rest of the store (``seq``)."""
        ...

    async def end_submission(
        self, submission_id: str, state: SubmissionState, error: bytes | None, *, only_from: Sequence[str]
    ) -> SubmissionRecord | None:
        """Set the submission's final ``state`` (and end time, error) when its current state is
        in ``only_from``; returns the record as stored afterwards (changed or not), None when
        it does not exist."""
        ...

    async def expire_submissions(self, before: dt.datetime, limit: int, error: bytes) -> list[str]:
        """End up to ``limit`` (>= 1) submissions still ``pending`` that were accepted before
        ``before`` (tz-aware) as ``error`` with ``error`` (a serialized ``google.rpc.Status``);
        returns their ids (docs/semantics.md §12: pending submissions expire)."""
        ...

    async def claim_pending_submissions(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[SubmissionRecord]:
        """Take over up to ``limit`` (>= 1) pending submissions that no replica claimed (accepted
        by one without a free slot) or whose replica died (lease lapsed before ``now``; with
        SQLite: any other owner), giving them ``owner`` and ``lease_until`` atomically (each goes
        to one claimant); in acceptance order. The caller starts their turns."""
        ...

    def submission_offers(self) -> AsyncIterator[None]:
        """A wake-up whenever another replica accepted a submission it left unclaimed (it had no
        free slot), so a replica with one may claim it (never ends; nothing for a store served
        by one process, which knows what it left unclaimed)."""
        ...


@runtime_checkable
class ReplicaStore(Protocol):
    """What processes sharing the store need of each other: the turn queue's places, leases, recovery
    of turns a dead owner ran, cancel requests."""

    async def running_turns(self) -> list[TurnRecord]:
        """Turns still recorded as ``running`` (after a crash, to recover)."""
        ...

    async def ended_turns_marked(
        self, mark: str, since: dt.datetime, limit: int, after: tuple[dt.datetime, str] | None = None
    ) -> list[TurnRecord]:
        """Up to ``limit`` (>= 1) ended turns whose conversation id contains ``mark`` (a
        sub-agent's: ``:sub-``) and whose stream ended at or after ``since`` with its events
        still kept (``durability.event_retention_seconds``), oldest end first (ties by request
        id), after the turn ``after`` (its end time and request id; None: from the first). For
        the start-up's delivery of detached sub-agents' answers (docs/subagents.md, "Detached
        sub-agents"). Raises :class:`ValueError` for a ``mark`` holding ``%``, ``_`` or ``\\``, or
        ``limit`` < 1."""
        ...

    async def renew_leases(self, owner: str, until: dt.datetime) -> list[HeldTurn]:
        """Extend to ``until`` the lease of every running turn (and pending submission, queue
        ticket) ``owner`` holds, in one statement each
        (docs/semantics.md §8: a replica renews its leases in a batch, not per turn). Returns the
        running turns ``owner`` holds (their tokens and starts), so that the replica gives up the
        leases of those it does not run (:meth:`release_leases`)."""
        ...

    async def release_leases(self, turns: Sequence[HeldTurn]) -> None:
        """Give up the leases of ``turns`` (as a renewal found them), in one transaction: each
        turn still running under that token (owner and epoch) and that start (``start_time``)
        gets no owner and no lease, so the next claim of any replica (its former owner too)
        recovers it; others, and turns never stored, are left as they are. For a turn ``running``
        under its owner's lease that its owner does not run (its end could not be stored, its
        input's commit or its claim was cut off, its recovery failed to start): its owner would
        otherwise renew its lease while nothing runs it (docs/operate/outages.md)."""
        ...

    async def claim_interrupted_turns(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[TurnRecord]:
        """Take over up to ``limit`` (>= 1) running turns whose process died, for recovery: each is
        given ``owner`` and ``lease_until`` atomically, so a turn is claimed by one replica only.

        A turn is interrupted when its lease lapsed before ``now`` (or it has none). The embedded
        SQLite store serves one process (its file lock proves the others dead), so there every
        running turn another owner holds is interrupted, whatever its lease.
        """
        ...

    async def request_cancel(self, request_id: str, *, stop: str = "") -> bool:
        """Ask whichever replica runs or queues turn ``request_id`` to cancel it (``CancelChat``
        reaching another replica; ``stop`` is an opaque reason the engine passes along, "" for a
        plain cancel). True when such a turn was found elsewhere; a store served by one process
        has no elsewhere and answers False."""
        ...

    def cancel_requests(self) -> AsyncIterator[tuple[str, str]]:
        """``(request id, stop reason)`` of each cancel other replicas asked for, as they come
        (never ends; nothing for a store served by one process)."""
        ...

    async def queue_head(self, conversation_id: str) -> str | None:
        """The request id (or submission id) that holds the conversation's turn lock, else the
        first one waiting for it or holding a reserved place; None when nobody does. Sees every
        replica's turns on a shared store (docs/semantics.md §5, new input while a turn runs)."""
        ...

    async def reserve_place(
        self,
        conversation_id: str,
        request_id: str,
        *,
        owner: str,
        lease_seconds: float,
        first: bool = False,
        only_if_idle: bool = False,
    ) -> str | None:
        """Take ``request_id``'s place in the conversation's line now, for the :meth:`turn_lock` or
        :meth:`admit_turn` that later names it (it holds from that place; a place already taken
        under that id is kept, or moved up by ``first``). ``first`` as :meth:`turn_lock`'s, so
        new input that stops the running turn is next before the stop lets the lock go
        (docs/semantics.md §5). ``only_if_idle`` (REJECT) takes it only when nobody holds, waits
        for or reserved the lock, decided atomically with taking it (across replicas: under the
        queue's lock); then returns the id heading the line (``""`` when unnamed) and takes
        nothing. Returns None when the place was taken. A place no lock took over must be given
        up with :meth:`release_place`."""
        ...

    async def release_place(self, conversation_id: str, request_id: str) -> None:
        """Give up ``request_id``'s place in the conversation's line if it still has one (a
        :meth:`reserve_place` whose turn never took the lock); a no-op otherwise. A store that
        leases places retries a failed release in the background until it commits (a place left
        behind, its lease renewed, would hold the line)."""
        ...


@runtime_checkable
class BudgetStore(Protocol):
    """Budgets in tokens and US dollars (docs/cost.md, "Budgets"): what turns spent and what
    their running steps reserved, per budget row (:class:`BudgetKey`)."""

    async def charge_budget(
        self, charge: BudgetCharge, *, checkpoint: message_pb2.Message | None = None
    ) -> BudgetGrant:
        """Settle turn ``charge.request_id``'s reservations and reserve ``charge.ask`` against
        every budget of ``charge.budgets``, in one transaction that locks their rows, so charges
        from several replicas for one budget take turns and never both reserve its last room
        (:class:`BudgetCharge` says how each reservation settles; a lost attempt's is settled
        once, at what it reserved). Refused (nothing reserved, the settlement stored) when a
        budget has no room for ``ask.min_output`` output tokens. A ``turn`` budget keeps its
        stored limits where lower than the given ones (a request's lowered budget holds for its
        recovery). With ``checkpoint``, the running turn's reply so far is stored in the same
        transaction, as :meth:`TurnStore.save_message` with ``charge.lease`` stores it (a step's
        checkpoint carries the next step's reservation: docs/cost.md, "What it costs").
        Raises :class:`LeaseLost` (writing nothing) when ``charge.lease`` is no longer the
        turn's; a turn no longer recorded is charged nothing (and its checkpoint not stored)."""
        ...

    async def budget_spends(self, keys: Sequence[BudgetKey]) -> dict[BudgetKey, BudgetSpend]:
        """The states of the budgets ``keys`` that were ever charged (others are at zero). One
        read, no lock: an admission check, which the next charge confirms under the rows' locks."""
        ...


@runtime_checkable
class MaintenanceStore(Protocol):
    """Deletion and retention."""

    async def delete_conversation(self, conversation_id: str, *, with_forks: bool = False) -> bool:
        """Delete the conversation with its messages, parts, turns, turn streams and their events,
        submissions and budgets (its own and its turns'), in one transaction. False when there was
        nothing to delete.

        Rows of other tables that name the conversation (streams, submissions) go even when the
        conversation row itself is missing. The caller stops the conversation's turns first
        (docs/semantics.md §12, deleting). Its forks stay readable: what they shared with it
        becomes theirs, an O(shared messages) copy in the same transaction; ``with_forks``
        deletes every conversation forked from it, directly or not, too (docs/forks.md).
        """
        ...

    async def fork_descendants(self, conversation_id: str) -> list[str]:
        """Ids of the conversations forked from ``conversation_id``, directly or through other
        forks, sorted (docs/forks.md). One index-served read."""
        ...

    async def expired_conversations(self, before: dt.datetime, limit: int) -> list[str]:
        """Ids of up to ``limit`` (>= 1) conversations last updated before ``before`` (tz-aware)
        that have no ``running`` turn, least recently updated first (retention, §12)."""
        ...

    async def expire_events(self, before: dt.datetime, limit: int) -> int:
        """Delete the stored events of up to ``limit`` (>= 1) turn streams that ended before
        ``before`` (tz-aware) and mark them ``events_expired`` (the stream row stays, so a resume
        can say it is past retention). Returns how many streams were expired."""
        ...

    async def expire_pending_tool_calls(self, cutoff: dt.datetime) -> int:
        """Give every call still waiting for the client (a client call without a result, an
        approval request) whose assistant message was created before ``cutoff`` an errored
        result naming the expiry, so the model is told (docs/semantics.md §12). Returns how many
        calls expired. The maintenance loop calls it periodically."""
        ...


@runtime_checkable
class TurnRunStore(TurnStore, TranscriptStore, BudgetStore, Protocol):
    """What a running turn uses (``engine/turn.py``, ``engine/step_loop.py``): its lifecycle, its
    conversation's transcript and its budgets."""


@runtime_checkable
class ReplayStore(StreamStore, TurnStore, TranscriptStore, Protocol):
    """What following a turn's events uses (``engine/resume.py``): its stream, its record when
    it has no stream yet, and its record and reply when its stream lacks a TurnEnd."""


@runtime_checkable
class EngineStore(
    TranscriptStore,
    TurnStore,
    StreamStore,
    SubmissionStore,
    ReplicaStore,
    MaintenanceStore,
    BudgetStore,
    Protocol,
):
    """Every role, for the engine that hands each collaborator the role it uses; opening and
    closing the store are the application's (:class:`Store`)."""


@runtime_checkable
class ReachableStore(Protocol):
    """A store that knows when its database is gone (PostgreSQL: the listener's round trips,
    docs/operate/outages.md); the application reports it on the health service. A store
    without it (SQLite: a file, never "gone") counts as always reachable."""

    @property
    def reachable(self) -> bool:
        """False while the database is known unreachable (work is refused at once meanwhile)."""
        ...


@runtime_checkable
class Store(EngineStore, ScheduleStore, WebhookStore, Protocol):
    """Persistence for conversations, messages and turns.

    The union of the role protocols above (the engine's collaborators take the role they use),
    plus opening and closing. All methods raise :class:`StoreError` (or a subclass) when the
    backend fails. Messages are ``turnwire.v1.Message`` protos and round-trip
    losslessly.
    """

    async def open(self) -> None:
        """Connect and run pending schema migrations."""
        ...

    async def close(self) -> None:
        """Flush pending writes and disconnect."""
        ...
