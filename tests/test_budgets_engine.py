"""Budgets in a running turn (docs/cost.md, "Budgets"): each step is sent with max_output_tokens
clamped to what its budgets have room for; a step without room ends the turn ERROR with reason
BUDGET_EXHAUSTED, its partial reply stored and on_chat_error told; a new turn on a spent
conversation is refused before anything is stored; a model without a price cannot run under a
dollar budget; a request lowers its own budget; a recovered turn settles what the lost attempt
reserved once; with no budget configured nothing is written."""

from __future__ import annotations

import datetime as dt
import json
import re
from pathlib import Path
from typing import Any

import pytest
from google.rpc import error_details_pb2
from support.engine_harness import CONV, MODEL, EngineFactory, collect, echo, end_of, make_tool, text_of
from support.store_turns import crashed_turn
from support.waiting import wait_until

from turnwire.hooks import ChatErrorContext, Middleware
from turnwire.testing import ScriptedUsage, ScriptStep
from turnwire_client.v1 import error_reason_pb2, event_pb2, message_pb2
from turnwire_server.engine.budget_refusals import dollars
from turnwire_server.engine.budget_settings import BudgetLimit, BudgetSettings
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.engine.errors import BudgetExhausted, BudgetRefused
from turnwire_server.engine.events import DetachedResponse
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.turn_spec import parse_spec, spec_json
from turnwire_server.store.records import BudgetAsk, BudgetCharge, BudgetKey, BudgetLimits, BudgetSpend
from turnwire_server.store.sqlite import SqliteStore

PRICED = PriceBook(
    PricingSettings.model_validate({"models": {MODEL: {"input_mtok": 3.0, "output_mtok": 15.0}}})
)
TOOL_STEP = ScriptStep(
    text="Calling.",
    tool_calls=[{"name": "echo", "input": {"n": 1}}],
    usage=ScriptedUsage(input_tokens=900, output_tokens=95),
)
LAST_STEP = ScriptStep(text="Done.", usage=ScriptedUsage(input_tokens=700, output_tokens=50))


def _budgets(**section: Any) -> BudgetSettings:
    return BudgetSettings.model_validate(section)


class ChatErrors(Middleware):
    """Keeps what on_chat_error was told."""

    def __init__(self) -> None:
        self.errors: list[ChatErrorContext] = []

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        self.errors.append(ctx)
        return ctx.error


def _reason(end: event_pb2.TurnEnd) -> str:
    for detail in end.error.details:
        info = error_details_pb2.ErrorInfo()
        if detail.Unpack(info):
            return str(info.reason)
    return ""


async def test_a_turn_over_its_budget_ends_with_the_reason_and_its_partial_stored(
    make_engine: EngineFactory,
) -> None:
    errors = ChatErrors()
    h = await make_engine(
        scripts={"main": [TOOL_STEP, LAST_STEP]},
        tools=[make_tool("echo", echo)],
        middlewares=[errors],
        max_steps=5,
        budgets=_budgets(turn={"tokens": 1_000}, assumed_max_output_tokens=500),
    )
    end = end_of(await h.run("hi"))
    # The first step fits (a few tokens of prompt and 500 of output) and uses 995 of the 1 000:
    # the second has no room for its prompt, so it is never sent.
    (first,) = h.provider.requests
    assert first.settings.max_output_tokens == 500
    assert end.status == event_pb2.TURN_STATUS_ERROR, end
    assert _reason(end) == "BUDGET_EXHAUSTED"
    assert "turn budget" in end.error.message
    # The partial reply (the first step and its tool call) is stored.
    stored = (await h.store.load_messages(CONV))[-1]
    assert stored.role == message_pb2.ROLE_ASSISTANT and "Calling." in text_of(stored)
    (told,) = errors.errors
    assert isinstance(told.error, BudgetExhausted) and told.error.budget == "turn"


async def test_max_output_tokens_is_clamped_to_the_room_left(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={"main": [ScriptStep(text="Short.", usage=ScriptedUsage(input_tokens=10, output_tokens=2))]},
        budgets=_budgets(conversation={"tokens": 300}, assumed_max_output_tokens=4_096),
    )
    events = await h.run("hi")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    (request,) = h.provider.requests
    assert request.settings.max_output_tokens is not None and 250 < request.settings.max_output_tokens < 300
    # Settled at the 12 tokens it used; nothing stays reserved.
    spends = await h.store.budget_spends([BudgetKey("conversation", CONV), BudgetKey("turn", "r1")])
    # No row of the turn's own: it has no limit.
    assert spends == {BudgetKey("conversation", CONV): BudgetSpend(12, 0.0, 0, 0.0)}


