"""Every step names the model that ran it (docs/providers.md, "Fallback across providers";
docs/semantics.md, "Steps"): ``StepStart.model`` and ``StepFinish.model``, the stored reply's
``step_start`` parts, ``on_step_finish``'s context and the turn record's ``step_models``
(``ListTurns``), a fallback's model included.

A fresh-user trial: while the primary's circuit breaker was open a step went straight to the
fallback with no ``AttemptStart``, and nothing on the stream said which model ran it; the usage
and cost were the fallback's while ``TurnStart.model`` named the primary.

The fallback is a second provider entry (``other``): a breaker is per entry, so a fallback on the
same entry as its primary would be skipped with it.
"""

from __future__ import annotations

from typing import Any

from support.engine_harness import CONV, EngineFactory, echo, make_tool, of_kind
from support.traces import memory_tracing

from turnwire.hooks import Middleware, StepFinishContext
from turnwire.testing import ScriptedError, ScriptedProvider, ScriptedToolCall, ScriptStep
from turnwire_client.v1 import event_pb2
from turnwire_server.api.turn_rpcs import turn_proto
from turnwire_server.engine.fallback import Fallbacks, FallbackSettings

PRIMARY = "scripted:main"
FALLBACK = "other:backup"
OVERLOADED = ScriptedError(message="Overloaded", status=529, type="overloaded_error", retryable=True)


class _StepModels(Middleware):
    """Records the model ``on_step_finish`` is told for each step."""

    def __init__(self) -> None:
        self.models: list[tuple[int, str]] = []

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self.models.append((ctx.step_number, ctx.model))


def _fallbacks(**settings: Any) -> Fallbacks:
    return Fallbacks(FallbackSettings(models={PRIMARY: [FALLBACK]}, **settings))


def _models(events: list[event_pb2.TurnEvent], kind: str) -> list[tuple[int, str]]:
    return [(event.step_number, event.model) for event in of_kind(events, kind)]


async def test_a_step_on_the_fallback_because_the_breaker_is_open_names_the_fallback(
    make_engine: EngineFactory,
) -> None:
    backup = ScriptedProvider({"backup": [ScriptStep(text="from the backup")]})
    recorder = _StepModels()
    tracing, exporter = memory_tracing()
    h = await make_engine(
        scripts={"main": [ScriptStep(error=OVERLOADED)]},
        providers={"other": backup},
        middlewares=[recorder],
        tracing=tracing,
        fallbacks=_fallbacks(breaker_failures=1),
    )
    first = await h.run("one")  # falls back after the failure, which opens the primary's breaker
    exporter.clear()
    assert [a.model for a in of_kind(first, "attempt_start")] == [FALLBACK]
    assert _models(first, "step_start") == [(0, PRIMARY), (0, FALLBACK)]
    second = await h.run("two")
    assert of_kind(second, "attempt_start") == [], "nothing was attempted on the open primary"
    assert of_kind(second, "turn_start")[0].model == PRIMARY, "the turn was asked for the primary"
    assert _models(second, "step_start") == [(0, FALLBACK)]
    assert _models(second, "step_finish") == [(0, FALLBACK)]
    assert recorder.models == [(0, FALLBACK), (0, FALLBACK)]
    # The step's span (``chat {model}``) is the model call that ran: the fallback's.
    (chat,) = [span for span in exporter.get_finished_spans() if span.name.startswith("chat ")]
    assert (chat.name, (chat.attributes or {})["gen_ai.request.model"]) == ("chat backup", "backup")
    stored = (await h.store.load_messages(CONV))[-1]
    assert [p.step_start.model for p in stored.parts if p.WhichOneof("kind") == "step_start"] == [FALLBACK]


async def test_a_step_that_fell_back_and_a_later_one_on_the_primary_each_name_their_model(
    make_engine: EngineFactory,
) -> None:
    backup = ScriptedProvider(
        {"backup": [ScriptStep(tool_calls=[ScriptedToolCall(name="echo", input={"x": 1})])]}
    )
    recorder = _StepModels()
    h = await make_engine(
        scripts={"main": [ScriptStep(error=OVERLOADED), ScriptStep(text="back on the primary")]},
        providers={"other": backup},
        tools=[make_tool("echo", echo)],
        middlewares=[recorder],
        fallbacks=_fallbacks(),
    )
    events = await h.run("go")
    assert of_kind(events, "turn_end")[0].status == event_pb2.TURN_STATUS_COMPLETED
    assert _models(events, "step_start") == [(0, PRIMARY), (0, FALLBACK), (1, PRIMARY)]
    assert _models(events, "step_finish") == [(0, FALLBACK), (1, PRIMARY)]
    assert recorder.models == [(0, FALLBACK), (1, PRIMARY)]
    stored = (await h.store.load_messages(CONV))[-1]
    assert [p.step_start.model for p in stored.parts if p.WhichOneof("kind") == "step_start"] == [
        FALLBACK,
        PRIMARY,
    ]
    (record,), _ = await h.store.list_turns(CONV, 10, "")
    turn = turn_proto(record)
    assert (turn.model, list(turn.step_models)) == (PRIMARY, [FALLBACK, PRIMARY])
