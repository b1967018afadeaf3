"""Which budgets a turn runs under and their states (docs/cost.md, "Budgets"): a request's own
limit lowered, never raised (:func:`lowered`); the turn's, conversation's, tenant's and
principal's budgets for the UTC day and month (:func:`budgets_for`); when a period resets
(:func:`resets_in`); what hooks see of them (:func:`budget_states`). Pure: no store, no clock
read of its own."""

from __future__ import annotations

import calendar
import datetime as dt
from collections.abc import Mapping, Sequence

from turnwire.types import BudgetState
from turnwire_server.engine.budget_settings import BudgetLimit, BudgetSettings
from turnwire_server.store.records import BudgetKey, BudgetLimits, BudgetSpend
from turnwire_server.tenant_keys import tenant_of_key

__all__ = ["budget_states", "budgets_for", "lowered", "resets_in"]


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


def applies(settings: BudgetSettings, requested: BudgetLimit | None) -> bool:
    """Whether any budget applies to a turn: one configured, or the request's own
    (``requested``; docs/cost.md, "Budgets": a request lowers its budget, and with none
    configured its own is the limit)."""
    return settings.enabled or (requested is not None and requested.limited)


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
    month = f"{utc.year:04d}-{utc.month:02d}"  # half the CPU of two strftime calls
    day = f"{month}-{utc.day:02d}"
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


def ended_periods(now: dt.datetime) -> tuple[str, str]:
    """``(day, month)``: the periods before which budget rows are kept no longer (the store's
    ``expire_budget_periods``): ``now``'s UTC day and month each less one, so the period that
    just ended stays for a day or a month more (a turn admitted before midnight charges it, and
    a reserved row stays anyway)."""
    utc = now.astimezone(dt.UTC)
    yesterday = utc.date() - dt.timedelta(days=1)
    last_month = (utc.year, utc.month - 1) if utc.month > 1 else (utc.year - 1, 12)
    return yesterday.isoformat(), f"{last_month[0]:04d}-{last_month[1]:02d}"


def budget_states(
    budgets: Sequence[BudgetLimits], spends: Mapping[BudgetKey, BudgetSpend], now: dt.datetime
) -> tuple[BudgetState, ...]:
    """What hooks see of ``budgets`` in their states ``spends`` (a budget missing there is at
    zero) at ``now``: an entry per budget and limited unit, tokens before US dollars."""
    states = []
    for budget in budgets:
        spend = spends.get(budget.key, BudgetSpend())
        seconds = resets_in(budget.key, now)
        resets_at = None if seconds is None else now + dt.timedelta(seconds=seconds)
        units = (
            ("tokens", budget.tokens, spend.spent_tokens, spend.reserved_tokens),
            ("usd", budget.usd, spend.spent_usd, spend.reserved_usd),
        )
        for unit, limit, spent, reserved in units:
            if limit is not None:
                states.append(
                    BudgetState(
                        scope=budget.key.scope,
                        period=budget.key.period,
                        unit=unit,  # type: ignore[arg-type]
                        limit=limit,
                        spent=spent,
                        reserved=reserved,
                        remaining=max(0, limit - spent - reserved),
                        resets_at=resets_at,
                    )
                )
    return tuple(states)