async def test_the_charges_ride_the_steps_checkpoint_and_the_turns_final_write(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = await make_engine(
        scripts={"main": [TOOL_STEP, LAST_STEP]},
        tools=[make_tool("echo", echo)],
        budgets=_budgets(conversation={"tokens": 10_000}, assumed_max_output_tokens=500),
    )
    charges: list[tuple[BudgetCharge, message_pb2.Message | None]] = []
    finishes: list[BudgetCharge | None] = []
    charge, finish = h.store.charge_budget, h.store.finish_turn

    async def counted_charge(c: BudgetCharge, *, checkpoint: message_pb2.Message | None = None) -> Any:
        charges.append((c, checkpoint))
        return await charge(c, checkpoint=checkpoint)

    async def counted_finish(*args: Any, budget: BudgetCharge | None = None, **kwargs: Any) -> Any:
        finishes.append(budget)
        return await finish(*args, budget=budget, **kwargs)

    monkeypatch.setattr(h.store, "charge_budget", counted_charge)
    monkeypatch.setattr(h.store, "finish_turn", counted_finish)
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    # One charge per step (the second settles the first), none at the end: the final write
    # settles the last step at its usage. The second step's charge stores the reply so far
    # (the first step and its tool result): the step's checkpoint.
    assert [c.ask is not None for c, _ in charges] == [True, True]
    (_, first), (_, second) = charges
    assert first is None and second is not None
    assert "Calling." in text_of(second)
    (call,) = (part.tool_call for part in second.parts if part.HasField("tool_call"))
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE and call.output_json
    (settlement,) = finishes
    assert settlement is not None and settlement.ask is None and settlement.spent == (750, None)
    spends = await h.store.budget_spends([BudgetKey("conversation", CONV)])
    assert spends == {BudgetKey("conversation", CONV): BudgetSpend(1_745, 0.0, 0, 0.0)}


async def test_a_new_turn_on_a_spent_conversation_is_refused_before_anything_is_stored(
    make_engine: EngineFactory,
) -> None:
    # It overspends by 100: its prompt is far more than estimated (its output cannot be more than
    # the 100 it was sent with, the scripted model caps what it reports as a real one does).
    h = await make_engine(
        scripts={
            "main": [ScriptStep(text="Long.", usage=ScriptedUsage(input_tokens=1_000, output_tokens=100))]
        },
        budgets=_budgets(conversation={"tokens": 1_000}, assumed_max_output_tokens=100),
    )
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    stored = len(await h.store.load_messages(CONV))
    with pytest.raises(BudgetRefused) as refused:
        await h.start("again")
    error = refused.value
    assert (error.budget, error.error_reason) == (
        "conversation",
        error_reason_pb2.ERROR_REASON_BUDGET_EXHAUSTED,
    )
    assert error.details().quota_violations == (
        ("conversation", "1,100 of its 1,000 tokens used or reserved"),
    )
    assert error.details().retry_after_seconds is None  # a conversation's budget never resets
    assert len(await h.store.load_messages(CONV)) == stored
    # Another conversation has its own budget.
    assert end_of(await h.run("hi", conversation_id="other")).status == event_pb2.TURN_STATUS_COMPLETED


async def test_a_model_without_a_price_cannot_run_under_a_dollar_budget(make_engine: EngineFactory) -> None:
    h = await make_engine(budgets=_budgets(tenant={"day": {"usd": 100}}))  # scripted: no price list
    end = end_of(await h.run("hi"))
    assert end.status == event_pb2.TURN_STATUS_ERROR and _reason(end) == "BUDGET_EXHAUSTED"
    assert "no known price" in end.error.message and h.provider.calls == 0


async def test_with_pricing_off_a_dollar_limit_says_so_not_to_price_the_model(
    make_engine: EngineFactory,
) -> None:
    """``pricing.enabled: false`` prices nothing, ``pricing.models`` included: a request's own
    dollar limit said "price it under pricing.models", which changed nothing (developer trial). A
    configured one is refused at start (tests/test_unknown_model_messages.py)."""
    off = PricingSettings.model_validate(
        {"enabled": False, "models": {MODEL: {"input_mtok": 3.0, "output_mtok": 15.0}}}
    )
    h = await make_engine(prices=PriceBook(off))
    end = end_of(await _run(h, TurnRequest(**{**_fields(h.request("hi")), "budget": BudgetLimit(usd=1.0)})))
    assert end.status == event_pb2.TURN_STATUS_ERROR and _reason(end) == "BUDGET_EXHAUSTED"
    assert "pricing is off (pricing.enabled: false)" in end.error.message
    assert "pricing.models" not in end.error.message and h.provider.calls == 0


async def test_a_dollar_budget_clamps_by_the_models_price(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={"main": [ScriptStep(text="Hi.", usage=ScriptedUsage(input_tokens=10, output_tokens=3))]},
        prices=PRICED,
        budgets=_budgets(turn={"usd": 0.0015}),
    )
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    (request,) = h.provider.requests
    # ~$0.0015 at $15 per million output tokens: at most 100 output tokens (less the prompt's cost).
    assert request.settings.max_output_tokens is not None and 90 < request.settings.max_output_tokens <= 100


async def test_a_request_lowers_its_own_budget_and_never_raises_it(make_engine: EngineFactory) -> None:
    h = await make_engine(budgets=_budgets(turn={"tokens": 5_000}, assumed_max_output_tokens=10_000))
    lower = h.request("hi")
    await _run(h, TurnRequest(**{**_fields(lower), "budget": BudgetLimit(tokens=200)}))
    higher = h.request("hi")
    await _run(h, TurnRequest(**{**_fields(higher), "budget": BudgetLimit(tokens=50_000)}))
    first, second = (r.settings.max_output_tokens or 0 for r in h.provider.requests)
    assert 150 < first < 200 and 4_900 < second < 5_000


async def test_a_requests_own_budget_holds_with_none_configured(make_engine: EngineFactory) -> None:
    """Fresh-user trial (stop 49): with no budget configured, a request's own ``budget`` was
    ignored (budgets were off unless the config set one). It is the turn's limit then: the step's
    output is clamped to it, and a limit the prompt alone exceeds ends the turn before its step."""
    h = await make_engine(budgets=_budgets(assumed_max_output_tokens=10_000))
    lowered = TurnRequest(**{**_fields(h.request("hi")), "budget": BudgetLimit(tokens=200)})
    assert end_of(await _run(h, lowered)).status == event_pb2.TURN_STATUS_COMPLETED
    (request,) = h.provider.requests
    assert request.settings.max_output_tokens is not None and 150 < request.settings.max_output_tokens < 200
    tiny = TurnRequest(**{**_fields(h.request("hi")), "budget": BudgetLimit(tokens=1)})
    end = end_of(await _run(h, tiny))
    assert end.status == event_pb2.TURN_STATUS_ERROR and "turn budget" in end.error.message
    assert len(h.provider.requests) == 1, "the tiny turn's step was not sent"


async def test_a_principals_spent_day_refuses_its_turns_not_anothers(make_engine: EngineFactory) -> None:
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(
                    text="Long.", usage=ScriptedUsage(input_tokens=900, output_tokens=200), repeat=True
                )
            ]
        },
        budgets=_budgets(principal={"day": {"tokens": 1_000}}, assumed_max_output_tokens=100),
    )
    alice = TurnRequest(**{**_fields(h.request("hi", conversation_id="acme/a1")), "principal": "alice"})
    assert end_of(await _run(h, alice)).status == event_pb2.TURN_STATUS_COMPLETED
    again = TurnRequest(**{**_fields(h.request("hi", conversation_id="acme/a2")), "principal": "alice"})
    with pytest.raises(BudgetRefused) as refused:
        await h.engine.start(again)
    assert refused.value.budget == "principal/day" and refused.value.resets_in_seconds is not None
    bob = TurnRequest(**{**_fields(h.request("hi", conversation_id="acme/b1")), "principal": "bob"})
    assert end_of(await _run(h, bob)).status == event_pb2.TURN_STATUS_COMPLETED


