"""The engine's check of a new turn's budgets (docs/cost.md, "Budgets"): on a conversation idle here
it rides the turn's admission (``Store.admit_turn``'s ``refuse``), and ``TurnEngine.start`` still
raises the refusal before it returns, with nothing of the turn left behind (no hook run, no turn
counted, no stream, the request id free); on a conversation with a turn running here it is a read
before the new turn queues, so the refusal does not wait for that turn; a caller cancelled while
``start`` waits for the check lets the turn go as a caller that hangs up does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from google.rpc import code_pb2
from support.engine_harness import CONV, EngineFactory, collect, end_of
from support.waiting import wait_until

from turnwire.hooks import (
    ChatErrorContext,
    ChatResponseContext,
    Middleware,
    TurnConfig,
    TurnContext,
)
from turnwire.testing import ScriptedUsage, ScriptStep
from turnwire_client.v1 import event_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.errors import BudgetRefused
from turnwire_server.store.sqlite import SqliteStore

LONG = ScriptStep(text="Long.", usage=ScriptedUsage(input_tokens=900, output_tokens=200), repeat=True)


class Hooks(Middleware):
    """Names every turn-level hook that ran."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        self.ran.append("before_turn")
        return None

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        self.ran.append("on_chat_error")
        return ctx.error

    async def classify_chat_error(self, ctx: ChatErrorContext) -> Any:
        self.ran.append("classify_chat_error")
        return None

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        self.ran.append("on_chat_response")


def _turns_counted() -> float:
    return sum(sample.value for family in metrics.TURNS.collect() for sample in family.samples)


async def test_a_refusal_riding_the_admission_leaves_nothing_of_the_turn(make_engine: EngineFactory) -> None:
    hooks = Hooks()
    h = await make_engine(
        scripts={"main": [LONG]},
        middlewares=[hooks],
        budgets=BudgetSettings.model_validate({"conversation": {"tokens": 1_000}}),
    )
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED  # 1 100 of 1 000
    stored = [m.id for m in await h.store.load_messages(CONV)]
    hooks.ran.clear()
    counted = _turns_counted()
    for _ in range(2):  # the same request id at once again: refused again, not "in use"
        with pytest.raises(BudgetRefused) as refused:
            await h.start("again", request_id="again", message_id="u-again")
        assert refused.value.budget == "conversation"
    assert hooks.ran == []
    assert _turns_counted() == counted
    assert h.engine.running == 0
    assert [m.id for m in await h.store.load_messages(CONV)] == stored
    assert await h.store.get_turn("again") is None
    assert await h.store.get_stream("again") is None
    assert h.provider.calls == 1


async def test_on_a_busy_conversation_the_refusal_does_not_wait_for_the_running_turn(
    make_engine: EngineFactory,
) -> None:
    """The running turn's reservation takes the whole budget: a new turn queued behind it could
    never run, so it is refused at once, by a read before it queues, while that turn still runs."""
    h = await make_engine(
        scripts={"main": [LONG]},
        budgets=BudgetSettings.model_validate(
            {"conversation": {"tokens": 1_000}, "assumed_max_output_tokens": 10_000}
        ),
    )
    calling, release = asyncio.Event(), asyncio.Event()

    async def held(_: Any) -> None:
        calling.set()
        await release.wait()

    h.provider.before_stream = held
    running = await h.start("first")
    await asyncio.wait_for(calling.wait(), 5)
    with pytest.raises(BudgetRefused) as refused:
        await h.start("second")
    assert refused.value.budget == "conversation"
    assert not running.run.ended
    release.set()
    assert end_of(await collect(running)).status == event_pb2.TURN_STATUS_COMPLETED


async def test_a_caller_cancelled_while_start_waits_for_the_check_lets_the_turn_go(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The caller's task is cancelled while the admission (and its check) is being committed: the
    turn is released as a hung-up caller's (cancelled: the request asked for no disconnect
    policy), so it ends ABORTED with its input stored, and is not left running."""
    h = await make_engine(
        scripts={"main": [LONG]},
        budgets=BudgetSettings.model_validate({"conversation": {"tokens": 100_000}}),
    )
    committing, release = asyncio.Event(), asyncio.Event()
    start_turn = SqliteStore._start_turn

    async def slow_start(self: SqliteStore, *args: Any, **kwargs: Any) -> Any:
        committing.set()
        await release.wait()
        return await start_turn(self, *args, **kwargs)

    monkeypatch.setattr(SqliteStore, "_start_turn", slow_start)
    caller = asyncio.create_task(h.start("hi", request_id="gone"))
    await asyncio.wait_for(committing.wait(), 5)
    caller.cancel()
    with pytest.raises(asyncio.CancelledError):
        await caller
    release.set()
    await wait_until(lambda: h.engine.running == 0, what="the released turn ends")
    record = await h.store.get_turn("gone")
    assert record is not None and record.state == "aborted"
    assert h.provider.calls == 0


async def test_a_turn_that_waited_behind_one_not_seen_here_is_refused_by_its_stream(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As behind another replica's turn (PostgreSQL): the engine sees the conversation idle, so the
    check rides the admission; the turn waits in line, ``start`` returns, and when its turn comes
    the budget the turn ahead spent refuses it: its stream's only event is a TurnEnd with the
    refusal (the call's refusal, before any TurnStart), no hook runs, nothing is stored."""
    from turnwire_server.engine.engine import TurnEngine

    hooks = Hooks()
    h = await make_engine(
        scripts={"main": [LONG]},
        middlewares=[hooks],
        budgets=BudgetSettings.model_validate({"conversation": {"tokens": 1_000}}),
    )
    monkeypatch.setattr(TurnEngine, "_local_busy", lambda *_, **__: None)
    calling, release = asyncio.Event(), asyncio.Event()

    async def held(_: Any) -> None:
        calling.set()
        await release.wait()

    h.provider.before_stream = held
    ahead = await h.start("first")
    await asyncio.wait_for(calling.wait(), 5)
    behind = await h.start("second", request_id="behind", message_id="u-behind")
    hooks.ran.clear()
    release.set()
    assert end_of(await collect(ahead)).status == event_pb2.TURN_STATUS_COMPLETED  # 1 100 of 1 000
    (event,) = await collect(behind)
    assert event.turn_end.status == event_pb2.TURN_STATUS_ERROR
    assert event.turn_end.error.code == code_pb2.RESOURCE_EXHAUSTED
    assert "conversation budget" in event.turn_end.error.message
    assert hooks.ran == ["on_chat_response"]  # the turn ahead's
    assert await h.store.get_turn("behind") is None
    assert await h.store.get_stream("behind") is None
