"""The store's replica role: what processes sharing the store need of each other, the turn
queue's places, leases, recovery of turns a dead owner ran, cancel requests (docs/semantics.md §5,
§8)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Sequence
from typing import Protocol, runtime_checkable

from turnwire_server.store.records import HeldTurn, TurnRecord

__all__ = ["ReplicaStore"]


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
