"""The store's maintenance role: deleting conversations and retention (docs/semantics.md §12,
docs/forks.md)."""

from __future__ import annotations

import datetime as dt
from typing import Protocol, runtime_checkable

__all__ = ["MaintenanceStore"]


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

    async def expire_budget_periods(self, day: str, month: str, limit: int) -> int:
        """Delete up to ``limit`` (>= 1) budget rows of ended periods: UTC days before ``day``
        (``2026-12-02``) and months before ``month`` (``2026-12``), without a reservation of a
        running step on them (docs/cost.md, "Budgets"). Returns how many were deleted. Raises
        :class:`ValueError` for ``limit`` < 1 or a ``day`` or ``month`` of another form."""
        ...

    async def expire_turn_budgets(self, limit: int) -> int:
        """Delete up to ``limit`` (>= 1) rows of turns' own budgets (``turn`` scope) whose turn has
        ended, without a reservation of a running step on them (docs/cost.md, "Budgets"). Returns
        how many were deleted. Raises :class:`ValueError` for ``limit`` < 1."""
        ...

    async def expire_pending_tool_calls(self, cutoff: dt.datetime) -> int:
        """Give every call still waiting for the client (a client call without a result, an
        approval request) whose assistant message was created before ``cutoff`` an errored
        result naming the expiry, so the model is told (docs/semantics.md §12). Returns how many
        calls expired. The maintenance loop calls it periodically."""
        ...
