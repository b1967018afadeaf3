"""Context-window overflow in the engine (docs/semantics.md §9): reactive compact-and-retry, the
proactive guard, ``compact_after``, and what the client and the store see.

Every test runs a real :class:`TurnEngine` on SQLite with the scripted model; its
``context_window`` makes a request whose input is larger fail with Anthropic's overflow error,
as a real model does, and the default classifier (``ErrorClassifier``) says ``context_overflow``.
Token counts are the scripted model's: a 4,000-character message is about 1,000 tokens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
from typing import Any

import pytest
from support.engine_harness import CONV, EngineFactory, Harness, end_of, kinds, of_kind, text_of

from turnwire.compaction import (
    ELIDED_OUTPUT,
    CompactionConfig,
    CompactionContext,
    CompactionResult,
    DropOldestToolOutputs,
    SummarizeOlder,
    user_boundaries,
)
from turnwire.hooks import ChatErrorContext, ChatResponseContext, Middleware
from turnwire.testing import ScriptedToolCall, ScriptedUsage, ScriptStep
from turnwire.tools import ToolExecution
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.store import TurnRecord

BIG = "x" * 4000  # ~1,000 tokens for the scripted model
SUMMARIZE = SummarizeOlder(model="scripted:summarizer")


class Observer(Middleware):
    """Records what on_chat_error and on_chat_response saw."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[ChatErrorContext] = []
        self.responses: list[ChatResponseContext] = []
        self.before_turns = 0

    async def before_turn(self, ctx: Any) -> None:
        self.before_turns += 1

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        self.errors.append(ctx)
        return ctx.error

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        self.responses.append(ctx)


@dataclasses.dataclass(frozen=True)
class TrimOldest:
    """A test strategy: each call replaces the oldest exchange (and any earlier summary) by a
    tiny marker, so the number of compactions a turn needs is exact."""

    name: str = "trim_oldest"

    async def compact(self, ctx: CompactionContext) -> CompactionResult:
        cuts = user_boundaries(ctx.messages, ctx.keep_from + 1)
        if not cuts:
            return CompactionResult()
        marker = message_pb2.Message(id=f"tw-c-{ctx.messages[cuts[0] - 1].id}", role=message_pb2.ROLE_USER)
        marker.parts.add().text.text = "(trimmed)"
        return CompactionResult(replaced=cuts[0], summary=marker)


async def seed(h: Harness, exchanges: int, text: str = BIG, *, first: int = 0) -> list[str]:
    """Store ``exchanges`` finished turns (user ``text``, assistant ``text``), numbered from
    ``first``; their ids."""
    ids = []
    for n in range(first, first + exchanges):
        user = message_pb2.Message(id=f"old-u{n}", role=message_pb2.ROLE_USER)
        user.parts.add().text.text = text
        reply = message_pb2.Message(id=f"old-a{n}", role=message_pb2.ROLE_ASSISTANT)
        reply.parts.add().text.text = text
        turn = TurnRecord(
            request_id=f"old-r{n}",
            conversation_id=CONV,
            assistant_message_id=reply.id,
            continuation=False,
            model="scripted:main",
            state="running",
            start_time=dt.datetime.now(dt.UTC),
        )
        await h.store.start_turn(turn, [user])
        await h.store.finish_turn(dataclasses.replace(turn, state="completed"), reply)
        ids += [user.id, reply.id]
    return ids


def compactions(events: list[event_pb2.TurnEvent]) -> list[event_pb2.ContextCompacted]:
    return list(of_kind(events, "context_compacted"))


def model_calls(h: Harness, model: str = "main") -> int:
    return sum(1 for r in h.provider.requests if r.model == model)


async def engine(make_engine: EngineFactory, config: CompactionConfig, **kwargs: Any) -> Harness:
    # No classifier listed: the default ErrorClassifier is in every chain.
    return await make_engine(compaction=config, **kwargs)


# --------------------------------------------------------------------------- reactive


