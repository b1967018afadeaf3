"""Where a turn's cost shows inside the process (docs/cost.md): the hooks' ``StepFinishContext.cost``
and ``ChatResponseContext.cost``, the remote hooks' ``StepInfo.cost`` and
``OnChatResponseRequest.cost``, and the ``turnwire.cost.*`` attributes of the chat and turn spans;
a step cut short costs what it reported; a recovered turn's total is unknown."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.engine_harness import MODEL, EngineFactory, echo, end_of, make_tool, of_kind
from support.store_turns import crashed_turn
from support.traces import memory_tracing, named, one
from support.waiting import wait_until

from turnwire.hooks import ChatResponseContext, Middleware, StepFinishContext
from turnwire.testing import ScriptedUsage, ScriptStep
from turnwire.types import Cost
from turnwire_client.v1 import event_pb2
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.remote_hooks import convert
from turnwire_server.store.sqlite import SqliteStore

RATES = {"input_mtok": 3.0, "output_mtok": 15.0}
STEPS = [
    ScriptStep(
        text="Calling.",
        tool_calls=[{"name": "echo", "input": {"n": 1}}],
        usage=ScriptedUsage(input_tokens=2000, output_tokens=100),
    ),
    ScriptStep(text="Done.", usage=ScriptedUsage(input_tokens=2400, output_tokens=60)),
]


def _usd(step: ScriptStep) -> float:
    assert step.usage.input_tokens is not None and step.usage.output_tokens is not None
    return (
        step.usage.input_tokens * RATES["input_mtok"] + step.usage.output_tokens * RATES["output_mtok"]
    ) / 1e6


class Costs(Middleware):
    """Keeps the costs its hooks were given."""

    def __init__(self) -> None:
        self.steps: list[StepFinishContext] = []
        self.responses: list[ChatResponseContext] = []

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self.steps.append(ctx)

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        self.responses.append(ctx)


async def test_hooks_and_spans_see_each_step_cost_and_the_turn_total(make_engine: EngineFactory) -> None:
    costs = Costs()
    tracing, exporter = memory_tracing()
    h = await make_engine(
        scripts={"main": STEPS},
        tools=[make_tool("echo", echo)],
        middlewares=[costs],
        tracing=tracing,
        prices=PriceBook(PricingSettings.model_validate({"models": {MODEL: RATES}})),
    )
    events = await h.run("go")

    wanted = [Cost(_usd(step), "config") for step in STEPS]
    assert [ctx.cost for ctx in costs.steps] == wanted
    assert [finish.cost.usd for finish in of_kind(events, "step_finish")] == [c.usd for c in wanted]
    (response,) = costs.responses
    total = sum(c.usd for c in wanted)
    assert response.cost is not None and response.cost.usd == pytest.approx(total)
    assert end_of(events).cost.usd == pytest.approx(total)

    spans = exporter.get_finished_spans()
    chats = named(spans, "chat main")
    assert [span.attributes["turnwire.cost.usd"] for span in chats] == [c.usd for c in wanted]  # type: ignore[index]
    turn = one(spans, "invoke_agent turnwire").attributes
    assert turn is not None
    assert turn["turnwire.cost.usd"] == pytest.approx(total)
    assert turn["turnwire.cost.price_source"] == "config"

    # What a remote hook server gets.
    info = convert.turn_info("c", "r")
    assert convert.step_info(costs.steps[0]).cost.usd == wanted[0].usd
    assert convert.chat_response_request(response, info).cost.usd == pytest.approx(total)


async def test_unknown_cost_is_absent_everywhere(make_engine: EngineFactory) -> None:
    costs = Costs()
    tracing, exporter = memory_tracing()
    h = await make_engine(
        scripts={"main": [ScriptStep(text="Hi.")]}, middlewares=[costs], tracing=tracing
    )  # the default price book: a scripted entry has no price list
    events = await h.run("hi")
    assert [ctx.cost for ctx in costs.steps] == [None]
    assert costs.responses[0].cost is None
    assert not of_kind(events, "step_finish")[0].HasField("cost")
    assert not end_of(events).HasField("cost")
    for span in exporter.get_finished_spans():
        assert "turnwire.cost.usd" not in (span.attributes or {}), span.name
    assert not convert.step_info(costs.steps[0]).HasField("cost")
    assert not convert.chat_response_request(costs.responses[0], convert.turn_info("c", "r")).HasField("cost")


async def test_a_step_cut_short_costs_the_usage_reported_before_the_cut(make_engine: EngineFactory) -> None:
    step = ScriptStep(
        text="one two three",
        usage=ScriptedUsage(input_tokens=1500, output_tokens=3),
        error={"message": "connection reset", "status": 503, "after_chunks": 2},
    )
    h = await make_engine(
        scripts={"main": [step]},
        prices=PriceBook(PricingSettings.model_validate({"models": {MODEL: RATES}})),
    )
    events = await h.run("hi")
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert not of_kind(events, "step_finish")  # no step finished: the input the model read still costs
    assert end.usage.input_tokens == 1500
    assert end.cost.usd == pytest.approx(1500 * RATES["input_mtok"] / 1e6)
    assert end.cost.price_source == "config"


async def test_a_recovered_turn_has_an_unknown_cost(make_engine: EngineFactory, tmp_path: Path) -> None:
    # docs/cost.md: what the attempt lost in a crash spent died with its process; the rest is no total.
    crashed = SqliteStore(tmp_path / "turnwire.db")
    await crashed.open()
    await crashed_turn(crashed, "c-crash", "r-crash", model=MODEL, text="tell me")
    await crashed.close()

    h = await make_engine(
        scripts={"main": [ScriptStep(text="Told.", usage=ScriptedUsage(input_tokens=100, output_tokens=5))]},
        prices=PriceBook(PricingSettings.model_validate({"models": {MODEL: RATES}})),
    )
    assert await h.engine.recover() == 1
    await wait_until(lambda: h.engine.running == 0, what="the recovery ends")
    events = [event async for batch in h.engine.replay("r-crash", 0) for event in batch]
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert of_kind(events, "step_finish")[0].HasField("cost")  # its own step is priced
    assert not end_of(events).HasField("cost")
    view = await h.store.conversation_view("c-crash", 1)
    assert view is not None and view.cost is None
