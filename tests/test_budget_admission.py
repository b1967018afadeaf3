"""A new turn's first reservation rides its admission (docs/cost.md, "What it costs per request";
``engine/budget_admission.py``): once the process has seen the conversation's prompt, the commit of
a new turn's input carries the first step's reservation and the step uses it without a write of
its own; a step the reservation does not cover charges as before, the admission's settled at zero;
a turn that ends before its first step settles it at zero. What is spent is the steps' use either
way, and nothing stays reserved. A step's prompt estimate walks only the messages it has not seen."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from support.engine_harness import CONV, EngineFactory, Harness, end_of

from turnwire.compaction import EstimateTokens, message_bytes
from turnwire.hooks import Middleware, StepConfig, StepContext, TurnContext
from turnwire.testing import ScriptedUsage, ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.cache_budget import CacheBudget
from turnwire_server.engine.budget_admission import FirstStepEstimates
from turnwire_server.engine.budget_scopes import budgets_for
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.budgets import StepBudgets
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.store.budgets import BudgetStore
from turnwire_server.store.records import (
    BudgetCharge,
    BudgetGrant,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
    TurnAdmission,
)

CONVERSATION = BudgetKey("conversation", CONV)
STEP = ScriptStep(text="Answer.", usage=ScriptedUsage(input_tokens=40, output_tokens=8), repeat=True)


def _budgets() -> BudgetSettings:
    return BudgetSettings.model_validate(
        {"conversation": {"tokens": 100_000}, "assumed_max_output_tokens": 500}
    )


class Charges:
    """Counts the store's charges of their own and the admissions that carried one."""

    def __init__(self, h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
        self.own: list[BudgetCharge] = []
        self.admitted: list[BudgetCharge | None] = []
        charge, admit = h.store.charge_budget, h.store.admit_turn

        async def counted_charge(c: BudgetCharge, *, checkpoint: message_pb2.Message | None = None) -> Any:
            self.own.append(c)
            return await charge(c, checkpoint=checkpoint)

        def counted_admit(*args: Any, budget: BudgetCharge | None = None, **kwargs: Any) -> Any:
            self.admitted.append(budget)
            return admit(*args, budget=budget, **kwargs)

        monkeypatch.setattr(h.store, "charge_budget", counted_charge)
        monkeypatch.setattr(h.store, "admit_turn", counted_admit)


async def _spend(h: Harness) -> BudgetSpend:
    return (await h.store.budget_spends([CONVERSATION]))[CONVERSATION]


async def test_a_seen_conversations_next_turn_reserves_in_its_admission(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await make_engine(scripts={"main": [STEP]}, budgets=_budgets())
    charges = Charges(h, monkeypatch)
    # The process has seen no prompt yet: the first turn's admission carries nothing, its step
    # charges on its own.
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    assert charges.admitted == [None] and len(charges.own) == 1
    # The next turn's admission carries the reservation: its step sends without a charge.
    assert end_of(await h.run("and then?")).status == event_pb2.TURN_STATUS_COMPLETED
    admitted = charges.admitted[1]
    assert admitted is not None and admitted.ask is not None and admitted.spent is None
    assert admitted.ask.max_output == 500
    assert len(charges.own) == 1
    (_, second) = h.provider.requests
    assert second.settings.max_output_tokens == 500  # the reservation's output, as a step's own is
    # A new conversation's turn goes by the system prompt and tools the process last sent.
    assert end_of(await h.run("hello", conversation_id="other")).status == event_pb2.TURN_STATUS_COMPLETED
    assert charges.admitted[2] is not None and len(charges.own) == 1
    # Spent: each step's use, nothing of the reservations left.
    assert await _spend(h) == BudgetSpend(2 * 48, 0.0, 0, 0.0)


class LongSystem(Middleware):
    """Sends each step with a system prompt far longer than anything seen before it."""

    async def before_step(self, ctx: StepContext) -> StepConfig:
        return StepConfig(system="You are careful. " * 2_000)


async def test_a_step_the_admissions_reservation_does_not_cover_charges_on_its_own(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    long_system = LongSystem()
    h = await make_engine(scripts={"main": [STEP]}, middlewares=[long_system], budgets=_budgets())
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    # The admission reserved for a short prompt (as the last turn's, before its system prompt grew).
    h.engine.settings.first_steps.sent(CONV, 20, 10)
    charges = Charges(h, monkeypatch)
    assert end_of(await h.run("again")).status == event_pb2.TURN_STATUS_COMPLETED
    (admitted,) = charges.admitted
    (own,) = charges.own
    assert admitted is not None and admitted.ask is not None
    assert own.ask is not None and own.ask.prompt_tokens > admitted.ask.prompt_tokens
    assert own.spent == (0, 0.0)  # the admission's reservation settled at zero: nothing was sent on it
    assert await _spend(h) == BudgetSpend(2 * 48, 0.0, 0, 0.0)


async def test_an_admission_whose_grant_was_lost_settles_its_reservation_at_zero(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL's one flight carried the reservation and its commit's answer was lost
    (``store/postgres/admission.py``, ``_own_start``): the reservation is stored, the admission's
    ``budget`` an empty grant. The step charges on its own, settling the reservation at zero."""
    h = await make_engine(scripts={"main": [STEP]}, budgets=_budgets())
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    charges = Charges(h, monkeypatch)
    admit = h.store.admit_turn

    @contextlib.asynccontextmanager
    async def answer_lost(*args: Any, **kwargs: Any) -> AsyncIterator[TurnAdmission]:
        async with admit(*args, **kwargs) as admission:
            assert admission.budget is not None and admission.budget.tokens > 0  # it reserved
            yield dataclasses.replace(admission, budget=BudgetGrant())

    monkeypatch.setattr(h.store, "admit_turn", answer_lost)
    assert end_of(await h.run("again")).status == event_pb2.TURN_STATUS_COMPLETED
    (own,) = charges.own
    assert own.spent == (0, 0.0)
    assert await _spend(h) == BudgetSpend(2 * 48, 0.0, 0, 0.0)


class FailsBeforeTurn(Middleware):
    def __init__(self) -> None:
        self.fail = False

    async def before_turn(self, ctx: TurnContext) -> None:
        if self.fail:
            raise RuntimeError("the application refused the turn")


async def test_a_turn_ending_before_its_first_step_settles_the_admissions_reservation_at_zero(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    hook = FailsBeforeTurn()
    h = await make_engine(scripts={"main": [STEP]}, middlewares=[hook], budgets=_budgets())
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    charges = Charges(h, monkeypatch)
    hook.fail = True
    assert end_of(await h.run("again")).status == event_pb2.TURN_STATUS_ERROR
    assert charges.admitted[0] is not None
    assert charges.own == []  # settled by the turn's final write
    assert len(h.provider.requests) == 1
    assert await _spend(h) == BudgetSpend(48, 0.0, 0, 0.0)


def _message(message_id: str, text: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    return message


def test_a_steps_message_estimate_walks_only_the_messages_it_has_not_seen() -> None:
    budget = CacheBudget(10**6)
    estimates = FirstStepEstimates(budget.region("estimates"), budget.region("sized"))
    history = [_message(f"m{n}", "word " * (n + 1)) for n in range(50)]
    walked: list[str] = []

    def counted(message: message_pb2.Message) -> int:
        walked.append(message.id)
        return message_bytes(message)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("turnwire_server.engine.budget_admission.message_bytes", counted)
        assert estimates.message_tokens(CONV, history) == EstimateTokens().messages(history)
        assert len(walked) == 50
        walked.clear()
        # The next step: the same objects plus the reply so far.
        step = [*history, _message("reply", "an answer " * 30)]
        assert estimates.message_tokens(CONV, step) == EstimateTokens().messages(step)
        assert walked == ["reply"]
        walked.clear()
        # A message replaced by another object (an edit, a repair's copy): walked from there on.
        edited = [*history[:10], _message("m10", "changed"), *history[11:]]
        assert estimates.message_tokens(CONV, edited) == EstimateTokens().messages(edited)
        assert walked == [f"m{n}" for n in range(10, 50)]
        walked.clear()
        # Shorter (a compaction's view): its own sum, nothing walked twice.
        assert estimates.message_tokens(CONV, edited[:5]) == EstimateTokens().messages(edited[:5])
        assert walked == []
        # Another conversation is its own.
        assert estimates.message_tokens("other", history[:3]) == EstimateTokens().messages(history[:3])
        assert walked == ["m0", "m1", "m2"]


async def test_a_turns_steps_charge_the_budgets_its_admission_named(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admission worked out the turn's budgets for its reservation; its steps and final
    settlement charge those (not worked out again), and what is spent is the same."""
    h = await make_engine(scripts={"main": [STEP]}, budgets=_budgets())
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    charges = Charges(h, monkeypatch)
    worked_out: list[str] = []

    def counted(*args: Any, **kwargs: Any) -> Any:
        worked_out.append(args[2])
        return budgets_for(*args, **kwargs)

    monkeypatch.setattr("turnwire_server.engine.budgets.budgets_for", counted)
    assert end_of(await h.run("again")).status == event_pb2.TURN_STATUS_COMPLETED
    (admitted,) = charges.admitted
    assert admitted is not None and charges.own == []
    assert worked_out == []
    assert await _spend(h) == BudgetSpend(2 * 48, 0.0, 0, 0.0)


def test_an_admission_sized_before_midnight_leaves_its_steps_the_new_days_budgets() -> None:
    settings = BudgetSettings.model_validate({"tenant": {"day": {"tokens": 10_000}}})
    now = dt.datetime.now(dt.UTC)

    def charged(admitted_at: dt.datetime) -> tuple[tuple[BudgetLimits, ...], tuple[BudgetLimits, ...]]:
        """The budgets an admission sized at ``admitted_at`` named, and those its turn's final
        settlement charges now."""
        named = budgets_for(settings, "r1", CONV, settings.turn, admitted_at, with_turn=False)
        budgets = StepBudgets(
            cast(BudgetStore, None),
            settings,
            PriceBook(PricingSettings()),
            request_id="r1",
            conversation_id=CONV,
            lease=None,
            turn_limit=settings.turn,
            recovered=False,
            admitted=BudgetGrant(output_tokens=500, tokens=600, budgets=named),
            admitted_at=admitted_at,
        )
        charge = budgets.final_charge()
        assert charge is not None
        return named, charge.budgets

    named, settled = charged(now)
    assert settled is named  # sized today: the admission's budgets, not worked out again
    named, settled = charged(now - dt.timedelta(days=1))  # sized yesterday: the day turned since
    assert [b.key for b in settled] == [BudgetKey("tenant/day", "", now.strftime("%Y-%m-%d"))]
    assert named[0].key.period != settled[0].key.period
