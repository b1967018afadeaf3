"""A turn's timeline (issue 39, docs/inspector.md): when each phase of the turn started and how
long it took, for the inspector's Gantt chart.

Recorded in memory while the turn runs, on the monotonic clock (``time.perf_counter``) from the
turn's admission, and stored serialized (``turnwire.v1.TurnTimeline``) in the write that ends the
turn (``Store.finish_turn`` / ``roll_back_turn``): no write of its own. The phases: the queue wait
with the input's commit, each attempt, each step, each model stream (with the turn's first
token), each tool call, each hook call (``on_chunk`` is not timed: it runs per chunk), each
compaction. A span is a small record of integer microseconds until the end, so recording costs a
clock read and an append (context managers are plain classes, not generators: bench/timeline_cost.py);
at most :data:`MAX_SPANS` are kept (a turn of many steps and tools stays bounded), the rest
counted in ``dropped_spans``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.hooks.chain import HookSpans

__all__ = ["MAX_SPANS", "SpanKind", "TurnTimeline"]

SpanKind = int
"""A ``turnwire.v1.TimelineSpanKind`` value."""

QUEUE: Final = chat_service_pb2.TIMELINE_SPAN_KIND_QUEUE
ATTEMPT: Final = chat_service_pb2.TIMELINE_SPAN_KIND_ATTEMPT
STEP: Final = chat_service_pb2.TIMELINE_SPAN_KIND_STEP
MODEL: Final = chat_service_pb2.TIMELINE_SPAN_KIND_MODEL
TOOL: Final = chat_service_pb2.TIMELINE_SPAN_KIND_TOOL
HOOK: Final = chat_service_pb2.TIMELINE_SPAN_KIND_HOOK
COMPACTION: Final = chat_service_pb2.TIMELINE_SPAN_KIND_COMPACTION

MAX_SPANS: Final = 4096
"""The most spans a turn's timeline keeps (``TurnTimeline.dropped_spans`` counts the rest)."""

_NOT_KEPT: Final = -1


@dataclass(slots=True)
class _Span:
    """A span while it is recorded: times in microseconds from the origin (``end`` None: open)."""

    kind: SpanKind
    name: str
    start: int
    step: int | None
    attempt: int
    tool_call_id: str
    detail: str
    end: int | None = None
    first_token: int | None = None
    outcome: str = ""


class TurnTimeline:
    """One turn's phases. ``origin`` is the ``time.perf_counter()`` of the turn's admission;
    ``step`` the step running now (spans begun without a step number get it; None between
    steps); ``attempt`` the attempt running now (from 1)."""

    __slots__ = ("_model", "_origin_ns", "_origin_wall_us", "_spans", "attempt", "dropped", "step")

    def __init__(self, origin: float) -> None:
        self._origin_ns = int(origin * 1e9)
        self._origin_wall_us = time.time_ns() // 1000 - int((time.perf_counter() - origin) * 1e6)
        self._spans: list[_Span] = []
        self._model = _NOT_KEPT
        self.dropped = 0
        self.step: int | None = None
        self.attempt = 1

    def _now(self) -> int:
        return max(0, (time.perf_counter_ns() - self._origin_ns) // 1000)

    def begin(
        self, kind: SpanKind, name: str, *, tool_call_id: str = "", detail: str = "", at: float | None = None
    ) -> int:
        """Start a span now (or at ``at``, a ``perf_counter`` value); returns its handle for
        :meth:`end` (-1 when not kept: past :data:`MAX_SPANS`)."""
        spans = self._spans
        if len(spans) >= MAX_SPANS:
            self.dropped += 1
            return _NOT_KEPT
        start = self._now() if at is None else max(0, (int(at * 1e9) - self._origin_ns) // 1000)
        spans.append(_Span(kind, name, start, self.step, self.attempt, tool_call_id, detail))
        if kind == MODEL:
            self._model = len(spans) - 1
        return len(spans) - 1

    def end(self, handle: int, outcome: str = "") -> None:
        """End the span ``handle`` (from :meth:`begin`) now, ``outcome`` saying how (a tool's
        ``executed`` / ``blocked``, ``failed``, ``cancelled``; "" for nothing to say)."""
        if handle == _NOT_KEPT:
            return
        span = self._spans[handle]
        span.end = self._now()
        span.outcome = outcome

    def first_token(self) -> None:
        """Mark the turn's first token (text or reasoning) on the model stream running now."""
        if self._model != _NOT_KEPT:
            self._spans[self._model].first_token = self._now()

    def span(self, kind: SpanKind, name: str, *, tool_call_id: str = "", detail: str = "") -> _Timed:
        """A span begun now and ended with the ``with`` block it is used in: ``failed`` when the
        block raises, ``cancelled`` when it is cancelled, and then so do the spans begun inside
        it that are still open (a step the error cut short). ``as`` gives its handle (a later
        :meth:`end` inside the block sets its outcome)."""
        return _Timed(self, self.begin(kind, name, tool_call_id=tool_call_id, detail=detail))

    def _close(self, handle: int, error: BaseException | None) -> None:
        if handle == _NOT_KEPT:
            return
        if error is None:
            if self._spans[handle].end is None:
                self.end(handle)
            return
        now, outcome = self._now(), _outcome_of(error)
        for inner in self._spans[handle:]:
            if inner.end is None:
                inner.end, inner.outcome = now, outcome

    def hook_spans(self, tracing: HookSpans | None) -> HookSpans:
        """The hooks' span recorder (``MiddlewareChain.for_turn``'s ``spans``): each hook call a
        HOOK span named for the hook, its middleware in ``detail``, inside ``tracing``'s span
        when given."""
        if tracing is None:
            return lambda middleware, hook: self.span(HOOK, hook, detail=middleware)

        @contextlib.contextmanager
        def both(middleware: str, hook: str) -> Iterator[object]:
            with self.span(HOOK, hook, detail=middleware), tracing(middleware, hook) as traced:
                yield traced

        return both

    def serialize(self) -> bytes:
        """The timeline as a serialized ``turnwire.v1.TurnTimeline``; a span still open ends now,
        ``cancelled`` (the turn stopped during it)."""
        now = self._now()
        timeline = chat_service_pb2.TurnTimeline(dropped_spans=self.dropped)
        timeline.origin.FromMicroseconds(self._origin_wall_us)
        add = timeline.spans.add
        for recorded in self._spans:
            end, outcome = (now, "cancelled") if recorded.end is None else (recorded.end, recorded.outcome)
            span = add(
                kind=recorded.kind,
                name=recorded.name,
                start_offset_micros=recorded.start,
                duration_micros=end - recorded.start,
                attempt=recorded.attempt,
                tool_call_id=recorded.tool_call_id,
                outcome=outcome,
                detail=recorded.detail,
            )
            if recorded.step is not None:
                span.step_number = recorded.step
            if recorded.first_token is not None:
                span.first_token_offset_micros = recorded.first_token
        return timeline.SerializeToString()


class _Timed:
    """The context manager of :meth:`TurnTimeline.span`."""

    __slots__ = ("_handle", "_timeline")

    def __init__(self, timeline: TurnTimeline, handle: int) -> None:
        self._timeline = timeline
        self._handle = handle

    def __enter__(self) -> int:
        return self._handle

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        self._timeline._close(self._handle, error)


def _outcome_of(error: BaseException) -> str:
    return "cancelled" if isinstance(error, asyncio.CancelledError) else "failed"