async def test_an_overflow_is_compacted_and_the_turn_runs_again_in_the_same_stream(
    make_engine: EngineFactory,
) -> None:
    observer = Observer()
    h = await engine(
        make_engine,
        CompactionConfig(strategy=SUMMARIZE, reactive=True),
        context_window=2500,
        middlewares=[observer],
    )
    originals = await seed(h, 3)  # ~6,000 tokens: over the window
    events = await h.run("and now?", request_id="r-over")

    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    (compacted,) = compactions(events)
    assert compacted.reason == event_pb2.COMPACTION_REASON_REACTIVE
    assert compacted.shortened and compacted.attempt == 1 and compacted.strategy == "summarize"
    assert compacted.tokens_after < compacted.tokens_before
    (attempt,) = of_kind(events, "attempt_start")
    assert attempt.attempt == 2 and attempt.reason == "CONTEXT_OVERFLOW" and not attempt.appends
    first_id = of_kind(events, "turn_start")[0].message_id
    assert attempt.message_id != first_id and attempt.message_id.startswith("tw-a2-")
    # Order: the failed attempt, the compaction, then the new attempt; one terminal event.
    order = kinds(events)
    assert order.index("context_compacted") < order.index("attempt_start") < order.index("turn_end")
    # The model: the overflowing call, the summary, the call that fit (with the summary first).
    # The summary request of the whole history overflowed the (same) window too: it was
    # summarized in parts, each of which fit.
    assert model_calls(h) == 2 and model_calls(h, "summarizer") > 1
    retried = h.provider.requests[-1]
    assert retried.attempt == 2
    assert [m.id for m in retried.messages] == [f"tw-c-{originals[-1]}", "u1"]
    assert "Summary of the earlier conversation" in text_of(retried.messages[0])
    # Non-destructive: every original message is stored unchanged, plus the new reply only.
    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored] == [*originals, "u1", attempt.message_id]
    assert all(text_of(m) == BIG for m in stored[:6])
    assert end.message.id == attempt.message_id
    assert observer.before_turns == 2 and len(observer.responses) == 1 and not observer.errors
    # The next turn is sent the stored compaction (no new overflow, no new compaction).
    h.provider.requests.clear()
    events = await h.run("thanks")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED and not compactions(events)
    assert h.provider.requests[0].messages[0].id.startswith("tw-c-")


async def test_overflow_with_reactive_off_ends_the_turn_after_one_call(make_engine: EngineFactory) -> None:
    observer = Observer()
    h = await engine(
        make_engine, CompactionConfig(strategy=SUMMARIZE), context_window=2500, middlewares=[observer]
    )
    await seed(h, 3)
    events = await h.run("and now?")
    assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    assert model_calls(h) == 1 and not compactions(events) and "attempt_start" not in kinds(events)
    assert observer.errors[0].classification == "context_overflow"


async def test_overflow_when_the_retry_budget_is_spent_fails_cleanly(make_engine: EngineFactory) -> None:
    observer = Observer()
    h = await engine(
        make_engine,
        CompactionConfig(strategy=TrimOldest(), reactive=True, overflow_retries=1),
        context_window=1000,
        middlewares=[observer],
    )
    await seed(h, 3)
    events = await h.run("and now?")
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert model_calls(h) == 2 and len(compactions(events)) == 1
    assert "prompt is too long" in end.error.message
    # on_chat_error sees the classification; no on_chat_response; nothing partial stored.
    assert [e.classification for e in observer.errors] == ["context_overflow"]
    assert observer.responses == []
    assert not end.HasField("message")
    assert [m.role for m in await h.store.load_messages(CONV)][-1] == message_pb2.ROLE_USER


async def test_a_compaction_that_cannot_shorten_ends_the_turn(make_engine: EngineFactory) -> None:
    observer = Observer()
    h = await engine(
        make_engine,
        CompactionConfig(strategy=SUMMARIZE, reactive=True),
        context_window=500,
        middlewares=[observer],
    )
    events = await h.run(BIG)  # nothing older than this turn's own input
    assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    (compacted,) = compactions(events)
    assert not compacted.shortened and compacted.tokens_after == compacted.tokens_before
    assert model_calls(h) == 1 and model_calls(h, "summarizer") == 0
    assert observer.errors[0].classification == "context_overflow" and observer.responses == []
    assert await h.store.load_compaction(CONV) is None


