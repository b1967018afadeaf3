"""The arithmetic of budgets (docs/cost.md, "Budgets"): what a step may reserve and how much output
that leaves it (``store/core/budget_rules.py``), how reservations settle, which budgets a turn
runs under and when a period's resets (``engine/budgets.py``), and a request that may lower its
own budget but never raise it."""

from __future__ import annotations

import datetime as dt

import pytest

from turnwire_server.engine.budget_scopes import budgets_for, lowered, resets_in
from turnwire_server.engine.budget_settings import BudgetLimit, BudgetSettings
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.engine.errors import BudgetExhausted, BudgetRefused
from turnwire_server.store.core.budget_rules import Reservation, fit_output, settle
from turnwire_server.store.records import BudgetAsk, BudgetKey, BudgetLimits, BudgetSpend

KEY = BudgetKey("conversation", "c")
OTHER = BudgetKey("tenant/day", "", "2026-12-02")


def test_output_is_clamped_to_the_tightest_budget_in_tokens_and_dollars() -> None:
    ask = BudgetAsk(prompt_tokens=1_000, prompt_usd=0.003, usd_per_output_token=15e-6, max_output=8_000)
    roomy = BudgetLimits(KEY, tokens=100_000, usd=10.0)
    assert fit_output(ask, [roomy], {}) == (8_000, None)
    # 5 000 tokens with 1 500 spent and 500 reserved: 3 000 left, 1 000 of them the prompt.
    tight_tokens = BudgetLimits(KEY, tokens=5_000)
    assert fit_output(ask, [roomy, tight_tokens], {KEY: BudgetSpend(1_500, 0.0, 500, 0.0)}) == (2_000, None)
    # $0.033: 0.003 of prompt leaves $0.03, 2 000 output tokens at $15 per million.
    tight_usd = BudgetLimits(OTHER, usd=0.033)
    assert fit_output(ask, [roomy, tight_usd], {}) == (2_000, None)


def test_no_room_for_the_least_output_names_the_first_budget_without_it() -> None:
    ask = BudgetAsk(prompt_tokens=1_000, prompt_usd=0.0, usd_per_output_token=0.0, max_output=100)
    full = BudgetLimits(KEY, tokens=1_000)
    also_full = BudgetLimits(OTHER, tokens=10)
    assert fit_output(ask, [full, also_full], {}) == (0, KEY)
    assert fit_output(ask, [also_full, full], {}) == (0, OTHER)
    # A free model under a dollar budget fits while nothing is overspent.
    assert fit_output(ask, [BudgetLimits(KEY, usd=0.0)], {}) == (100, None)
    assert fit_output(ask, [BudgetLimits(KEY, usd=1.0)], {KEY: BudgetSpend(0, 1.5, 0, 0.0)}) == (0, KEY)
    # A larger least output (min_output) is a stricter ask.
    picky = BudgetAsk(
        prompt_tokens=0, prompt_usd=0.0, usd_per_output_token=0.0, max_output=100, min_output=50
    )
    assert fit_output(picky, [BudgetLimits(KEY, tokens=49)], {}) == (0, KEY)


def test_settling_charges_this_attempts_use_and_any_other_reservation_in_full() -> None:
    spends = {KEY: BudgetSpend(100, 1.0, 700, 7.0)}
    mine = Reservation(KEY, epoch=2, tokens=400, usd=4.0)
    lost = Reservation(KEY, epoch=1, tokens=300, usd=3.0)
    settled = settle(spends, [mine, lost], epoch=2, spent=(150, 1.5))
    assert settled[KEY] == BudgetSpend(100 + 150 + 300, pytest.approx(1.0 + 1.5 + 3.0), 0, 0.0)  # type: ignore[arg-type]
    # Unknown use (a step cut off before its usage, an unknown cost) is charged its reservation.
    assert settle(spends, [mine], epoch=2, spent=None)[KEY] == BudgetSpend(500, 5.0, 300, 3.0)
    assert settle(spends, [mine], epoch=2, spent=(10, None))[KEY] == BudgetSpend(110, 5.0, 300, 3.0)


def test_a_request_lowers_its_own_budget_never_raises_it() -> None:
    configured = BudgetLimit(tokens=10_000, usd=1.0)
    assert lowered(configured, None) == configured
    assert lowered(configured, BudgetLimit(tokens=500)) == BudgetLimit(tokens=500, usd=1.0)
    assert lowered(configured, BudgetLimit(tokens=50_000, usd=0.25)) == BudgetLimit(tokens=10_000, usd=0.25)
    assert lowered(BudgetLimit(), BudgetLimit(usd=2.0)) == BudgetLimit(usd=2.0)