async def test_min_output_tokens_ends_a_turn_rather_than_send_a_step_too_short(
    make_engine: EngineFactory,
) -> None:
    h = await make_engine(budgets=_budgets(turn={"tokens": 300}, min_output_tokens=500))
    end = end_of(await h.run("hi"))
    assert end.status == event_pb2.TURN_STATUS_ERROR and _reason(end) == "BUDGET_EXHAUSTED"
    assert h.provider.calls == 0


async def test_a_principals_budget_without_authentication_writes_nothing(make_engine: EngineFactory) -> None:
    h = await make_engine(budgets=_budgets(principal={"day": {"usd": 1}}))  # no principal: none applies
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    assert h.provider.requests[0].settings.max_output_tokens is None  # nothing clamped
    assert await h.store.budget_spends([BudgetKey("turn", "r1")]) == {}


async def test_no_budget_configured_writes_nothing(make_engine: EngineFactory) -> None:
    h = await make_engine()
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    assert h.provider.requests[0].settings.max_output_tokens is None  # nothing clamped
    assert await h.store.budget_spends([BudgetKey("turn", "r1"), BudgetKey("conversation", CONV)]) == {}


async def test_a_recovered_turn_settles_the_lost_attempts_reservation_once(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    # A replica reserved a step (epoch 0) and died: the recovery (epoch 1) charges that
    # reservation once, at what it reserved, plus what its own step used; nothing stays reserved.
    conversation = BudgetKey("conversation", "c-crash")
    # "alice" is kept in the turn's spec: the recovery runs under alice's budgets.
    await _crashed_with_a_reservation(
        tmp_path, "c-crash", BudgetLimits(conversation, tokens=100_000, conversation_id="c-crash"), "alice"
    )

    h = await make_engine(
        scripts={"main": [ScriptStep(text="Told.", usage=ScriptedUsage(input_tokens=100, output_tokens=5))]},
        budgets=_budgets(
            conversation={"tokens": 100_000},
            principal={"day": {"tokens": 100_000}},
            assumed_max_output_tokens=2_000,
        ),
    )
    assert await h.engine.recover() == 1
    await wait_until(lambda: h.engine.running == 0, what="the recovery ends")
    events = [event async for batch in h.engine.replay("r-c-crash", 0) for event in batch]
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    alice = BudgetKey("principal/day", "/alice", dt.datetime.now(dt.UTC).strftime("%Y-%m-%d"))
    spends = await h.store.budget_spends([conversation, alice])
    assert spends[conversation] == BudgetSpend(3_000 + 105, 0.0, 0, 0.0)
    assert spends[alice] == BudgetSpend(105, 0.0, 0, 0.0)


@pytest.mark.parametrize("configured", [{}, {"turn": {"tokens": 5_000}}], ids=["none-configured", "lowered"])
async def test_a_recovered_turn_keeps_the_requests_own_budget(
    make_engine: EngineFactory, tmp_path: Path, configured: dict[str, Any]
) -> None:
    """Left for later at stop 49: a request's own budget lived only in the request, so the
    recovery of a crashed turn (or its takeover by another replica: the same path) ran unlimited,
    or at the configured turn budget the request had lowered. The turn's spec keeps it."""
    request = TurnRequest(
        conversation_id="c-own",
        request_id="r-c-own",
        messages=[],
        body={},
        model=MODEL,
        continuation=False,
        response_type=DetachedResponse,
        budget=BudgetLimit(tokens=200),
    )
    assert parse_spec(spec_json(request)).budget == BudgetLimit(tokens=200)
    crashed = SqliteStore(tmp_path / "turnwire.db")
    await crashed.open()
    await crashed_turn(crashed, "c-own", "r-c-own", model=MODEL, edit_spec=lambda _: spec_json(request))
    await crashed.close()

    h = await make_engine(budgets=_budgets(**configured, assumed_max_output_tokens=10_000))
    assert await h.engine.recover() == 1
    await wait_until(lambda: h.engine.running == 0, what="the recovery ends")
    (sent,) = h.provider.requests
    assert sent.settings.max_output_tokens is not None and 150 < sent.settings.max_output_tokens < 200


@pytest.mark.parametrize("budget", [{"tokens": 0}, {"usd": -1}, {"tokens": "many"}, []])
def test_a_spec_with_a_broken_budget_is_refused(budget: Any) -> None:
    text = spec_json(TurnRequest("c", "r", [], {}, MODEL, False, DetachedResponse))
    with pytest.raises(ValueError, match="turn spec budget"):
        parse_spec(text.replace('"version":1', f'"version":1,"budget":{json.dumps(budget)}'))


def _fields(request: TurnRequest) -> dict[str, Any]:
    return {name: getattr(request, name) for name in TurnRequest.__dataclass_fields__}


async def _run(h: Any, request: TurnRequest) -> list[event_pb2.TurnEvent]:
    return await collect(await h.engine.start(request))


async def test_a_turn_left_interrupted_settles_what_it_had_reserved(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    tenant = BudgetKey("tenant/day", "", "2026-12-02")
    # Its recovery budget (3) is spent: it is left interrupted.
    await _crashed_with_a_reservation(tmp_path, "c-spent", BudgetLimits(tenant, tokens=100_000), recoveries=3)

    h = await make_engine(recovery_budget=3)  # no budget configured now: settled all the same
    await h.engine.recover()
    turn = await h.store.get_turn("r-c-spent")
    assert turn is not None and turn.state == "interrupted"
    assert (await h.store.budget_spends([tenant]))[tenant] == BudgetSpend(3_000, 0.0, 0, 0.0)


async def test_a_turn_left_interrupted_is_never_ended_with_its_reservation_still_held(
    make_engine: EngineFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its end and its settlement are one transaction: a crash right after the write that ends it
    # cannot leave the reservation held (it was two, the settlement second).
    tenant = BudgetKey("tenant/day", "", "2026-12-02")
    await _crashed_with_a_reservation(tmp_path, "c-once", BudgetLimits(tenant, tokens=100_000), recoveries=3)
    h = await make_engine(recovery_budget=3)
    finish_turn = h.store.finish_turn
    at_end: list[BudgetSpend] = []

    async def finish_then_look(*args: Any, **kwargs: Any) -> Any:
        result = await finish_turn(*args, **kwargs)
        at_end.append((await h.store.budget_spends([tenant]))[tenant])
        return result

    monkeypatch.setattr(h.store, "finish_turn", finish_then_look)
    await h.engine.recover()
    turn = await h.store.get_turn("r-c-once")
    assert turn is not None and turn.state == "interrupted"
    assert at_end == [BudgetSpend(3_000, 0.0, 0, 0.0)], "settled, once, by the write that ended it"
    assert (await h.store.budget_spends([tenant]))[tenant] == BudgetSpend(3_000, 0.0, 0, 0.0)


async def _crashed_with_a_reservation(
    tmp_path: Path, conversation_id: str, budget: BudgetLimits, principal: str = "", *, recoveries: int = 0
) -> None:
    """A turn ``r-<conversation_id>`` a dead replica left running in the harness's database after
    reserving a step of 1 000 tokens of prompt and 2 000 of output against ``budget``."""
    crashed = SqliteStore(tmp_path / "turnwire.db")
    await crashed.open()
    request_id = f"r-{conversation_id}"
    record = await crashed_turn(
        crashed,
        conversation_id,
        request_id,
        model=MODEL,
        text="tell me",
        principal=principal,
        owner="dead-replica",
        recovery_count=recoveries,
    )
    ask = BudgetAsk(prompt_tokens=1_000, prompt_usd=0.0, usd_per_output_token=0.0, max_output=2_000)
    await crashed.charge_budget(BudgetCharge(request_id, conversation_id, record.lease, (budget,), ask=ask))
    await crashed.close()


@pytest.mark.parametrize(
    ("budget", "used", "needs"),
    [
        # A token limit speaks in tokens.
        (
            {"tokens": 300},
            "0 of its 300 tokens used or reserved",
            r"needs about \d+ tokens of prompt \(an estimate\) and at least 500 of output",
        ),
        # A dollar limit speaks in dollars: 500 output tokens at $15 per million are $0.0075.
        (
            {"usd": 0.0001},
            "$0.00 of its $0.0001 used or reserved",
            r"needs about \$0\.0075\d* at the model's price",
        ),
        # Both limits: the one without room speaks (the tokens have plenty).
        (
            {"tokens": 1_000_000, "usd": 0.0001},
            "$0.00 of its $0.0001 used or reserved",
            r"needs about \$0\.0075",
        ),
    ],
)
async def test_a_budget_refusal_names_the_unit_of_the_limit_that_refused(
    make_engine: EngineFactory, budget: dict[str, Any], used: str, needs: str
) -> None:
    h = await make_engine(prices=PRICED, budgets=_budgets(turn=budget, min_output_tokens=500))
    end = end_of(await h.run("hi"))
    assert end.status == event_pb2.TURN_STATUS_ERROR and _reason(end) == "BUDGET_EXHAUSTED"
    assert used in end.error.message and re.search(needs, end.error.message), end.error.message
    if "usd" in budget:
        assert "tokens of prompt" not in end.error.message and "e-0" not in end.error.message
    assert h.provider.calls == 0


@pytest.mark.parametrize(
    ("amount", "text"),
    [(0.0, "$0.00"), (5, "$5.00"), (1234.5, "$1,234.50"), (0.0042, "$0.0042"), (0.00000123, "$0.00000123")],
)
def test_dollar_amounts_read_as_dollars(amount: float, text: str) -> None:
    assert dollars(amount) == text