async def test_two_overflow_retries_make_three_calls_and_two_compactions(make_engine: EngineFactory) -> None:
    h = await engine(
        make_engine,
        CompactionConfig(strategy=TrimOldest(), reactive=True, overflow_retries=2),
        context_window=2500,
    )
    await seed(h, 3)  # ~6,000 tokens; ~4,000 after one trim, ~2,000 after two
    events = await h.run("and now?")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert model_calls(h) == 3
    assert [(c.attempt, c.shortened) for c in compactions(events)] == [(1, True), (2, True)]
    assert [a.attempt for a in of_kind(events, "attempt_start")] == [2, 3]
    assert end_of(events).message.id.startswith("tw-a3-")


async def test_a_turn_cancelled_at_the_overflow_point_never_compacts(make_engine: EngineFactory) -> None:
    h = await engine(make_engine, CompactionConfig(strategy=SUMMARIZE, reactive=True), context_window=2500)
    await seed(h, 3)
    called = asyncio.Event()
    release = asyncio.Event()

    async def hold(request: Any) -> None:
        called.set()
        await release.wait()  # the overflow comes after this: the cancel lands first

    h.provider.before_stream = hold
    handle = await h.start("and now?")
    await asyncio.wait_for(called.wait(), 5)
    assert h.engine.cancel(handle.request_id)
    events = [r.event async for r in handle]
    assert end_of(events).status == event_pb2.TURN_STATUS_ABORTED
    assert not compactions(events) and model_calls(h) == 1
    assert await h.store.load_compaction(CONV) is None


async def test_an_overflow_only_a_smaller_output_fixes_is_not_compacted(make_engine: EngineFactory) -> None:
    """OpenAI's "… 64 in the messages, 8192 in the completion": compaction cannot help (the step is
    sent once more with a smaller ``max_output_tokens`` instead: tests/test_output_clamp.py)."""
    error = {
        "message": (
            "This model's maximum context length is 8192 tokens. However, you requested 8256 tokens "
            "(64 in the messages, 8192 in the completion). Please reduce the length of the messages or "
            "completion."
        ),
        "type": "invalid_request_error",
        "code": "context_length_exceeded",
        "status": 400,
    }
    h = await engine(
        make_engine,
        CompactionConfig(strategy=SUMMARIZE, reactive=True),
        scripts={"main": [ScriptStep(error=error)]},
    )
    await seed(h, 1, "short")
    events = await h.run("and now?")
    assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    assert not compactions(events) and model_calls(h) == 2


# --------------------------------------------------------------------------- proactive


def _tool_steps(inputs: list[int]) -> list[ScriptStep]:
    """A script whose step n calls ``lookup`` (except the last) and reports ``inputs[n]`` input
    tokens."""
    steps = [
        ScriptStep(
            tool_calls=[ScriptedToolCall(name="lookup", input={"n": n})],
            usage=ScriptedUsage(input_tokens=tokens),
        )
        for n, tokens in enumerate(inputs[:-1])
    ]
    return [*steps, ScriptStep(text="done", usage=ScriptedUsage(input_tokens=inputs[-1]))]


async def _lookup(input: dict[str, Any], execution: ToolExecution) -> dict[str, Any]:
    return {"n": input["n"], "data": "y" * 2000}


def _lookup_tool() -> Any:
    from support.engine_harness import make_tool

    return make_tool("lookup", _lookup)


async def _proactive(
    make_engine: EngineFactory, inputs: list[int], db: str = "turnwire.db", **config: Any
) -> tuple[Harness, list[Any]]:
    h = await engine(
        make_engine,
        CompactionConfig(strategy=DropOldestToolOutputs(), proactive=True, max_input_tokens=1000, **config),
        scripts={"main": _tool_steps(inputs)},
        tools=[_lookup_tool()],
        db=db,
    )
    events = await h.run("go")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    return h, events


