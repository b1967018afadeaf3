"""The in-memory recording of a turn's timeline (``engine/turn_timeline.py``): bounded, open spans
closed as cancelled, an error ending the spans begun inside the one it left."""

from __future__ import annotations

import asyncio
import time

import pytest

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.engine.turn_timeline import ATTEMPT, MAX_SPANS, MODEL, STEP, TOOL, TurnTimeline


def _decoded(timeline: TurnTimeline) -> chat_service_pb2.TurnTimeline:
    return chat_service_pb2.TurnTimeline.FromString(timeline.serialize())


def test_spans_keep_their_order_step_attempt_and_first_token() -> None:
    timeline = TurnTimeline(time.perf_counter())
    timeline.step = 0
    with timeline.span(MODEL, "scripted:demo"):
        timeline.first_token()
    timeline.step = None
    timeline.attempt = 2
    timeline.end(timeline.begin(TOOL, "calculator", tool_call_id="c1"), "blocked")
    model, tool = _decoded(timeline).spans
    assert (model.kind, model.step_number, model.attempt) == (chat_service_pb2.TIMELINE_SPAN_KIND_MODEL, 0, 1)
    assert (
        model.start_offset_micros
        <= model.first_token_offset_micros
        <= model.start_offset_micros + model.duration_micros
    )
    assert not tool.HasField("step_number") and tool.attempt == 2
    assert (tool.name, tool.tool_call_id, tool.outcome) == ("calculator", "c1", "blocked")
    assert tool.start_offset_micros >= model.start_offset_micros + model.duration_micros


def test_an_error_ends_the_spans_begun_inside_and_open_ones_end_cancelled() -> None:
    timeline = TurnTimeline(time.perf_counter())
    with pytest.raises(asyncio.CancelledError), timeline.span(ATTEMPT, "attempt 1"):
        timeline.begin(STEP, "step 0")
        raise asyncio.CancelledError
    with pytest.raises(ValueError), timeline.span(ATTEMPT, "attempt 2"):
        raise ValueError
    timeline.begin(STEP, "left open")
    attempt1, step, attempt2, left_open = _decoded(timeline).spans
    assert (attempt1.outcome, step.outcome, attempt2.outcome, left_open.outcome) == (
        "cancelled",
        "cancelled",
        "failed",
        "cancelled",
    )
    assert (
        step.start_offset_micros + step.duration_micros
        == attempt1.start_offset_micros + attempt1.duration_micros
    )


def test_a_long_turn_keeps_a_bounded_timeline() -> None:
    timeline = TurnTimeline(time.perf_counter())
    handles = [timeline.begin(TOOL, f"t{n}") for n in range(MAX_SPANS + 10)]
    for handle in handles:
        timeline.end(handle)
    decoded = _decoded(timeline)
    assert (len(decoded.spans), decoded.dropped_spans) == (MAX_SPANS, 10)
