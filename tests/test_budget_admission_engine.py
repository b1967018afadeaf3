"""The engine's check of a new turn's budgets (docs/cost.md, "Budgets"): on a conversation idle here
it rides the turn's admission (``Store.admit_turn``'s ``refuse``), and ``TurnEngine.start`` still
raises the refusal before it returns, with nothing of the turn left behind (no hook run, no turn
counted, no stream, the request id free); on a conversation with a turn running here it is a read
before the new turn queues, so the refusal does not wait for that turn; a caller cancelled while
``start`` waits for the check lets the turn go as a caller that hangs up does."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from google.rpc import code_pb2
from opentelemetry.trace import StatusCode
from support.engine_harness import CONV, EngineFactory, collect, end_of
from support.traces import memory_tracing, named
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
from turnwire_server.engine.budget_settings import BudgetLimit, BudgetSettings
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


async def _held_in_its_model_call(h: Any) -> tuple[Any, asyncio.Event]:
    """A turn ``first`` started on ``CONV`` and held in its model call (the lock held, its
    reservation taken) until the returned event is set."""
    calling, release = asyncio.Event(), asyncio.Event()

    async def held(_: Any) -> None:
        calling.set()
        await release.wait()

    h.provider.before_stream = held
    running = await h.start("first")
    await asyncio.wait_for(calling.wait(), 5)
    return running, release


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
    running, release = await _held_in_its_model_call(h)
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


async def _behind_one_not_seen_here(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch, **budgets: Any
) -> tuple[Any, Hooks, asyncio.Event, Any]:
    """A turn running on ``CONV`` that the engine does not see (as another replica's, or a place
    this process holds for a submission: ``_local_busy`` answers idle), held in its model call
    until the returned event is set; the harness and its hooks."""
    from turnwire_server.engine.engine import TurnEngine

    hooks = Hooks()
    h = await make_engine(
        scripts={"main": [LONG]}, middlewares=[hooks], budgets=BudgetSettings.model_validate(budgets)
    )
    monkeypatch.setattr(TurnEngine, "_local_busy", lambda *_, **__: None)
    ahead, release = await _held_in_its_model_call(h)
    return h, hooks, release, ahead


async def test_a_turn_waiting_behind_one_not_seen_here_is_refused_at_once(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn ahead reserved the whole budget: the new turn, waiting in line behind it, is
    refused by the engine's read before ``start`` returns, and nothing of it stays in line."""
    h, hooks, release, ahead = await _behind_one_not_seen_here(
        make_engine, monkeypatch, conversation={"tokens": 1_000}, assumed_max_output_tokens=10_000
    )
    hooks.ran.clear()
    try:
        with pytest.raises(BudgetRefused):
            await h.start("second", request_id="behind", message_id="u-behind")
        assert h.engine.running == 1  # the turn ahead only
    finally:
        release.set()
    assert end_of(await collect(ahead)).status == event_pb2.TURN_STATUS_COMPLETED
    assert hooks.ran == ["on_chat_response"]  # the turn ahead's
    assert await h.store.get_turn("behind") is None