async def test_the_proactive_guard_fires_once_across_three_steps(make_engine: EngineFactory) -> None:
    h, events = await _proactive(make_engine, [950, 950, 950])
    (compacted,) = compactions(events)
    assert compacted.reason == event_pb2.COMPACTION_REASON_PROACTIVE and compacted.attempt == 1
    order = kinds(events)
    # Before step 1 (after step 0 finished), never before step 0.
    assert order.index("step_finish") < order.index("context_compacted") < order.index("step_start", 2)
    assert compacted.shortened is False  # step 0's output is the only one, and it is kept
    assert model_calls(h) == 3


async def test_the_proactive_guard_fires_twice_with_two_compactions_allowed(
    make_engine: EngineFactory,
) -> None:
    h, events = await _proactive(make_engine, [950, 950, 950], max_compactions=2)
    assert [c.reason for c in compactions(events)] == [event_pb2.COMPACTION_REASON_PROACTIVE] * 2
    # The second (before step 2) dropped step 0's output from what the model is sent; the stored
    # reply keeps it.
    second = compactions(events)[1]
    assert second.shortened
    step2 = h.provider.requests[2].messages[-1]
    outputs = [p.tool_call.output_json for p in step2.parts if p.WhichOneof("kind") == "tool_call"]
    assert outputs[0].startswith('"' + ELIDED_OUTPUT.split("{")[0]) and "yyyy" in outputs[1]
    stored = (await h.store.load_messages(CONV))[-1]
    assert all("yyyy" in p.tool_call.output_json for p in stored.parts if p.WhichOneof("kind") == "tool_call")


async def test_the_proactive_guard_never_fires_before_step_0_and_fires_on_equality(
    make_engine: EngineFactory,
) -> None:
    # Below the threshold (900 = 1000 x 0.9): no compaction.
    _, events = await _proactive(make_engine, [899, 899, 899])
    assert not compactions(events)
    # Exactly at it: compacts.
    _, events = await _proactive(make_engine, [900, 10, 10], db="equal.db")
    assert len(compactions(events)) == 1
    # A one-step turn whose input is over the threshold: nothing before its only step.
    _, events = await _proactive(make_engine, [5000], db="one-step.db")
    assert not compactions(events)


async def test_both_layers_in_one_turn(make_engine: EngineFactory) -> None:
    """The guard compacts before step 1; step 1 still overflows: reactive compaction re-runs
    the turn, whose guard fires again (its own attempt's slot) and which then completes."""
    steps = _tool_steps([950, 1200])
    steps[1] = steps[1].model_copy(
        update={"retry": ScriptStep(text="done", usage=ScriptedUsage(input_tokens=10))}
    )
    h = await engine(
        make_engine,
        CompactionConfig(strategy=TrimOldest(), reactive=True, proactive=True, max_input_tokens=1000),
        scripts={"main": steps},
        tools=[_lookup_tool()],
        context_window=1000,
    )
    await seed(h, 2)
    events = await h.run("go")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    seen = [(c.reason, c.attempt, c.shortened) for c in compactions(events)]
    assert seen == [
        (event_pb2.COMPACTION_REASON_PROACTIVE, 1, True),
        (event_pb2.COMPACTION_REASON_REACTIVE, 1, True),
        (event_pb2.COMPACTION_REASON_PROACTIVE, 2, False),
    ]
    assert [a.attempt for a in of_kind(events, "attempt_start")] == [2]
    assert model_calls(h) == 4  # two steps per attempt


# --------------------------------------------------------------------------- between turns


async def test_compact_after_compacts_between_turns(make_engine: EngineFactory) -> None:
    h = await engine(make_engine, CompactionConfig(strategy=SUMMARIZE, compact_after=3000))
    await seed(h, 1)  # ~2,000 tokens: under the threshold
    events = await h.run("one")
    assert not compactions(events)
    await seed(h, 1, first=1)  # ~4,000 now: the next turn starts by compacting
    events = await h.run("two")
    (compacted,) = compactions(events)
    assert compacted.reason == event_pb2.COMPACTION_REASON_THRESHOLD and compacted.shortened
    assert kinds(events).index("context_compacted") < kinds(events).index("step_start")
    assert h.provider.requests[-1].messages[0].id.startswith("tw-c-")
    record = await h.store.load_compaction(CONV)
    assert record is not None and record.reason == "threshold"


