"""Budgets in a turn (docs/cost.md, "Budgets"): :class:`StepBudgets`, which reserves each model
step before it is sent and settles it after (which budgets apply: :mod:`.budget_scopes`; the
admission's check and first reservation: :mod:`.budget_admission`).

A step reserves its prompt (an estimate: :class:`turnwire.compaction.EstimateTokens`) plus its
``max_output_tokens`` (``budgets.assumed_max_output_tokens`` when unset), in tokens and, priced
at the model's top-tier rates (:meth:`PriceBook.rates`: the prompt uncached, or at the cache
write's rate when the step may write the prompt cache, :func:`cache_writes`), in US dollars. The store grants
the most output that fits every budget in the transaction that takes the reservation
(:meth:`~turnwire_server.store.budgets.BudgetStore.charge_budget`); the step is sent with
``max_output_tokens`` clamped to it. No room for ``budgets.min_output_tokens`` (default 1): the turn ends
(:class:`BudgetExhausted`). A model without a known price cannot be reserved against a US dollar
budget: the step is refused the same way (never counted as free).

The charges ride the turn's own writes where they can: a new turn's first reservation its
admission (:mod:`.budget_admission`), a later step's its checkpoint, the last settlement the final
write (docs/cost.md, "What it costs per request").

Hooks see the budgets' states (:func:`budget_states`) and ``before_step`` may lower a step's
budget (``StepConfig.max_step_tokens`` / ``max_step_usd``): a limit on the step's own reservation,
applied before the store's grant, so the lower of it and the turn's budgets wins (docs/cost.md,
"Budgets in hooks").
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import functools
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, cast

from prometheus_client import Gauge

from turnwire.compaction import EstimateTokens
from turnwire.providers import ModelRequest
from turnwire.types import BudgetState, Cost, Usage
from turnwire_client.v1 import message_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.budget_refusals import refusal_text, step_refusal_text
from turnwire_server.engine.budget_scopes import applies, budget_states, budgets_for, lowered, resets_in
from turnwire_server.engine.budget_settings import BudgetLimit, BudgetSettings
from turnwire_server.engine.cost import CacheWrites, PriceBook
from turnwire_server.engine.errors import BudgetExhausted, TurnFailure
from turnwire_server.engine.turn_state import TurnWorkingState
from turnwire_server.store.budgets import BudgetStore
from turnwire_server.store.records import (
    BudgetAsk,
    BudgetCharge,
    BudgetGrant,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
    TurnLease,
    TurnRecord,
)
from turnwire_server.tenant_keys import tenant_of_key

if TYPE_CHECKING:
    from turnwire_server.engine.budget_admission import FirstStepEstimates
    from turnwire_server.engine.settings import EngineSettings

__all__ = [
    "StepBudgets",
    "StepLimit",
    "abandoned_charge",
    "cache_writes",
    "covers",
    "settle",
    "step_budgets",
    "step_limit",
    "unsettled",
]

log = logging.getLogger("turnwire.budgets")

_ESTIMATE = EstimateTokens()


@dataclasses.dataclass(frozen=True, slots=True)
class StepLimit:
    """The limit ``before_step`` set on one step's own reservation: ``tokens`` (prompt plus
    output), ``usd`` (US dollars); None: no limit of that kind; 0 or less: no room."""

    tokens: int | None
    usd: float | None


def step_limit(max_step_tokens: int | None, max_step_usd: float | None) -> StepLimit | None:
    """The limit ``before_step`` set on a step's own reservation (None: none)."""
    if max_step_tokens is None and max_step_usd is None:
        return None
    return StepLimit(max_step_tokens, max_step_usd)


def _step_room(limit: StepLimit, ask: BudgetAsk) -> int:
    """The most output (at most ``ask.max_output``) whose reservation fits ``limit``, a step's
    own: below ``ask.min_output`` when it has no room (the store's rule for a budget at zero)."""
    room = ask.max_output
    if limit.tokens is not None:
        room = min(room, limit.tokens - ask.prompt_tokens)
    if limit.usd is not None:
        left_usd = limit.usd - ask.prompt_usd
        if ask.usd_per_output_token > 0:
            room = min(room, math.floor(left_usd / ask.usd_per_output_token + 1e-9))
        elif left_usd < 0:
            room = -1
    return room