async def test_a_turn_that_waited_behind_one_not_seen_here_is_refused_by_its_stream(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The budget had room while the new turn waited; the turn ahead spent it. When its turn comes
    the admission's own check refuses it: its stream's only event is a TurnEnd with the refusal
    (the call's refusal, before any TurnStart), no hook runs, nothing is stored."""
    h, hooks, release, ahead = await _behind_one_not_seen_here(
        make_engine, monkeypatch, conversation={"tokens": 1_000}, assumed_max_output_tokens=100
    )
    try:
        behind = await h.start("second", request_id="behind", message_id="u-behind")
        hooks.ran.clear()
    finally:
        release.set()
    assert end_of(await collect(ahead)).status == event_pb2.TURN_STATUS_COMPLETED  # 1 100 of 1 000
    (event,) = await collect(behind)
    assert event.turn_end.status == event_pb2.TURN_STATUS_ERROR
    assert event.turn_end.error.code == code_pb2.RESOURCE_EXHAUSTED
    assert "conversation budget" in event.turn_end.error.message
    assert hooks.ran == ["on_chat_response"]  # the turn ahead's
    assert await h.store.get_turn("behind") is None
    assert await h.store.get_stream("behind") is None


async def _spent(make_engine: EngineFactory, **kwargs: Any) -> Any:
    """A harness whose conversation ``CONV`` spent its 1 000 tokens (1 100: the one turn overspent)."""
    h = await make_engine(
        scripts={"main": [LONG]},
        budgets=BudgetSettings.model_validate({"conversation": {"tokens": 1_000}}),
        **kwargs,
    )
    assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED
    return h


async def test_reject_on_a_line_this_process_holds_is_refused_by_the_budget_first(
    make_engine: EngineFactory,
) -> None:
    """A place in the conversation's line (a pending submission's) makes REJECT refuse new input as
    a turn in progress; a spent budget is said first, as when the check was a read before it."""
    h = await _spent(make_engine)
    await h.store.reserve_place(CONV, "sub-1", owner="", lease_seconds=30)
    rejecting = dataclasses.replace(h.request("again"), concurrent_input="reject")
    with pytest.raises(BudgetRefused):
        await h.engine.start(rejecting)
    await h.store.release_place(CONV, "sub-1")


async def test_a_refused_turn_records_its_span_as_refused_on_either_path(make_engine: EngineFactory) -> None:
    tracing, exporter = memory_tracing()
    h = await _spent(make_engine, tracing=tracing)
    with pytest.raises(BudgetRefused):  # the check rides the admission
        await h.start("again")
    interrupting = dataclasses.replace(h.request("again"), concurrent_input="interrupt")
    with pytest.raises(BudgetRefused):  # the check is a read before the turn queues
        await h.engine.start(interrupting)
    turns = named(exporter.get_finished_spans(), "invoke_agent turnwire")
    statuses = sorted(str((span.attributes or {})["turnwire.turn.status"]) for span in turns)
    assert statuses == ["completed", "refused", "refused"]
    for span in turns:
        if (span.attributes or {})["turnwire.turn.status"] == "refused":
            assert span.status.status_code == StatusCode.ERROR


async def test_start_does_not_wait_for_the_hooks_of_a_turn_its_admission_failed(
    make_engine: EngineFactory,
) -> None:
    """The input is refused by a rule of its own (another text under a stored message id): the
    call's refusal comes from the stream's TurnEnd, and ``start`` returns as before, without
    waiting for ``on_chat_error`` to run."""
    release = asyncio.Event()

    class SlowErrors(Middleware):
        async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
            await release.wait()
            return ctx.error

    h = await make_engine(
        scripts={"main": [LONG]},
        middlewares=[SlowErrors()],
        budgets=BudgetSettings.model_validate({"conversation": {"tokens": 100_000}}),
    )
    assert end_of(await h.run("hi", message_id="u-1")).status == event_pb2.TURN_STATUS_COMPLETED
    try:
        handle = await asyncio.wait_for(h.start("another text", message_id="u-1"), 5)
    finally:
        release.set()
    (event,) = await collect(handle)
    assert event.turn_end.error.code == code_pb2.ALREADY_EXISTS


async def test_a_continuation_is_checked_by_the_read_of_spent_budgets_alone(
    make_engine: EngineFactory,
) -> None:
    """ContinueLastTurn (and SaveMessages without messages) store no input, so their check is the
    read of spent budgets: a request's own turn budget with no room for the first step is not sized
    at admission (a Chat's is): the turn runs and ends BUDGET_EXHAUSTED at its first step, unsent;
    a spent conversation budget refuses one (docs/cost.md, "When a budget is exhausted"; the page
    listed ContinueLastTurn among the turns refused for want of room: developer trial)."""
    h = await make_engine(
        scripts={"main": [LONG]}, budgets=BudgetSettings.model_validate({"conversation": {"tokens": 2_000}})
    )
    await h.run("hi")  # 1 100 of 2 000
    with pytest.raises(BudgetRefused):  # a Chat's first step is sized at its admission
        await h.engine.start(dataclasses.replace(h.request("more"), budget=BudgetLimit(tokens=5)))
    request = dataclasses.replace(h.request(None, continuation=True), budget=BudgetLimit(tokens=5))
    end = end_of(await collect(await h.engine.start(request)))
    assert end.status == event_pb2.TURN_STATUS_ERROR and "no room for another model step" in end.error.message
    assert h.provider.calls == 1  # the continuation's step was not sent
    await h.run("again")  # 2 200 of 2 000: spent
    with pytest.raises(BudgetRefused) as refused:
        await h.start(None, continuation=True)
    assert refused.value.budget == "conversation"
