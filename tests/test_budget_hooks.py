"""Budgets in hooks (docs/cost.md, "Budgets in hooks"): ``before_step``, ``on_step_finish`` and
``on_chat_response`` see each budget's limit, spent, reserved, remaining and reset as the store
holds it, in process and over the remote-hook contract; ``before_step`` lowers a step's budget
(``max_step_tokens`` / ``max_step_usd``): ``max_output_tokens`` clamped, the turn ended with
BUDGET_EXHAUSTED (scope ``step``) when no output fits, never raised above the turn's budgets."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pytest
from google.rpc import error_details_pb2
from support.engine_harness import CONV, MODEL, EngineFactory, Harness, echo, end_of, make_tool
from support.hook_server import RecordingHookServer, serving

from turnwire.hooks import (
    ChatResponseContext,
    Middleware,
    SessionContext,
    StepConfig,
    StepContext,
    StepFinishContext,
)
from turnwire.testing import ScriptedUsage, ScriptStep
from turnwire.types import BudgetState
from turnwire_client.v1 import event_pb2, hooks_pb2
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.remote_hooks import RemoteMiddleware, convert
from turnwire_server.remote_hooks.settings import RemoteHookSettings
from turnwire_server.store.records import BudgetKey, BudgetSpend

RATES = {"input_mtok": 3.0, "output_mtok": 15.0}
PRICED = PriceBook(PricingSettings.model_validate({"models": {MODEL: RATES}}))
STEPS = [
    ScriptStep(
        text="Calling.",
        tool_calls=[{"name": "echo", "input": {"n": 1}}],
        usage=ScriptedUsage(input_tokens=900, output_tokens=95),
    ),
    ScriptStep(text="Done.", usage=ScriptedUsage(input_tokens=700, output_tokens=50)),
]
BUDGETS = BudgetSettings.model_validate(
    {"turn": {"tokens": 10_000}, "tenant": {"day": {"usd": 5.0}}, "assumed_max_output_tokens": 500}
)


def _keys(request_id: str = "r1") -> list[BudgetKey]:
    day = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")
    return [BudgetKey("turn", request_id), BudgetKey("tenant/day", "", day)]


def _as_stored(spends: dict[BudgetKey, BudgetSpend]) -> list[tuple[str, str, float, float]]:
    """The (scope, unit, spent, reserved) of the test's budgets as the store holds them."""
    turn, tenant = (spends.get(key, BudgetSpend()) for key in _keys())
    return [
        ("turn", "tokens", turn.spent_tokens, turn.reserved_tokens),
        ("tenant/day", "usd", tenant.spent_usd, tenant.reserved_usd),
    ]


def _seen(states: Sequence[BudgetState]) -> list[tuple[str, str, float, float]]:
    return [(s.scope, s.unit, s.spent, s.reserved) for s in states]


class Budgets(Middleware):
    """Keeps the budget states its hooks were given, and the store's at the same moment."""

    def __init__(self) -> None:
        self.harness: Harness | None = None
        self.seen: list[tuple[str, Sequence[BudgetState], list[tuple[str, str, float, float]]]] = []

    async def _keep(self, hook: str, states: Sequence[BudgetState]) -> None:
        assert self.harness is not None
        self.seen.append((hook, states, _as_stored(await self.harness.store.budget_spends(_keys()))))

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        await self._keep("before_step", ctx.budgets)
        return None

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        await self._keep("on_step_finish", ctx.budgets)

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        await self._keep("on_chat_response", ctx.budgets)


class LowersSteps(Middleware):
    """Sets a step budget on every step."""

    def __init__(self, **limits: Any) -> None:
        self.limits = limits

    async def before_step(self, ctx: StepContext) -> StepConfig:
        return StepConfig(**self.limits)


def _reason(end: event_pb2.TurnEnd) -> str:
    for detail in end.error.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


