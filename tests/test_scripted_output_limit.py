"""The scripted model under an output limit (``turnwire.testing``, ``turnwire.scripted_limit``;
docs/providers.md, "`scripted`"). Fresh-user trial: it ignored ``max_output_tokens``, so a step a
budget had clamped to ~10 tokens still streamed and reported its whole script (``out 30``) and the
clamp could not be seen offline. With a limit, a step now stops at that many tokens (words, 8 a
tool call) as a real model does: finish ``length``, nothing streamed after the cut, usage no higher
than the limit; without one it plays as scripted. Through a budget's clamp (docs/cost.md,
"Budgets") the step's reported output is within the clamp."""

from __future__ import annotations

import asyncio

import pytest
from support.engine_harness import CONV, EngineFactory, end_of, of_kind, text_of

from turnwire.providers import ModelRequest
from turnwire.scripted_parts import ScriptedSource
from turnwire.testing import ScriptedProvider, ScriptedToolCall, ScriptedUsage, ScriptStep
from turnwire.types import (
    FinishReason,
    FinishStep,
    ModelChunk,
    ModelSettings,
    ReasoningDelta,
    Source,
    TextDelta,
    TextStart,
    ToolCall,
    ToolInputStart,
)
from turnwire_client.v1 import event_pb2
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.store.records import BudgetKey

WORDS = [f"w{i}" for i in range(30)]
LONG = " ".join(WORDS)
ECHO = ScriptedToolCall(name="echo", input={"n": 1})


async def play(step: ScriptStep, max_output_tokens: int | None) -> list[ModelChunk]:
    """Every chunk the scripted model streams for ``step`` under ``max_output_tokens``."""
    provider = ScriptedProvider({"main": [step]})
    request = ModelRequest(
        model="main", system="", messages=[], settings=ModelSettings(max_output_tokens=max_output_tokens)
    )
    return [chunk async for chunk in provider.stream(request)]


def text(chunks: list[ModelChunk]) -> str:
    return "".join(c.delta for c in chunks if isinstance(c, TextDelta))


def reasoning(chunks: list[ModelChunk]) -> str:
    return "".join(c.delta for c in chunks if isinstance(c, ReasoningDelta))


def finish(chunks: list[ModelChunk]) -> FinishStep:
    last = chunks[-1]
    assert isinstance(last, FinishStep), chunks
    return last


def calls(chunks: list[ModelChunk]) -> list[ToolCall]:
    return [c for c in chunks if isinstance(c, ToolCall)]


async def test_a_step_over_its_limit_stops_there_and_finishes_length() -> None:
    chunks = await play(ScriptStep(text=LONG, tool_calls=[ECHO], sources=[ScriptedSource(url="u")]), 10)
    assert text(chunks).split() == WORDS[:10]
    # Nothing after the cut: the sources after the text, the tool call after them.
    assert not calls(chunks) and not [c for c in chunks if isinstance(c, (ToolInputStart, Source))]
    end = finish(chunks)
    assert (end.finish_reason, end.raw_finish_reason) == (FinishReason.LENGTH, "length")
    assert end.usage.output_tokens == 10
    assert end.usage.total_tokens == end.usage.input_tokens + 10


async def test_reasoning_counts_first_and_a_block_cut_before_its_first_word_is_not_opened() -> None:
    step = ScriptStep(reasoning="let me think this through", text=LONG)
    chunks = await play(step, 7)
    assert reasoning(chunks) == "let me think this through" and text(chunks).split() == WORDS[:2]
    assert finish(chunks).finish_reason == FinishReason.LENGTH and finish(chunks).usage.output_tokens == 7

    chunks = await play(step, 3)
    assert reasoning(chunks).split() == ["let", "me", "think"]
    assert not [c for c in chunks if isinstance(c, TextStart)]
    assert finish(chunks).finish_reason == FinishReason.LENGTH and finish(chunks).usage.output_tokens == 3


async def test_a_word_split_across_chunks_counts_once_and_is_kept_whole() -> None:
    chunks = await play(ScriptStep(text=LONG, chunk_size=4), 5)
    assert next(c.delta for c in chunks if isinstance(c, TextDelta)) == "w0 w"  # a word split across deltas
    assert text(chunks) == "w0 w1 w2 w3 w4" and finish(chunks).usage.output_tokens == 5