def test_a_turn_runs_under_its_own_its_conversations_and_its_tenants_periods() -> None:
    settings = BudgetSettings.model_validate(
        {"conversation": {"usd": 5}, "tenant": {"day": {"tokens": 1_000_000}, "month": {"usd": 100}}}
    )
    now = dt.datetime(2026, 12, 31, 23, 0, tzinfo=dt.UTC)
    found = budgets_for(settings, "r1", "acme/c1", BudgetLimit(tokens=9), now)
    assert [(b.key, b.tokens, b.usd, b.conversation_id) for b in found] == [
        (BudgetKey("turn", "r1"), 9, None, "acme/c1"),
        (BudgetKey("conversation", "acme/c1"), None, 5.0, "acme/c1"),
        (BudgetKey("tenant/day", "acme", "2026-12-31"), 1_000_000, None, None),
        (BudgetKey("tenant/month", "acme", "2026-12"), None, 100.0, None),
    ]
    assert resets_in(found[2].key, now) == 3_600  # midnight UTC
    assert resets_in(found[3].key, now) == 3_600  # and the first of January
    assert resets_in(found[1].key, now) is None
    february = dt.datetime(2028, 2, 10, tzinfo=dt.UTC)  # a leap year: 20 days to March
    assert resets_in(BudgetKey("tenant/month", "acme", "2028-02"), february) == 20 * 86_400
    assert not BudgetSettings().enabled and settings.enabled


def test_a_principals_budgets_are_keyed_by_its_tenant_and_reset_with_the_period() -> None:
    settings = BudgetSettings.model_validate({"principal": {"day": {"usd": 1}, "month": {"tokens": 5}}})
    assert settings.enabled
    now = dt.datetime(2026, 12, 2, 18, 0, tzinfo=dt.UTC)
    found = budgets_for(settings, "r1", "acme/c1", BudgetLimit(), now, principal="alice", with_turn=False)
    assert [(b.key, b.tokens, b.usd, b.conversation_id) for b in found] == [
        (BudgetKey("principal/day", "acme/alice", "2026-12-02"), None, 1.0, None),
        (BudgetKey("principal/month", "acme/alice", "2026-12"), 5, None, None),
    ]
    assert [resets_in(b.key, now) for b in found] == [6 * 3_600, (29 * 24 + 6) * 3_600]
    # No principal known (authentication off): no principal budget.
    assert budgets_for(settings, "r1", "c1", BudgetLimit(), now, with_turn=False) == ()


def test_a_step_is_reserved_at_the_models_top_rates() -> None:
    prices = PriceBook(
        PricingSettings.model_validate({"models": {"x:m": {"input_mtok": 3, "output_mtok": 15}}})
    )
    assert prices.rates("x:m", None) == pytest.approx((3e-6, 15e-6))
    assert prices.rates("scripted:unpriced", "scripted") is None


def test_a_refusal_says_when_its_budget_resets_in_words() -> None:
    """The message spells the wait and the clock time a period ends (RetryInfo keeps the seconds);
    a conversation's says it never resets; a refusal not about spending (an unpriced model) says
    neither (money trial: it read "it resets in 53,466 s")."""
    why = "1,240 of its 1,200 tokens used or reserved"
    day = BudgetRefused("tenant/day", why, 53_466.2)
    assert str(day).endswith(f"{why}; it resets in 14 h 51 min (00:00 UTC)")
    assert day.details().retry_after_seconds == 53_466.2
    month = BudgetExhausted("principal/month", why, 3 * 86_400 + 7_300)
    assert str(month).endswith("; it resets in 3 d 2 h (00:00 UTC on the 1st)")
    assert str(BudgetExhausted("tenant/day", why, 59.6)).endswith("; it resets in 1 min (00:00 UTC)")
    assert str(BudgetExhausted("tenant/day", why, 75)).endswith("; it resets in 1 min 15 s (00:00 UTC)")
    assert str(BudgetExhausted("tenant/day", why, 0.2)).endswith("; it resets in 0 s (00:00 UTC)")
    assert str(BudgetRefused("conversation", why)).endswith(f"{why}; a conversation's budget never resets")
    assert str(BudgetExhausted("turn", why)).endswith(why)
    unpriced = BudgetExhausted("conversation", "model x:y has no known price", say_reset=False)
    assert str(unpriced).endswith("model x:y has no known price")


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
def test_a_dollar_limit_or_price_must_be_finite(value: float) -> None:
    """``usd: 1e400`` (YAML's infinity) was a valid budget, and ``.nan`` was refused as "should be
    greater than or equal to 0"; both now say the number must be finite (money trial)."""
    with pytest.raises(ValueError, match="finite number"):
        BudgetLimit(usd=value)
    with pytest.raises(ValueError, match="finite number"):
        PricingSettings(models={"local:m": {"input_mtok": value, "output_mtok": 1.0}})