async def test_hooks_see_the_budget_states_the_store_holds(make_engine: EngineFactory) -> None:
    budgets = Budgets()
    h = await make_engine(
        scripts={"main": STEPS},
        tools=[make_tool("echo", echo)],
        middlewares=[budgets],
        prices=PRICED,
        budgets=BUDGETS,
    )
    budgets.harness = h
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED

    hooks = [hook for hook, _, _ in budgets.seen]
    assert hooks == ["before_step", "on_step_finish", "before_step", "on_step_finish", "on_chat_response"]
    for hook, states, stored in budgets.seen:
        assert _seen(states) == stored, hook  # what the store held when the hook ran
    # Before the first step nothing is spent or reserved; after it, the step's reservation
    # (prompt plus 500 of output) is; at the end both steps are settled at their usage.
    assert _seen(budgets.seen[0][1]) == [("turn", "tokens", 0, 0), ("tenant/day", "usd", 0.0, 0.0)]
    first = budgets.seen[1][1]
    assert first[0].spent == 0 and 500 < first[0].reserved < 600
    assert first[0].remaining == first[0].limit - first[0].reserved
    final = budgets.seen[-1][1]
    usd = (1600 * RATES["input_mtok"] + 145 * RATES["output_mtok"]) / 1e6
    turn, tenant = final
    assert (turn.scope, turn.period, turn.unit, turn.limit) == ("turn", "", "tokens", 10_000)
    assert (turn.spent, turn.reserved, turn.remaining, turn.resets_at) == (1745, 0, 10_000 - 1745, None)
    assert (tenant.scope, tenant.unit, tenant.limit, tenant.reserved) == ("tenant/day", "usd", 5.0, 0.0)
    assert tenant.spent == pytest.approx(usd) and tenant.remaining == pytest.approx(5.0 - usd)
    midnight = dt.datetime.combine(dt.datetime.now(dt.UTC).date(), dt.time(), dt.UTC) + dt.timedelta(days=1)
    assert tenant.period == dt.datetime.now(dt.UTC).strftime("%Y-%m-%d") and tenant.resets_at == midnight


class SeesOneHook(Middleware):
    """Implements only ``hook`` (one whose context carries budget states) and keeps what each
    call saw: its own states, and (``before_step``) those of the steps before it."""

    def __init__(self, hook: str) -> None:
        self.hook = hook
        self.seen: list[tuple[Sequence[BudgetState], ...]] = []
        setattr(self, hook, self._keep)

    def implemented_hooks(self) -> frozenset[str]:
        return frozenset({self.hook})

    async def _keep(self, ctx: Any) -> None:
        steps = tuple(step.budgets for step in getattr(ctx, "steps", ()))
        self.seen.append((ctx.budgets, *steps))


@pytest.mark.parametrize("hook", ["before_step", "on_step_finish", "on_chat_response"])
async def test_each_hook_that_carries_budgets_sees_them_alone(make_engine: EngineFactory, hook: str) -> None:
    # The engine builds budget states only when a hook's context carries them: a chain with
    # any one of those hooks (before_step sees its steps' states too) gets them all.
    only = SeesOneHook(hook)
    h = await make_engine(
        scripts={"main": STEPS},
        tools=[make_tool("echo", echo)],
        middlewares=[only],
        prices=PRICED,
        budgets=BUDGETS,
    )
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    assert only.seen, hook
    last = only.seen[-1]
    assert all(len(states) == 2 for states in last), (hook, last)  # the turn's and the tenant's day
    if hook == "before_step":
        assert len(last) == 2 and last[1][0].spent == 0 < last[1][0].reserved  # step 1's, at its finish


async def test_without_a_budget_hooks_see_none(make_engine: EngineFactory) -> None:
    budgets = Budgets()
    h = await make_engine(scripts={"main": STEPS}, tools=[make_tool("echo", echo)], middlewares=[budgets])
    budgets.harness = h
    await h.run("hi")
    assert [states for _, states, _ in budgets.seen] == [()] * 5


async def test_before_step_lowers_a_steps_budget_without_a_write(make_engine: EngineFactory) -> None:
    h = await make_engine(middlewares=[LowersSteps(max_step_tokens=300)])
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    (request,) = h.provider.requests
    # 300 less the prompt's estimate (a few dozen tokens).
    assert request.settings.max_output_tokens is not None and 250 < request.settings.max_output_tokens < 300
    assert await h.store.budget_spends([BudgetKey("turn", "r1"), BudgetKey("conversation", CONV)]) == {}


async def test_the_lower_of_the_steps_and_the_turns_budget_wins(make_engine: EngineFactory) -> None:
    # A step budget above the turn's: the turn's clamps (a hook cannot raise a budget) …
    h = await make_engine(
        middlewares=[LowersSteps(max_step_tokens=50_000)],
        budgets=BudgetSettings.model_validate({"turn": {"tokens": 400}}),
    )
    await h.run("hi")
    # … and of two middlewares' step budgets, the lower.
    h2 = await make_engine(
        db="two.db",
        middlewares=[LowersSteps(max_step_tokens=200), LowersSteps(max_step_tokens=900)],
        budgets=BudgetSettings.model_validate({"turn": {"tokens": 400}}),
    )
    await h2.run("hi")
    (high,) = h.provider.requests
    (low,) = h2.provider.requests
    assert 350 < (high.settings.max_output_tokens or 0) < 400
    assert 150 < (low.settings.max_output_tokens or 0) < 200


