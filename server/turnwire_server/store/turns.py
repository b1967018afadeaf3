"""The store's turn role: a turn's lifecycle, its lock, its start (the input durable),
checkpoints, its end.

Durability rules (docs/semantics.md §8): :meth:`TurnStore.start_turn` (and
:meth:`TurnStore.admit_turn`, which starts a turn with its lock) returns only once the user's
messages are durable; :meth:`TurnStore.finish_turn` returns only once the assistant message is
durable. Checkpoints (:meth:`TurnStore.save_message`) may be batched by the backend (group
commit) but are applied in call order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Protocol, runtime_checkable

from turnwire_client.v1 import message_pb2
from turnwire_server.store.records import (
    BudgetCharge,
    BudgetGrant,
    BudgetLimits,
    TurnAdmission,
    TurnLease,
    TurnRecord,
)

__all__ = ["TurnStore"]


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
        refuse: Sequence[BudgetLimits] = (),
    ) -> AbstractAsyncContextManager[TurnAdmission]:
        """Hold the conversation's turn lock and start ``turn`` in it: :meth:`turn_lock` (for
        ``turn.request_id``, held by ``turn.owner``) and then :meth:`start_turn`, released on
        exit; what that commit read comes back as a :class:`TurnAdmission` (with the compaction
        record when ``read_compaction``).

        ``budget`` (a :meth:`BudgetStore.charge_budget` with an ask, no settlement: the turn's
        first step's reservation) rides the input's commit, its grant in
        ``TurnAdmission.budget`` (None without ``budget``). A grant that was refused reserved
        nothing (docs/cost.md, "What it costs per request"). ``refuse``: budgets whose exhaustion
        refuses the turn, checked in the same transaction on the rows the charge takes (or read
        for the check alone): one exhausted (:meth:`BudgetLimits.exhausted_by`), or one of them
        without room for ``budget``'s ask (the first step would end the turn, unsent), raises
        :class:`~turnwire_server.store.errors.BudgetSpent`, nothing stored (the engine's check of
        a new turn's budgets, ``budget_writes.raise_spent``; docs/cost.md, "Budgets").

        The backend may do both in one step: PostgreSQL takes the ticket, checks that it heads
        the queue, writes the input and reads the history in one transaction sent in one flight
        (one round trip before the model call), and takes the waiting path only when turns are
        ahead. ``queued(True)`` is called (in the caller's task) when the turn starts waiting for
        them, ``queued(False)`` once it holds the lock and its input is being written (neither
        when it did not wait): in between the caller may cancel it, before and after not (the
        input's commit must not be cut short). ``queued`` may raise
        :class:`asyncio.CancelledError` to give up before waiting.
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
        reads them without a round trip of their own (PostgreSQL: in the commit's flight;
        SQLite: in its writer's transaction when they are few, a new conversation or one whose
        messages the process holds), else None (the caller loads them). Raises
        :class:`MessageIdConflict` (and stores nothing) when a message id already exists in the
        conversation.
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