def covers(grant: BudgetGrant, budgets: Sequence[BudgetLimits], ask: BudgetAsk) -> bool:
    """Whether a reservation already stored, ``grant`` (the admission's), holds a step asking
    ``ask`` under ``budgets``: the same budgets, nothing refused, and the step's prompt plus its
    whole output within what was reserved, in tokens and in US dollars."""
    if grant.refused is not None or [b.key for b in grant.budgets] != [b.key for b in budgets]:
        return False
    tokens = ask.prompt_tokens + ask.max_output
    usd = ask.prompt_usd + ask.max_output * ask.usd_per_output_token
    return tokens <= grant.tokens and usd <= grant.usd * (1 + 1e-9)


class StepBudgets:
    """One attempt's budget charges: :meth:`reserve` before each step, :meth:`used` with its
    usage after it, :meth:`close` when the attempt ends (settles the last step; a recovered
    attempt's close also settles what the lost attempt left reserved). The settlement of a step
    rides the next step's reservation; the first reservation is the admission's (``admitted``,
    its grant, used when it :func:`covers` the step; ``admitted_at``, when it was sized: its
    budgets are this attempt's for that UTC day) or a store transaction of its own, each later
    one rides the step's checkpoint (``reserve``'s ``checkpoint``), and the last settlement the
    turn's final write (:meth:`final_charge`, else :meth:`close` on its own). ``estimates`` learns
    from each step sent (:class:`~.budget_admission.FirstStepEstimates`). :meth:`states` is what
    the last charge left in the store, for the hooks (``for_hooks``: some hook's context carries
    them, ``TurnHooks.sees_budgets``; else none are built)."""

    def __init__(
        self,
        store: BudgetStore,
        settings: BudgetSettings,
        prices: PriceBook,
        *,
        request_id: str,
        conversation_id: str,
        lease: TurnLease | None,
        turn_limit: BudgetLimit,
        recovered: bool,
        principal: str = "",
        admitted: BudgetGrant | None = None,
        admitted_at: dt.datetime | None = None,
        estimates: FirstStepEstimates | None = None,
        for_hooks: bool = True,
    ) -> None:
        self.store = store
        self.settings = settings
        self.prices = prices
        self.request_id = request_id
        self.conversation_id = conversation_id
        self.lease = lease
        self.turn_limit = turn_limit
        self.principal = principal
        self._tenant = tenant_of_key(conversation_id)
        # Something may be reserved under this turn: a step of this attempt, or (recovered) of
        # the attempt a crash or a takeover cut off.
        self._open = recovered
        self._recovered = recovered
        self._spent: tuple[int | None, float | None] | None = None
        self._prompt: tuple[int, float] = (0, 0.0)  # the reserved step's prompt: tokens, US dollars
        # The budgets as the last charge stored them, and their states then (for the hooks).
        self._seen: tuple[tuple[BudgetLimits, ...], dict[BudgetKey, BudgetSpend]] | None = None
        self._final: BudgetCharge | None = None  # the final write's settlement, once asked for
        self._estimates = estimates
        self._for_hooks = for_hooks
        self._scoped: tuple[dt.date, tuple[BudgetLimits, ...]] | None = None  # _budgets' last answer
        self._admitted: BudgetGrant | None = None  # the admission's reservation, until a step takes it
        if admitted is not None:
            if admitted.budgets and admitted_at is not None:
                # The admission charged the budgets _budgets names (the same request, that day's
                # periods): not worked out again for its steps.
                self._scoped = (admitted_at.astimezone(dt.UTC).date(), admitted.budgets)
            self._charged(admitted.budgets, None, admitted, gauges=False)
            self._open = admitted.refused is None
            if self._open:
                self._admitted = admitted
                self._spent = (0, 0.0)  # nothing sent on it yet: settled at zero unless a step takes it

    async def reserve(
        self,
        request: ModelRequest,
        model_id: str,
        provider_type: str | None,
        provider: object,
        *,
        step: StepLimit | None = None,
        checkpoint: Callable[[], Awaitable[message_pb2.Message | None]] | None = None,
    ) -> ModelRequest:
        """``request`` with ``max_output_tokens`` clamped to what every budget, and the step's
        own limit ``step`` (``before_step``'s), has room for, its reservation stored. Raises
        :class:`BudgetExhausted` (nothing reserved, the last step settled; as a
        :class:`TurnFailure` at stage ``step``) when a budget has no room for
        ``min_output_tokens`` of output, or a US dollar budget applies and ``model_id`` has no
        known price; :class:`LeaseLost` as every turn write does. ``request`` as it is, and no
        write, when no budget nor ``step`` applies to the turn and nothing is reserved (see
        :meth:`writes`); no write (``request`` clamped) when only ``step`` does.
        ``checkpoint()``, when given, is the reply so far (awaited: :meth:`Checkpointer.take`),
        stored in the charge's transaction (the step's checkpoint carries its reservation);
        called only when the charge is written."""
        now = dt.datetime.now(dt.UTC)
        budgets = self._budgets(now)
        if not budgets and not self._open and step is None:
            return request  # none applies (a principal's, authentication off): nothing to write
        asked = request.settings.max_output_tokens
        max_output = asked if asked is not None else self.settings.assumed_max_output_tokens
        rates = self.prices.rates(model_id, provider_type, cache_writes(provider, request))
        priced = [budget.key.scope for budget in budgets if budget.usd is not None]
        if step is not None and step.usd is not None:
            priced.append("step")
        if rates is None and priced:
            # pricing.enabled: false prices nothing, pricing.models included (developer trial).
            why = (
                f"model {model_id} has no known price, so its steps cannot be reserved against a US "
                "dollar budget (price it under pricing.models)"
                if self.prices.settings.enabled
                else f"pricing is off (pricing.enabled: false), so no step of model {model_id} can be "
                "reserved against a US dollar budget (turn pricing on, or limit tokens)"
            )
            await self._refuse(priced[0], why, about_spend=False)
        usd_in, usd_out = rates or (0.0, 0.0)
        # EstimateTokens.count, in its parts: the messages' kept by object where they can be.
        framing = _ESTIMATE.framing(request)
        if self._estimates is not None:
            prompt = self._estimates.message_tokens(self.conversation_id, request.messages) + framing
            self._estimates.sent(self.conversation_id, prompt, framing)
        else:
            prompt = _ESTIMATE.messages(request.messages) + framing
        self._prompt = (prompt, prompt * usd_in)
        least = min(self.settings.min_output_tokens, max_output)
        ask = BudgetAsk(prompt, prompt * usd_in, usd_out, max_output, least)
        if step is not None:  # the step's own limit first: the lower of it and the budgets' wins
            room = _step_room(step, ask)
            if room < least:
                await self._refuse("step", step_refusal_text(step.tokens, step.usd, ask))
            ask = dataclasses.replace(ask, max_output=room)
        admitted, self._admitted = self._admitted, None
        if admitted is not None and covers(admitted, budgets, ask):
            self._spent = None  # sent on the admission's reservation: cut off, charged at it
            granted = ask.max_output
        elif not budgets and not self._open:
            granted = ask.max_output
        else:
            granted = (await self._granted(budgets, ask, now, checkpoint)).output_tokens
        if asked is not None and granted >= asked:
            return request
        if granted < max_output:
            metrics.BUDGET_CLAMPED_STEPS.labels(self._tenant).inc()
        settings = dataclasses.replace(request.settings, max_output_tokens=granted)
        return dataclasses.replace(request, settings=settings)

    async def _refuse(self, scope: str, why: str, *, about_spend: bool = True) -> None:
        """End the turn (the last step settled, nothing reserved): ``scope``'s budget has no
        room, ``why`` (``about_spend`` False: not for what was spent, so the message does not say
        when the budget resets). Raises :class:`TurnFailure`."""
        await self.close()
        metrics.BUDGET_EXHAUSTED.labels(self._tenant, scope).inc()
        error = BudgetExhausted(scope, why, say_reset=about_spend)
        raise TurnFailure("step", error) from error

    async def _granted(
        self,
        budgets: tuple[BudgetLimits, ...],
        ask: BudgetAsk,
        now: dt.datetime,
        checkpoint: Callable[[], Awaitable[message_pb2.Message | None]] | None,
    ) -> BudgetGrant:
        """The store's grant of ``ask`` against ``budgets`` (with ``checkpoint()`` stored).
        Raises :class:`TurnFailure` when a budget has no room for it."""
        grant = await self._charge(budgets, ask, None if checkpoint is None else await checkpoint())
        if grant.refused is not None:
            refused = next(budget for budget in budgets if budget.key == grant.refused)
            metrics.BUDGET_EXHAUSTED.labels(self._tenant, refused.key.scope).inc()
            spend = grant.spends.get(refused.key, BudgetSpend())
            why = refusal_text(refused.tokens, refused.usd, spend, ask)
            error = BudgetExhausted(refused.key.scope, why, resets_in(refused.key, now))
            raise TurnFailure("step", error) from error
        return grant

    def used(self, usage: Usage, cost: Cost | None) -> None:
        """The reserved step's actual use (its tokens; its cost, None: unknown, charged at the
        reservation); settled by the next charge."""
        self._spent = (usage.input_tokens + usage.output_tokens, None if cost is None else cost.usd)
        if self._estimates is not None:
            self._estimates.answered(self.conversation_id, usage.output_tokens)

    def unanswered(self) -> None:
        """The reserved step failed before any output (a fallback follows): charged its prompt's
        reservation, the most a request answered with an error before any output can bill (none
        of its output was produced); settled by the next charge."""
        self._spent = self._prompt

    @property
    def writes(self) -> bool:
        """Whether the next :meth:`reserve` writes a charge (a budget applies, or something is
        reserved), so a checkpoint may ride it."""
        return self._open or bool(self._budgets(dt.datetime.now(dt.UTC)))

    def states(self) -> tuple[BudgetState, ...]:
        """The turn's budgets as this attempt's last charge left them in the store (empty before
        its first charge, or when no hook sees them: ``for_hooks``): what ``on_step_finish`` and
        ``on_chat_response`` see."""
        if self._seen is None or not self._for_hooks:
            return ()
        budgets, spends = self._seen
        return budget_states(budgets, spends, dt.datetime.now(dt.UTC))

    async def current(self) -> tuple[BudgetState, ...]:
        """:meth:`states`, read from the store before this attempt's first charge (one read):
        what ``before_step`` sees."""
        if self._seen is not None:
            return self.states()
        now = dt.datetime.now(dt.UTC)
        budgets = self._budgets(now)
        if not budgets:
            return ()
        return budget_states(budgets, await self.store.budget_spends([b.key for b in budgets]), now)

    async def close(self) -> None:
        """Settle what this turn still has reserved (nothing to do, no write, when nothing is).
        A step that never reported its use is charged its reservation."""
        if self._open:
            now = dt.datetime.now(dt.UTC)
            await self._charge(self._budgets(now), None)

    def final_charge(self) -> BudgetCharge | None:
        """:meth:`close`'s charge, for the turn's final write to carry (``Store.finish_turn``,
        one transaction fewer); None when nothing is reserved. Nothing changes here until
        :meth:`settled_by` says the write stored it."""
        if not self._open:
            return None
        budgets = self._budgets(dt.datetime.now(dt.UTC))
        self._final = BudgetCharge(
            self.request_id, self.conversation_id, self.lease, budgets, spent=self._spent
        )
        return self._final

    def settled_by(self, grant: BudgetGrant | None) -> None:
        """The turn's final write stored the last :meth:`final_charge` and returned ``grant``."""
        charge, self._final = self._final, None
        if charge is not None and grant is not None:
            self._spent = None
            self._charged(charge.budgets, None, grant)

    def _budgets(self, now: dt.datetime) -> tuple[BudgetLimits, ...]:
        # Kept for the UTC day (a period's budgets change only with it): each step and the
        # final charge ask, and the answer is the same within a day.
        day = now.astimezone(dt.UTC).date()
        if self._scoped is not None and self._scoped[0] == day:
            return self._scoped[1]
        # The turn's own row only when it has a limit, or may have one stored (a recovery does
        # not know whether its request lowered it): no row per turn for nothing.
        budgets = budgets_for(
            self.settings,
            self.request_id,
            self.conversation_id,
            self.turn_limit,
            now,
            principal=self.principal,
            with_turn=self.turn_limit.limited or self._recovered,
        )
        self._scoped = (day, budgets)
        return budgets

    async def _charge(
        self,
        budgets: tuple[BudgetLimits, ...],
        ask: BudgetAsk | None,
        checkpoint: message_pb2.Message | None = None,
    ) -> BudgetGrant:
        spent, self._spent = self._spent, None
        # Open until the charge is known to have left nothing reserved: one cut off in flight
        # (a cancel, a store failure) may have committed a reservation, which close settles.
        self._open = True
        grant = await self.store.charge_budget(
            BudgetCharge(self.request_id, self.conversation_id, self.lease, budgets, spent=spent, ask=ask),
            checkpoint=checkpoint,
        )
        self._charged(budgets, ask, grant)
        return grant

    def _charged(
        self,
        budgets: tuple[BudgetLimits, ...],
        ask: BudgetAsk | None,
        grant: BudgetGrant,
        *,
        gauges: bool = True,
    ) -> None:
        """A charge of ``budgets`` (reserving ``ask``) was stored and returned ``grant``; the
        tenants' spent gauges set from it unless not ``gauges`` (the admission's: it settled no
        step of this turn, and the turn's next charge or its final write sets them)."""
        self._open = ask is not None and grant.refused is None
        if grant.spends:  # else the lease was lost, or the turn is gone: nothing charged
            self._seen = (grant.budgets or budgets, grant.spends)
        if not gauges:
            return
        current = {budget.key for budget in budgets}  # not a past period a settlement touched
        for key, spend in grant.spends.items():
            # Tenants only: a principal label would grow with every caller (and share a tenant's).
            if key in current and key.scope.startswith("tenant/"):
                tokens, usd = _spent_gauges(self._tenant, key.scope)
                tokens.set(spend.spent_tokens)
                usd.set(spend.spent_usd)


