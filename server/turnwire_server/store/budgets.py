"""The store's budget role: what turns spent and reserved against each budget, charged under
the budget rows' locks (docs/cost.md, "Budgets")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from turnwire_client.v1 import message_pb2
from turnwire_server.store.records import BudgetCharge, BudgetGrant, BudgetKey, BudgetSpend

__all__ = ["BudgetStore"]


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
