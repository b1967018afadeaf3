"""A new turn's budget check at its admission (docs/cost.md, "Budgets"): where it runs and how its
refusal reaches ``TurnEngine.start``'s caller.

On a conversation with no turn running or waiting in this process, and for input that stops
none, the check rides the transaction that stores the turn's input (``Store.admit_turn``'s
``refuse``), and ``start`` waits for that commit (:meth:`BudgetGate.checked`), so a refusal is
still raised before it returns; a turn that has to wait in line is checked by a read meanwhile.
Elsewhere the check is that read before the turn queues (:meth:`BudgetGate.refuse_if_spent`), so
a refusal never waits for the running turn, nor stops it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable

from turnwire.types import Usage
from turnwire_server.engine.budget_admission import count_refusal, spent_budget
from turnwire_server.engine.errors import BudgetRefused
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.settings import EngineSettings
from turnwire_server.engine.tracing import Tracing
from turnwire_server.engine.turn_base import BudgetCheck
from turnwire_server.engine.turn_handle import TurnHandle
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.budgets import BudgetStore

__all__ = ["BudgetGate"]


class BudgetGate:
    """The engine's budget check of new turns. ``busy(conversation_id)``: whether a turn of the
    conversation runs or waits in this process (asked at each check)."""

    def __init__(
        self,
        store: BudgetStore,
        settings: EngineSettings,
        providers: ProviderRegistry,
        tracing: Tracing,
        busy: Callable[[str], bool],
    ) -> None:
        self._store = store
        self._settings = settings
        self._providers = providers
        self._tracing = tracing
        self._busy = busy

    def rides_admission(self, request: TurnRequest) -> bool:
        """Whether ``request``'s check rides its admission rather than a read before it queues:
        no turn of its conversation runs or waits here, its input would stop none (interrupt and
        rollback stop the running turn before the new one is admitted), and its input is stored
        as it takes the lock (a conditional continuation reads the history first)."""
        strategy = request.concurrent_input or self._settings.limits.concurrent_input
        return (
            not request.skip_unless
            and strategy not in ("interrupt", "rollback")
            and not self._busy(request.conversation_id)
        )

    async def _spent(self, request: TurnRequest) -> BudgetRefused | None:
        """The check as a read (:func:`spent_budget`): the refusal, not counted yet."""
        return await spent_budget(
            self._store,
            self._settings.budgets,
            request.conversation_id,
            request.principal,
            dt.datetime.now(dt.UTC),
        )

    async def refuse_if_spent(self, request: TurnRequest) -> None:
        """The check as a read of its own, before the turn queues: raises its
        :class:`BudgetRefused` (counted), the turn's span recorded as refused when tracing is on."""
        refusal = await self._spent(request)
        if refusal is None:
            return
        count_refusal(refusal, request.conversation_id)
        tracing = self._tracing
        if tracing.enabled:
            with tracing.turn(request, self._providers.resolve(request.model)[0], attempt=1) as span:
                tracing.end_turn(span, outcome="refused", usage=Usage(), error=refusal)
        raise refusal

    async def checked(self, handle: TurnHandle, check: asyncio.Future[BudgetCheck]) -> None:
        """Wait for the check riding ``handle``'s admission (it answers once the input is stored,
        or the turn waits in line, or it ended otherwise); raises its :class:`BudgetRefused` once
        the refused turn has ended, so nothing of it is left. A turn that waits in line (behind a
        place this process holds for a submission or a recovery, or another replica's turn) is
        checked by a read meanwhile, so a spent budget refuses it at once while it still waits
        (:meth:`~.turn_base.TurnRunBase.refuse_queued`); when its turn came first, its
        admission's own check decides, and its stream tells. A caller cancelled meanwhile lets
        the turn go as a caller that hangs up does (:meth:`TurnHandle.release`: cancelled, or
        left running when its request asked to continue without its caller)."""
        run = handle.run
        try:
            outcome = await asyncio.shield(check)
            if outcome == "waiting":
                refusal = await self._spent(run.request)
                outcome = refusal if refusal is not None and run.refuse_queued(refusal) else "admitted"
        except asyncio.CancelledError:
            handle.release()
            raise
        if isinstance(outcome, BudgetRefused):
            await asyncio.wait({handle.task})
            raise outcome