async def test_a_tool_call_that_does_not_fit_whole_is_dropped_with_the_later_ones() -> None:
    step = ScriptStep(text="a b", tool_calls=[ECHO, ECHO.model_copy(update={"name": "two"}), ECHO])
    # "a b" is 2 tokens, each call 8: the first two calls fit 19, the third does not.
    chunks = await play(step, 19)
    assert text(chunks) == "a b" and [c.tool_name for c in calls(chunks)] == ["echo", "two"]
    assert all(c.error is None for c in calls(chunks))
    end = finish(chunks)
    assert (end.finish_reason, end.usage.output_tokens) == (FinishReason.LENGTH, 18)


async def test_a_step_that_fits_its_limit_plays_exactly_as_without_one() -> None:
    # 3 + 2 words and two calls of 8: 21 tokens, the limit exactly.
    step = ScriptStep(
        reasoning="hmm ok", text="one two three ", tool_calls=[ECHO, ECHO], sources=[ScriptedSource(url="u")]
    )
    unlimited = await play(step, None)
    assert await play(step, 21) == unlimited
    end = finish(unlimited)
    assert (end.finish_reason, end.raw_finish_reason) == (FinishReason.TOOL_CALLS, "tool-calls")
    assert end.usage.output_tokens == 21 and len(calls(unlimited)) == 2
    assert [c for c in unlimited if isinstance(c, Source)]
    cut = await play(step, 20)
    assert len(calls(cut)) == 1 and finish(cut).finish_reason == FinishReason.LENGTH


async def test_without_a_limit_a_long_step_is_not_cut() -> None:
    chunks = await play(ScriptStep(text=LONG, tool_calls=[ECHO]), None)
    assert text(chunks) == LONG and len(calls(chunks)) == 1
    assert finish(chunks).finish_reason == FinishReason.TOOL_CALLS
    assert finish(chunks).usage.output_tokens == len(WORDS) + 8


async def test_a_scripted_finish_reason_holds_unless_the_step_is_cut() -> None:
    step = ScriptStep(text=LONG, finish_reason="stop", raw_finish_reason="end_turn")
    whole = finish(await play(step, 100))
    assert (whole.finish_reason, whole.raw_finish_reason) == (FinishReason.STOP, "end_turn")
    cut = finish(await play(step, 5))
    assert (cut.finish_reason, cut.raw_finish_reason) == (FinishReason.LENGTH, "length")


@pytest.mark.parametrize(("limit", "reported"), [(None, 500), (1_000, 500), (100, 100)])
async def test_a_scripted_usage_is_capped_at_the_limit(limit: int | None, reported: int) -> None:
    step = ScriptStep(
        text="Hi.", usage=ScriptedUsage(input_tokens=10, output_tokens=500, reasoning_tokens=400)
    )
    end = finish(await play(step, limit))
    # The text fits: nothing was cut, only the count a real model could not have reported.
    assert end.finish_reason == FinishReason.STOP
    assert (end.usage.output_tokens, end.usage.total_tokens) == (reported, 10 + reported)
    assert end.usage.reasoning_tokens == min(400, reported)


async def test_until_cancelled_under_a_limit_finishes_at_it() -> None:
    # Bounded: a step that ignored its limit would stream forever.
    chunks = await asyncio.wait_for(play(ScriptStep(text="la", delay_ms=1, until_cancelled=True), 5), 10)
    # Each repetition's word counts on its own, though the deltas join into one long word.
    assert [c.delta for c in chunks if isinstance(c, TextDelta)] == ["la"] * 5
    end = finish(chunks)
    assert (end.finish_reason, end.usage.output_tokens) == (FinishReason.LENGTH, 5)


async def test_a_budget_clamped_step_reports_output_within_the_clamp(make_engine: EngineFactory) -> None:
    words = [f"w{i}" for i in range(500)]
    h = await make_engine(
        scripts={"main": [ScriptStep(text=" ".join(words))]},
        budgets=BudgetSettings.model_validate({"conversation": {"tokens": 300}}),
    )
    events = await h.run("hi")
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    (request,) = h.provider.requests
    clamp = request.settings.max_output_tokens
    assert clamp is not None and 250 < clamp < 300  # 300 less the prompt's estimate
    (step,) = of_kind(events, "step_finish")
    assert step.finish_reason == event_pb2.FINISH_REASON_LENGTH and step.raw_finish_reason == "length"
    assert step.usage.output_tokens == clamp
    assert text_of((await h.store.load_messages(CONV))[-1]).split() == words[:clamp]
    # Settled at what it reported, within the budget (the scripted model's prompt count is the
    # budget's estimate here: no system prompt, no tools).
    key = BudgetKey("conversation", CONV)
    spent = (await h.store.budget_spends([key]))[key]
    assert spent.spent_tokens == step.usage.input_tokens + clamp <= 300 and spent.reserved_tokens == 0