@functools.lru_cache(maxsize=1024)
def _spent_gauges(tenant: str, scope: str) -> tuple[Gauge, Gauge]:
    """The spent gauges' children of ``tenant``'s budget ``scope`` (tokens, US dollars): what
    ``labels()`` returns, looked up once (it builds and locks on each call; one dropped from this
    bounded cache is looked up again, the same child)."""
    return (
        metrics.BUDGET_SPENT_TOKENS.labels(tenant, scope),
        metrics.BUDGET_SPENT_USD.labels(tenant, scope),
    )


def cache_writes(provider: object, request: ModelRequest | None) -> CacheWrites | None:
    """The longest lifetime ``provider``'s step of ``request`` (None: one not built yet) may
    write the prompt cache at (``5m``, ``1h``), as the provider's optional ``cache_writes``
    says (an Anthropic Messages adapter with ``prompt_caching`` on, or markers in the request's
    provider options), or None: a write costs more than uncached input, so the step's prompt is
    reserved at the write's rate then (:meth:`PriceBook.rates`)."""
    writes = getattr(provider, "cache_writes", None)
    return None if writes is None else cast("CacheWrites | None", writes(request))


def abandoned_charge(turn: TurnRecord) -> BudgetCharge:
    """The charge that settles what ``turn``, which will not run again (left interrupted after a
    crash), still has reserved: every reservation at what it reserved, as a lost attempt's (no
    use reported), under ``turn.lease``. For ``Store.finish_turn``'s ``budget``, so the turn's
    end and the settlement are one transaction; nothing to settle when it reserved nothing.
    Names no budget, so it applies whatever the configuration: budgets a previous
    configuration charged are not left reserved forever."""
    return BudgetCharge(turn.request_id, turn.conversation_id, turn.lease, ())


