"""Budgets in a turn (docs/cost.md, "Budgets"): which budgets a turn runs under, the admission
check, and :class:`StepBudgets`, which reserves each model step before it is sent and settles it
after.

A step reserves its prompt (an estimate: :class:`turnwire.compaction.EstimateTokens`) plus its
``max_output_tokens`` (``budgets.assumed_max_output_tokens`` when unset), in tokens and, priced
at the model's top-tier uncached rates (:meth:`PriceBook.rates`), in US dollars. The store grants
the most output that fits every budget in the transaction that takes the reservation
(:meth:`~turnwire_server.store.base.BudgetStore.charge_budget`); the step is sent with
``max_output_tokens`` clamped to it. No room for ``budgets.min_output_tokens`` (default 1): the turn ends
(:class:`BudgetExhausted`). A model without a known price cannot be reserved against a US dollar
budget: the step is refused the same way (never counted as free).
"""

from __future__ import annotations

import asyncio
import calendar
import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import AsyncIterator

from turnwire.compaction import EstimateTokens
from turnwire.providers import ModelRequest
from turnwire.types import Cost, Usage
from turnwire_server.engine import metrics
from turnwire_server.engine.budget_settings import BudgetLimit, BudgetSettings
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.errors import BudgetExhausted, BudgetRefused, TurnFailure
from turnwire_server.engine.settings import EngineSettings
from turnwire_server.engine.turn_state import TurnWorkingState
from turnwire_server.store.base import (
    BudgetAsk,
    BudgetCharge,
    BudgetGrant,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
    BudgetStore,
)
from turnwire_server.store.records import TurnLease
from turnwire_server.tenant_keys import tenant_of_key

__all__ = [
    "StepBudgets",
    "admission_refusal",
    "budgets_for",
    "lowered",
    "resets_in",
    "settle_abandoned",
    "settled",
    "step_budgets",
]

log = logging.getLogger("turnwire.budgets")

_ESTIMATE = EstimateTokens()


def lowered(configured: BudgetLimit, requested: BudgetLimit | None) -> BudgetLimit:
    """``configured`` lowered by a request's own ``requested`` limits, never raised."""
    if requested is None:
        return configured

    def lower(a: float | None, b: float | None) -> float | None:
        return b if a is None else a if b is None else min(a, b)

    tokens = lower(configured.tokens, requested.tokens)
    return BudgetLimit(
        tokens=None if tokens is None else int(tokens), usd=lower(configured.usd, requested.usd)
    )


def budgets_for(
    settings: BudgetSettings,
    request_id: str,
    conversation_id: str,
    turn_limit: BudgetLimit,
    now: dt.datetime,
    *,
    principal: str = "",
    with_turn: bool = True,
) -> tuple[BudgetLimits, ...]:
    """The budgets a turn of ``conversation_id`` asked for by ``principal`` ("": none known)
    runs under at ``now`` (tz-aware), in the order a refusal names the first: its own
    (``turn_limit``; always, so a request's lowered limit is stored for a recovery of the turn,
    unless not ``with_turn``), its conversation's, its tenant's and its principal's (keyed
    ``tenant/principal``: a principal is a name in one tenant) for the UTC day and month, each
    only when limited."""
    found: list[BudgetLimits] = []
    if with_turn:
        found.append(
            BudgetLimits(BudgetKey("turn", request_id), turn_limit.tokens, turn_limit.usd, conversation_id)
        )
    if settings.conversation.limited:
        limit = settings.conversation
        found.append(
            BudgetLimits(BudgetKey("conversation", conversation_id), limit.tokens, limit.usd, conversation_id)
        )
    tenant = tenant_of_key(conversation_id)
    utc = now.astimezone(dt.UTC)
    day, month = utc.strftime("%Y-%m-%d"), utc.strftime("%Y-%m")
    owners = [("tenant", tenant, settings.tenant)]
    if principal:
        owners.append(("principal", f"{tenant}/{principal}", settings.principal))
    for kind, key, periods in owners:
        for period_name, limit, period in (("day", periods.day, day), ("month", periods.month, month)):
            if limit.limited:
                found.append(
                    BudgetLimits(BudgetKey(f"{kind}/{period_name}", key, period), limit.tokens, limit.usd)
                )
    return tuple(found)