async def test_a_dollar_step_budget_clamps_by_the_models_price(make_engine: EngineFactory) -> None:
    h = await make_engine(middlewares=[LowersSteps(max_step_usd=0.0015)], prices=PRICED)
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    (request,) = h.provider.requests
    # $0.0015 at $15 per million output tokens: at most 100 (less the prompt's cost).
    assert request.settings.max_output_tokens is not None and 90 < request.settings.max_output_tokens <= 100


async def test_a_step_budget_without_room_ends_the_turn(make_engine: EngineFactory) -> None:
    h = await make_engine(
        middlewares=[LowersSteps(max_step_tokens=5)],
        budgets=BudgetSettings.model_validate({"turn": {"tokens": 10_000}}),
    )
    end = end_of(await h.run("hi"))
    assert end.status == event_pb2.TURN_STATUS_ERROR and _reason(end) == "BUDGET_EXHAUSTED"
    assert (
        "the step budget" in end.error.message and "before_step limited it to 5 tokens" in end.error.message
    )
    assert h.provider.calls == 0
    # Nothing stays reserved for the step never sent.
    spends = await h.store.budget_spends([BudgetKey("turn", "r1")])
    assert spends.get(BudgetKey("turn", "r1"), BudgetSpend()).reserved_tokens == 0


async def test_a_remote_hook_sees_the_budgets_and_lowers_a_step(make_engine: EngineFactory) -> None:
    server = RecordingHookServer()
    server.answers["BeforeStep"] = lambda request, context: hooks_pb2.BeforeStepResponse(max_step_tokens=300)
    budgets = Budgets()
    async with serving(server) as address:
        remote = RemoteMiddleware(RemoteHookSettings(address=address))
        try:
            h = await make_engine(
                scripts={"main": STEPS},
                tools=[make_tool("echo", echo)],
                middlewares=[budgets, remote],
                prices=PRICED,
                budgets=BUDGETS,
            )
            budgets.harness = h
            await h.chain.configure_session(SessionContext(default_model=MODEL, system="sys", tools={}))
            assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
        finally:
            await remote.aclose()
    # The hook's lower step budget clamped both steps (the turn's 500 of assumed output did not).
    for request in h.provider.requests:
        assert 200 < (request.settings.max_output_tokens or 0) < 300
    # The remote hook got what the middleware beside it got, which the store held.
    got = {
        rpc: [call.request for call in server.calls if call.rpc == rpc]
        for rpc in ("BeforeStep", "OnStepFinish", "OnChatResponse")
    }
    wanted = {
        rpc: [convert.budget_states(states) for hook, states, _ in budgets.seen if hook == name]
        for rpc, name in (
            ("BeforeStep", "before_step"),
            ("OnStepFinish", "on_step_finish"),
            ("OnChatResponse", "on_chat_response"),
        )
    }
    assert {rpc: [list(r.budgets) for r in requests] for rpc, requests in got.items()} == wanted
    (response,) = got["OnChatResponse"]
    turn, tenant = response.budgets
    assert (turn.scope, turn.unit, turn.spent, turn.reserved) == (
        "turn",
        hooks_pb2.BUDGET_UNIT_TOKENS,
        1745,
        0,
    )
    assert not turn.HasField("resets_at") and tenant.HasField("resets_at")
    assert tenant.unit == hooks_pb2.BUDGET_UNIT_USD and tenant.period


def test_a_remote_step_budget_below_zero_is_an_invalid_response() -> None:
    with pytest.raises(convert.InvalidResponse, match="max_step_tokens"):
        convert.step_config(hooks_pb2.BeforeStepResponse(max_step_tokens=-1))
    with pytest.raises(convert.InvalidResponse, match="max_step_usd"):
        convert.step_config(hooks_pb2.BeforeStepResponse(max_step_usd=float("nan")))
    config = convert.step_config(hooks_pb2.BeforeStepResponse(max_step_usd=0.25))
    assert config is not None and (config.max_step_tokens, config.max_step_usd) == (None, 0.25)