def step_budgets(
    store: BudgetStore,
    settings: EngineSettings,
    state: TurnWorkingState,
    *,
    always: bool = False,
    admitted: BudgetGrant | None = None,
    admitted_at: dt.datetime | None = None,
) -> StepBudgets | None:
    """The budget charges of the attempt ``state`` runs, or None when no budget applies (none
    configured, none the request asked for: then budgets add nothing to a step, no estimate, no
    write) unless ``always`` (a
    ``before_step`` limited a step: its budget is applied, still without a write) or
    ``admitted`` (the grant of the reservation the turn's admission stored, sized at
    ``admitted_at``)."""
    request = state.request
    if admitted is None and not always and not applies(settings.budgets, request.budget):
        return None
    return StepBudgets(
        store,
        settings.budgets,
        settings.prices,
        request_id=request.request_id,
        conversation_id=request.conversation_id,
        lease=state.lease,
        turn_limit=lowered(settings.budgets.turn, request.budget),
        recovered=state.attempt > 1,
        principal=request.principal,
        admitted=admitted,
        admitted_at=admitted_at,
        estimates=settings.first_steps,
        for_hooks=state.hooks.sees_budgets,
    )


@contextlib.asynccontextmanager
async def unsettled(
    budgets: Callable[[], StepBudgets | None], state: TurnWorkingState
) -> AsyncIterator[None]:
    """Leave ``budgets()`` (a callable: a ``before_step`` may start them mid-attempt) in
    ``state.unsettled`` when the attempt ends, however it ends: the turn's final write settles
    them (``Store.finish_turn``'s ``budget``), else :func:`settle` does."""
    try:
        yield
    finally:
        charges = budgets()
        if charges is not None:
            state.unsettled = charges


async def settle(state: TurnWorkingState) -> None:
    """Settle ``state.unsettled`` on its own (:meth:`StepBudgets.close`: the turn ends without a
    final write that carries it, or another attempt starts) and keep its states in
    ``state.budget_states`` (for ``on_chat_response``). Nothing to do when nothing is left. A
    settlement that fails is logged (what stays reserved is settled by the turn's next attempt,
    or by its conversation's deletion; the hook sees no states then), never raised: it must not
    hide why the turn ended."""
    charges, state.unsettled = state.unsettled, None
    if charges is None:
        return
    try:
        await asyncio.shield(charges.close())
        state.budget_states = charges.states()
    except Exception as error:
        log.warning("turn %s: settling its budgets failed: %s", state.request.request_id, error)