def resets_in(key: BudgetKey, now: dt.datetime) -> float | None:
    """Seconds from ``now`` until the period of ``key`` ends (UTC midnight, or the next month's
    first); None for a budget that never resets (a turn's, a conversation's)."""
    utc = now.astimezone(dt.UTC)
    if key.scope.endswith("/day"):
        start = dt.datetime.combine(utc.date(), dt.time(), dt.UTC) + dt.timedelta(days=1)
    elif key.scope.endswith("/month"):
        days = calendar.monthrange(utc.year, utc.month)[1]
        start = dt.datetime(utc.year, utc.month, 1, tzinfo=dt.UTC) + dt.timedelta(days=days)
    else:
        return None
    return (start - utc).total_seconds()


def _why(budget: BudgetLimits, spend: BudgetSpend) -> str:
    """What of ``budget`` is used, in the kind that ran out first."""
    used_tokens = spend.spent_tokens + spend.reserved_tokens
    if budget.tokens is not None and (budget.usd is None or used_tokens / budget.tokens >= 1):
        return f"{used_tokens:,} of its {budget.tokens:,} tokens used or reserved"
    used_usd = spend.spent_usd + spend.reserved_usd
    return f"${used_usd:.6g} of its ${budget.usd or 0:.6g} used or reserved"


def _exhausted(budget: BudgetLimits, spend: BudgetSpend) -> bool:
    """No room left for a step of one token (or of any cost)."""
    if budget.tokens is not None and spend.spent_tokens + spend.reserved_tokens >= budget.tokens:
        return True
    return budget.usd is not None and spend.spent_usd + spend.reserved_usd >= budget.usd


async def admission_refusal(
    store: BudgetStore, settings: BudgetSettings, conversation_id: str, principal: str, now: dt.datetime
) -> BudgetRefused | None:
    """Why a new turn on ``conversation_id`` asked for by ``principal`` is refused before
    anything is stored: its conversation's, tenant's or principal's budget exhausted (None:
    admitted). One read, no lock; a turn
    admitted in a race with another's last step meets the budget at its first step instead and
    ends with the same reason (the charge, under the rows' locks, never lets it overspend)."""
    budgets = budgets_for(
        settings, "", conversation_id, BudgetLimit(), now, principal=principal, with_turn=False
    )
    if not budgets:
        return None
    spends = await store.budget_spends([budget.key for budget in budgets])
    for budget in budgets:
        spend = spends.get(budget.key, BudgetSpend())
        if _exhausted(budget, spend):
            metrics.BUDGET_EXHAUSTED.labels(tenant_of_key(conversation_id), budget.key.scope).inc()
            return BudgetRefused(budget.key.scope, _why(budget, spend), resets_in(budget.key, now))
    return None