async def test_a_step_cut_off_because_the_window_was_full_compacts_before_the_next(
    make_engine: EngineFactory,
) -> None:
    """Anthropic's ``stop_reason: model_context_window_exceeded`` (shared case E05) is not an
    error: the step's output is kept and the guard compacts before the next model call, whatever
    the usage said."""
    steps = _tool_steps([10, 10])
    steps[0] = steps[0].model_copy(update={"raw_finish_reason": "model_context_window_exceeded"})
    h = await engine(
        make_engine,
        CompactionConfig(strategy=TrimOldest(), proactive=True, max_input_tokens=100_000),
        scripts={"main": steps},
        tools=[_lookup_tool()],
    )
    await seed(h, 2)
    events = await h.run("go")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    (compacted,) = compactions(events)
    assert compacted.reason == event_pb2.COMPACTION_REASON_PROACTIVE and compacted.shortened
    assert h.provider.requests[1].messages[0].id.startswith("tw-c-")


async def test_a_conversation_with_an_unanswered_message_too_big_for_the_window_recovers(
    make_engine: EngineFactory,
) -> None:
    """A user message larger than the window fails its own turn (this turn's input is never
    compacted away) but is stored; the next turn summarizes it (a shortened copy: it does not fit
    the summary request either) and completes, so the conversation is not stuck."""
    h = await engine(make_engine, CompactionConfig(strategy=SUMMARIZE, reactive=True), context_window=500)
    failed = await h.run(BIG * 2)
    assert end_of(failed).status == event_pb2.TURN_STATUS_ERROR
    assert [c.shortened for c in compactions(failed)] == [False]
    events = await h.run("a short question")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED, end_of(events)
    assert [(c.reason, c.shortened) for c in compactions(events)] == [
        (event_pb2.COMPACTION_REASON_REACTIVE, True)
    ]
    stored = await h.store.load_messages(CONV)
    assert text_of(stored[0]) == BIG * 2  # non-destructive: the big message is stored whole


async def test_the_demo_model_answers_a_summary_request_with_a_summary(make_engine: EngineFactory) -> None:
    """``scripted:demo`` (the offline default) as its own summary model: the summary it writes
    names what was said, not a canned demo reply."""
    h = await engine(
        make_engine, CompactionConfig(strategy=SummarizeOlder(), reactive=True), context_window=2500
    )
    await seed(h, 3, "The secret word is avocado. " + BIG)
    events = await h.run("What's the weather in Paris?", model="scripted:demo")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    summary = next(r for r in h.provider.requests if r.attempt == 2).messages[0]
    assert "The secret word is avocado." in text_of(summary) and "I can call the demo tools" not in text_of(
        summary
    )


async def test_a_summary_call_costs_for_its_turn(make_engine: EngineFactory) -> None:
    # docs/cost.md: TurnEnd.cost sums the steps and the compaction summaries, each at its model's price.
    rates = {"scripted:main": (1.0, 2.0), "scripted:summarizer": (0.5, 4.0)}
    pricing = {"models": {model: {"input_mtok": i, "output_mtok": o} for model, (i, o) in rates.items()}}
    h = await engine(
        make_engine,
        CompactionConfig(strategy=SUMMARIZE, compact_after=3000),
        scripts={
            "main": [ScriptStep(text="ok", usage=ScriptedUsage(input_tokens=800, output_tokens=10))],
            "summarizer": [
                ScriptStep(text="Summary.", usage=ScriptedUsage(input_tokens=4000, output_tokens=50))
            ],
        },
        prices=PriceBook(PricingSettings.model_validate(pricing)),
    )
    await seed(h, 2)
    events = await h.run("go")
    assert compactions(events)
    (step,) = of_kind(events, "step_finish")
    assert step.cost.usd == pytest.approx((800 * 1.0 + 10 * 2.0) / 1e6)
    end = end_of(events)
    assert end.cost.usd == pytest.approx((800 * 1.0 + 10 * 2.0 + 4000 * 0.5 + 50 * 4.0) / 1e6)
    assert end.cost.price_source == "config"
