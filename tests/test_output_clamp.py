"""An overflow only a smaller output reservation can fix (docs/semantics.md §9): the step is sent once
more with ``max_output_tokens`` lowered to what fits (window - prompt, the numbers of the error),
through the real engine on SQLite with the scripted model.

The scripted model's ``context_window`` refuses a request whose input plus ``max_output_tokens`` is
larger, with Anthropic's "input length and `max_tokens` exceed context limit: P + C > W".
"""

from __future__ import annotations

from typing import Any

from support.engine_harness import CONV, EngineFactory, end_of, kinds, make_tool, text_of

from turnwire.compaction import CompactionConfig, DropOldestToolOutputs, EstimateTokens
from turnwire.hooks import (
    ChatErrorClassification,
    ChatErrorContext,
    Middleware,
    StepFinishContext,
    TurnConfig,
    TurnContext,
)
from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import ToolExecution
from turnwire.types import ModelSettings
from turnwire_client.v1 import event_pb2

WINDOW = 2000
RESERVED = 1500


class Reserve(Middleware):
    """Asks for ``RESERVED`` output tokens and records every step's warnings."""

    def __init__(self) -> None:
        super().__init__()
        self.warnings: list[tuple[int, tuple[str, ...]]] = []

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        return TurnConfig(model_settings=ModelSettings(max_output_tokens=RESERVED))

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self.warnings.append((ctx.step_number, tuple(ctx.warnings)))


class CallsItFatal(Middleware):
    """A user's classifier that decides otherwise: no overflow recovery of any kind."""

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        return "fatal"


def _prompt_tokens(request: Any) -> int:
    """What the scripted model counts of a request's input (as it does before refusing it): its
    messages, system prompt and tool definitions."""
    return EstimateTokens().messages(request.messages) + EstimateTokens().framing(request)


async def _run(
    make_engine: EngineFactory, *middlewares: Middleware, **engine: Any
) -> tuple[Any, Any, list[Any]]:
    ran: list[int] = []

    async def fetch(input: dict[str, Any], execution: ToolExecution) -> str:
        ran.append(execution.step_number)
        return "z" * 2400  # ~600 tokens: step 1's prompt no longer leaves room for RESERVED

    steps = [ScriptStep(tool_calls=[ScriptedToolCall(name="fetch", input={})]), ScriptStep(text="Done.")]
    h = await make_engine(
        scripts={"main": steps},
        tools=[make_tool("fetch", fetch)],
        context_window=WINDOW,
        middlewares=list(middlewares),
        **engine,
    )
    events = await h.run("fetch it")
    return h, events, ran


async def test_the_step_is_sent_again_with_the_output_that_fits(make_engine: EngineFactory) -> None:
    reserve = Reserve()
    h, events, ran = await _run(make_engine, reserve)

    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED, end.error
    # Step 0 fit; step 1 was refused, then sent again at once with window - prompt: the tool did not
    # run again and the turn was not restarted (no AttemptStart, one step_start per step).
    first, second, again = h.provider.requests
    assert [r.step_number for r in (first, second, again)] == [0, 1, 1]
    assert first.settings.max_output_tokens == second.settings.max_output_tokens == RESERVED
    assert _prompt_tokens(second) + RESERVED > WINDOW
    fits = WINDOW - _prompt_tokens(second)
    assert again.settings.max_output_tokens == fits < RESERVED
    assert again.messages == second.messages
    assert ran == [0]
    assert "attempt_start" not in kinds(events) and kinds(events).count("step_start") == 2
    # The step's warnings say what changed; the stored reply is the whole answer.
    assert reserve.warnings[0] == (0, ())
    (step, (warning,)) = reserve.warnings[1]
    assert step == 1 and f"lowered from {RESERVED:,} to {fits:,}" in warning
    stored = (await h.store.load_messages(CONV))[-1]
    assert stored.id == end.message.id and text_of(stored) == "Done."


async def test_with_reactive_compaction_on_the_clamp_comes_first_and_nothing_is_compacted(
    make_engine: EngineFactory,
) -> None:
    h, events, ran = await _run(
        make_engine, Reserve(), compaction=CompactionConfig(strategy=DropOldestToolOutputs(), reactive=True)
    )
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    assert "context_compacted" not in kinds(events) and len(h.provider.requests) == 3 and ran == [0]


async def test_a_classifier_that_says_otherwise_keeps_the_step_failed(make_engine: EngineFactory) -> None:
    h, events, ran = await _run(make_engine, Reserve(), CallsItFatal())
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_ERROR
    assert "max_tokens" in end.error.message
    assert len(h.provider.requests) == 2 and ran == [0]


async def test_an_output_that_still_does_not_fit_is_sent_once_more_only(make_engine: EngineFactory) -> None:
    """OpenAI's "… 64 in the messages, 8192 in the completion" of an 8192 window, from a model that
    keeps refusing: one more call with 8128 (the provider's numbers), then the turn fails as before,
    with nothing compacted."""
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
    h = await make_engine(
        scripts={"main": [ScriptStep(error=error)]},
        compaction=CompactionConfig(strategy=DropOldestToolOutputs(), reactive=True),
    )
    events = await h.run("and now?")
    assert end_of(events).status == event_pb2.TURN_STATUS_ERROR
    assert [r.settings.max_output_tokens for r in h.provider.requests] == [None, 8192 - 64]
    assert "context_compacted" not in kinds(events)