class StepBudgets:
    """One attempt's budget charges: :meth:`reserve` before each step, :meth:`used` with its
    usage after it, :meth:`close` when the attempt ends (settles the last step; a recovered
    attempt's close also settles what the lost attempt left reserved). Each charge is one store
    transaction; the settlement of a step rides the next step's reservation."""

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

    async def reserve(
        self, request: ModelRequest, model_id: str, provider_type: str | None, provider: object
    ) -> ModelRequest:
        """``request`` with ``max_output_tokens`` clamped to what every budget has room for, its
        reservation stored. Raises :class:`BudgetExhausted` (nothing reserved, the last step
        settled; as a :class:`TurnFailure` at stage ``step``) when a budget has no room for
        ``min_output_tokens`` of output, or a US dollar budget applies and ``model_id`` has no
        known price; :class:`LeaseLost` as every turn write does. ``request`` as it is, and no
        write, when no budget applies to the turn and nothing is reserved."""
        now = dt.datetime.now(dt.UTC)
        budgets = self._budgets(now)
        if not budgets and not self._open:
            return request  # none applies (a principal's, authentication off): nothing to write
        asked = request.settings.max_output_tokens
        max_output = asked if asked is not None else self.settings.assumed_max_output_tokens
        rates = self.prices.rates(model_id, provider_type)
        priced = [budget for budget in budgets if budget.usd is not None]
        if rates is None and priced:
            await self.close()
            scope = priced[0].key.scope
            metrics.BUDGET_EXHAUSTED.labels(self._tenant, scope).inc()
            error = BudgetExhausted(
                scope,
                f"model {model_id} has no known price, so its steps cannot be reserved against a US "
                "dollar budget (price it under pricing.models)",
            )
            raise TurnFailure("step", error) from error
        usd_in, usd_out = rates or (0.0, 0.0)
        prompt = await _ESTIMATE.count(request, provider)
        self._prompt = (prompt, prompt * usd_in)
        least = min(self.settings.min_output_tokens, max_output)
        grant = await self._charge(budgets, BudgetAsk(prompt, prompt * usd_in, usd_out, max_output, least))
        if grant.refused is not None:
            refused = next(budget for budget in budgets if budget.key == grant.refused)
            metrics.BUDGET_EXHAUSTED.labels(self._tenant, refused.key.scope).inc()
            why = _why(refused, grant.spends.get(refused.key, BudgetSpend()))
            error = BudgetExhausted(
                refused.key.scope,
                f"{why}, and the next step needs about {prompt:,} tokens of prompt and at least "
                f"{least:,} of output",
                resets_in(refused.key, now),
            )
            raise TurnFailure("step", error) from error
        if asked is not None and grant.output_tokens >= asked:
            return request
        if grant.output_tokens < max_output:
            metrics.BUDGET_CLAMPED_STEPS.labels(self._tenant).inc()
        settings = dataclasses.replace(request.settings, max_output_tokens=grant.output_tokens)
        return dataclasses.replace(request, settings=settings)

    def used(self, usage: Usage, cost: Cost | None) -> None:
        """The reserved step's actual use (its tokens; its cost, None: unknown, charged at the
        reservation); settled by the next charge."""
        self._spent = (usage.input_tokens + usage.output_tokens, None if cost is None else cost.usd)

    def unanswered(self) -> None:
        """The reserved step failed before any output (a fallback follows): charged its prompt's
        reservation, the most a request answered with an error before any output can bill (none
        of its output was produced); settled by the next charge."""
        self._spent = self._prompt

    async def close(self) -> None:
        """Settle what this turn still has reserved (nothing to do, no write, when nothing is).
        A step that never reported its use is charged its reservation."""
        if self._open:
            now = dt.datetime.now(dt.UTC)
            await self._charge(self._budgets(now), None)

    def _budgets(self, now: dt.datetime) -> tuple[BudgetLimits, ...]:
        # The turn's own row only when it has a limit, or may have one stored (a recovery does
        # not know whether its request lowered it): no row per turn for nothing.
        return budgets_for(
            self.settings,
            self.request_id,
            self.conversation_id,
            self.turn_limit,
            now,
            principal=self.principal,
            with_turn=self.turn_limit.limited or self._recovered,
        )

    async def _charge(self, budgets: tuple[BudgetLimits, ...], ask: BudgetAsk | None) -> BudgetGrant:
        spent, self._spent = self._spent, None
        # Open until the charge is known to have left nothing reserved: one cut off in flight
        # (a cancel, a store failure) may have committed a reservation, which close settles.
        self._open = True
        grant = await self.store.charge_budget(
            BudgetCharge(self.request_id, self.conversation_id, self.lease, budgets, spent=spent, ask=ask)
        )
        self._open = ask is not None and grant.refused is None
        current = {budget.key for budget in budgets}  # not a past period a settlement touched
        for key, spend in grant.spends.items():
            # Tenants only: a principal label would grow with every caller (and share a tenant's).
            if key in current and key.scope.startswith("tenant/"):
                metrics.BUDGET_SPENT_TOKENS.labels(self._tenant, key.scope).set(spend.spent_tokens)
                metrics.BUDGET_SPENT_USD.labels(self._tenant, key.scope).set(spend.spent_usd)
        return grant


async def settle_abandoned(store: BudgetStore, request_id: str, conversation_id: str) -> None:
    """Settle what turn ``request_id``, which will not run again (left interrupted after a
    crash), still has reserved: at what it reserved, as a lost attempt's; nothing to do (one
    read) when it reserved nothing. Runs whatever the configuration, so budgets a previous
    configuration charged are not left reserved forever."""
    await store.charge_budget(BudgetCharge(request_id, conversation_id, None, ()))


def step_budgets(store: BudgetStore, settings: EngineSettings, state: TurnWorkingState) -> StepBudgets | None:
    """The budget charges of the attempt ``state`` runs, or None when no budget is configured
    (then budgets add nothing to a step: no estimate, no write)."""
    if not settings.budgets.enabled:
        return None
    request = state.request
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
    )


@contextlib.asynccontextmanager
async def settled(budgets: StepBudgets | None, request_id: str) -> AsyncIterator[None]:
    """Settle ``budgets`` (:meth:`StepBudgets.close`) when the attempt ends, however it ends; a
    settlement that fails is logged (what stays reserved is settled by the turn's next attempt,
    or by its conversation's deletion) and never hides why the attempt ended."""
    try:
        yield
    finally:
        if budgets is not None:
            try:
                await asyncio.shield(budgets.close())
            except Exception as error:
                log.warning("turn %s: settling its budgets failed: %s", request_id, error)
