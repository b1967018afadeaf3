"""The status line of ``turnwire chat`` names the model(s) the turn's steps ran on.

A fresh-user trial: while the primary's breaker was open the line named the configured model
though the usage and cost were the fallback's; after a step fell back, it kept naming the
fallback though later steps ran on the primary again.
"""

from __future__ import annotations

import io

from rich.console import Console

from turnwire_client import TurnResult
from turnwire_client.v1 import event_pb2
from turnwire_client.values import Usage
from turnwire_server.cli.live import TurnRenderer, print_status_line

PRIMARY = "anthropic:claude-sonnet-4-5"
FALLBACK = "openai:gpt-4o"


def _step(number: int, model: str) -> list[event_pb2.TurnEvent]:
    return [
        event_pb2.TurnEvent(step_start=event_pb2.StepStart(step_number=number, model=model)),
        event_pb2.TurnEvent(
            step_finish=event_pb2.StepFinish(
                step_number=number, model=model, finish_reason=event_pb2.FINISH_REASON_STOP
            )
        ),
    ]


def _status_line(events: list[event_pb2.TurnEvent]) -> str:
    """The status line after rendering ``events`` (a TurnStart for the primary first) live."""
    events = [event_pb2.TurnEvent(turn_start=event_pb2.TurnStart(model=PRIMARY)), *events]
    renderer = TurnRenderer(Console(file=io.StringIO(), width=200), "cli-m")
    try:
        for event in events:
            renderer.render(event)
    finally:
        renderer.stop_waiting()
    steps = len({e.step_finish.step_number for e in events if e.WhichOneof("event") == "step_finish"})
    result = TurnResult(
        "c", "r", event_pb2.TURN_STATUS_COMPLETED, None, Usage(10, 2, 12), None, events, step_count=steps
    )
    buffer = io.StringIO()
    print_status_line(Console(file=buffer, width=200), result, renderer.model)
    return buffer.getvalue().strip()


def test_a_step_sent_to_the_fallback_by_an_open_breaker_shows_the_fallback() -> None:
    assert _status_line(_step(0, FALLBACK)) == f"COMPLETED · 1 step · tokens in 10 / out 2 · {FALLBACK}"


def test_steps_on_several_models_show_each_with_its_steps() -> None:
    fell_back = [
        event_pb2.TurnEvent(step_start=event_pb2.StepStart(step_number=0, model=PRIMARY)),
        event_pb2.TurnEvent(
            attempt_start=event_pb2.AttemptStart(attempt=2, reason="PROVIDER_FALLBACK", model=FALLBACK)
        ),
        *_step(0, FALLBACK),
    ]
    line = _status_line([*fell_back, *_step(1, PRIMARY), *_step(2, PRIMARY)])
    assert line == (
        f"COMPLETED · 3 steps · tokens in 10 / out 2 · {FALLBACK} (step 1), {PRIMARY} (steps 2-3)"
    )


def test_a_sidecar_that_names_no_step_model_shows_the_turn_s_model() -> None:
    """An older sidecar's events carry no step model: the line names the model as before."""
    assert _status_line(_step(0, "")) == f"COMPLETED · 1 step · tokens in 10 / out 2 · {PRIMARY}"
