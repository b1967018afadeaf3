"""The spans of a turn: the turn, each model call, each tool call and each hook call.

The one module that creates spans. It uses only the OpenTelemetry API, and a :class:`SpanStarter`
the server gives it (:class:`turnwire_server.trace_export.SdkSpans`, on the SDK and exporter it
sets up; :data:`TRACING_OFF`: nothing is recorded). A turn's spans are planned (ids, sampling,
start time) and started on the SDK only once its first token has been sent, off the path to it;
see :class:`Tracing`.

Names and attributes follow the OpenTelemetry GenAI semantic conventions (status Development;
https://github.com/open-telemetry/semantic-conventions-genai, ``docs/gen-ai/gen-ai-agent-spans.md``
and ``docs/gen-ai/gen-ai-spans.md``, which replaced the ``gen_ai`` pages of semantic-conventions v1.41):

======================================  ========  =============================================
span                                    kind      parent
======================================  ========  =============================================
``invoke_agent turnwire`` (a turn)      INTERNAL  the caller's ``traceparent`` (gRPC metadata);
                                                  a recovery starts a new trace linked to it
``chat {gen_ai.request.model}`` (step)  CLIENT    the turn
``execute_tool {gen_ai.tool.name}``     INTERNAL  the turn (its tool hooks are its children)
``{hook} {middleware}`` (a hook call)   INTERNAL  what runs it; ``on_chunk`` (per chunk) is not
                                                  traced call by call
======================================  ========  =============================================

Attributes: ``gen_ai.operation.name`` (``invoke_agent`` / ``chat`` / ``execute_tool``),
``gen_ai.provider.name``, ``gen_ai.request.model`` and the request's sampling settings,
``gen_ai.response.model``, ``gen_ai.response.id``, ``gen_ai.response.finish_reasons``,
``gen_ai.usage.input_tokens`` / ``output_tokens`` (and cache and reasoning counts),
``gen_ai.conversation.id``, ``gen_ai.tool.name`` / ``call.id`` / ``type`` / ``description``,
``error.type`` when an operation fails (for a provider error its class from
:func:`turnwire.error_classes.classify_error`, such as ``rate_limit``; else the exception's type
name); Turnwire's own under ``turnwire.*`` (``turnwire.continuation`` only on a continuation;
``turnwire.cost.usd`` and ``turnwire.cost.price_source`` on the turn and chat spans when the cost
is known, docs/cost.md: the conventions have no cost attribute).
Message content (``gen_ai.system_instructions``, ``gen_ai.input.messages``,
``gen_ai.output.messages``, ``gen_ai.tool.call.arguments`` / ``result``) is recorded only when
``capture_content`` is on: the conventions' opt-in attributes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    INVALID_SPAN,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
)
from opentelemetry.util.types import Attributes, AttributeValue

from turnwire.error_classes import classify_error
from turnwire.providers import ModelRequest, ProviderError
from turnwire.types import Cost, FinishStep, Usage
from turnwire.values import NotJsonError, dumps
from turnwire_server.engine import trace_content
from turnwire_server.engine.errors import TurnFailure
from turnwire_server.hooks.chain import HookError

if TYPE_CHECKING:
    from turnwire.providers import Provider
    from turnwire.tools import Tool
    from turnwire_server.engine.assistant_message import AssistantMessage
    from turnwire_server.engine.request import TurnRequest

AGENT_NAME = "turnwire"
"""``gen_ai.agent.name`` of every turn span."""

_TURN_SPAN = f"invoke_agent {AGENT_NAME}"

# Provider adapter types and the gen_ai.provider.name each reports (well-known values).
_PROVIDER_NAMES = {
    "anthropic": "anthropic",
    "openai": "openai",
    "openai-responses": "openai",
    "bedrock": "aws.bedrock",
    "vertex": "gcp.vertex_ai",
    "gemini": "gcp.gemini",
}

_SETTINGS = (
    ("max_output_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("seed", "gen_ai.request.seed"),
)


class PlannedSpan(Protocol):
    """A span a :class:`SpanStarter` planned and has not started: ``context`` holds the ids and
    trace flags it will have, ``recording`` the sampler's decision (False: it never starts)."""

    @property
    def context(self) -> SpanContext: ...

    @property
    def recording(self) -> bool: ...


class SpanStarter(Protocol):
    """Starts spans in two parts (the OpenTelemetry SDK's, behind
    :class:`turnwire_server.trace_export.SdkSpans`): :meth:`plan` fixes a span's ids and sampling
    decision (a few µs), :meth:`start` starts it later with exactly those (the SDK's work)."""

    def plan(
        self, name: str, parent: Context, kind: SpanKind, attributes: Attributes, links: Sequence[Link]
    ) -> PlannedSpan:
        """The :class:`PlannedSpan` of span ``name``, a child of ``parent``'s current span (a root
        when it has none)."""
        ...

    def start(
        self, planned: Any, start_time: int | None = None, attributes: Mapping[str, Any] | None = None
    ) -> Span:
        """Start the recording span ``planned`` (from :meth:`plan`) at ``start_time``
        (``time.time_ns``; None: now), with ``attributes`` set after those it was planned with."""
        ...


class _Batch:
    """A turn's spans not started yet, in the order they were planned, and those of them that
    ended, in that order. :meth:`flush` starts them all on the SDK, with their recorded start
    times, then ends the ended ones with theirs: the exported spans are those starting them at
    once would give (same ids, parents, attributes, status, times), the work done later.
    ``lock``: a user's code may touch a span from another thread (a tool run in a thread)."""

    __slots__ = ("ended", "flushed", "lock", "spans", "starter")

    def __init__(self, starter: SpanStarter) -> None:
        self.starter = starter
        self.spans: list[_Deferred] = []
        self.ended: list[_Deferred] = []
        self.flushed = False
        self.lock = threading.RLock()

    def add(self, planned: PlannedSpan) -> Span:
        """The span ``planned`` in this batch; started at once when the batch is flushed."""
        with self.lock:
            if not self.flushed:
                span = _Deferred(self, planned)
                self.spans.append(span)
                return span
        return self.starter.start(planned)

    def flush(self) -> None:
        """Start the batch's spans (and end the ended ones); spans of the turn planned later
        start at once."""
        with self.lock:
            if self.flushed:
                return
            self.flushed = True
            for span in self.spans:
                span.start(self.starter)
            for span in self.ended:
                span.started().end(span.end_time)
            self.spans.clear()
            self.ended.clear()


class _Deferred(Span):
    """A recording span planned, not started on the SDK until its turn's batch is flushed: its
    ids are fixed (``get_span_context``, so children, the current context and ``traceparent``
    headers name it already), its start time recorded. The engine's attributes, status and end
    wait in it until the flush; anything else asked of it (a user's event, link, exception,
    rename, or a change after its end) flushes the batch first and goes to the SDK's span."""

    __slots__ = ("_attributes", "_batch", "_planned", "_span", "_start_time", "_status", "end_time")

    def __init__(self, batch: _Batch, planned: PlannedSpan) -> None:
        self._batch = batch
        self._planned = planned
        self._start_time = time.time_ns()
        self._span: Span | None = None
        self._attributes: dict[str, Any] | None = None
        self._status: tuple[Status | StatusCode, str | None] | None = None
        self.end_time: int | None = None

    def start(self, starter: SpanStarter) -> None:
        """Start the SDK's span (the batch's flush), with what waited for it but the end."""
        span = self._span = starter.start(self._planned, self._start_time, self._attributes)
        if self._status is not None:
            span.set_status(*self._status)

    def started(self) -> Span:
        """The SDK's span, its batch flushed first when it has not been."""
        if self._span is None:
            self._batch.flush()
            assert self._span is not None  # started by the flush: it is in the batch
        return self._span

    def _waiting(self) -> bool:
        return self._span is None and self.end_time is None

    def get_span_context(self) -> SpanContext:
        return self._planned.context

    def is_recording(self) -> bool:
        return self.end_time is None if self._span is None else self._span.is_recording()

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        with self._batch.lock:
            if self._waiting():
                if self._attributes is None:
                    self._attributes = dict(attributes)
                else:
                    self._attributes.update(attributes)
                return
        self.started().set_attributes(attributes)

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.set_attributes({key: value})

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        with self._batch.lock:
            if self._waiting():
                self._status = (status, description)
                return
        self.started().set_status(status, description)

    def end(self, end_time: int | None = None) -> None:
        with self._batch.lock:
            if self._waiting():
                self.end_time = time.time_ns() if end_time is None else end_time
                self._batch.ended.append(self)
                return
        self.started().end(end_time)

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        self.started().add_event(name, attributes, timestamp)

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        self.started().add_link(context, attributes)

    def update_name(self, name: str) -> None:
        self.started().update_name(name)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        self.started().record_exception(exception, attributes, timestamp, escaped)


class _Scope:
    """``with``: ``span`` is the current span inside, and ends on the way out; an exception
    (not a cancellation) marks it failed. ``late()`` gives the attributes set on the way out:
    those no sampler needs wait until the operation is over, off the path to the first token
    (the conventions ask only for the sampling-relevant ones at creation). ``after()`` runs last
    (its batch's flush)."""

    __slots__ = ("_after", "_late", "_span", "_token")

    def __init__(
        self,
        span: Span,
        late: Callable[[], dict[str, Any]] | None = None,
        after: Callable[[], None] | None = None,
    ) -> None:
        self._span = span
        self._late = late
        self._after = after
        self._token: object = None

    def __enter__(self) -> Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        otel_context.detach(self._token)  # type: ignore[arg-type]
        span = self._span
        if self._late is not None and span.is_recording():
            span.set_attributes(self._late())
        if error is not None and not isinstance(error, asyncio.CancelledError | GeneratorExit):
            fail(span, error)
        span.end()
        if self._after is not None:
            self._after()


class _Off:
    """The scope when tracing is off: nothing is recorded."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        return None


_OFF = _Off()


class Tracing:
    """Creates the spans of turns, model calls, tool calls and hooks through ``spans``.

    ``spans`` None: tracing is off and every scope is a shared no-op (a method call per span).
    ``capture_content`` records message content (the conventions' opt-in attributes).

    A turn's spans are planned, not started, until its first token has been sent (the engine
    calls :meth:`start_later`'s flush then) or the turn ends: their ids, parents and start times
    are fixed at once (children, the current context and the ``traceparent`` sent to the provider
    name them), the SDK's work waits until the first token is out. Spans planned after that
    start at once.
    """

    __slots__ = ("_spans", "capture_content")

    def __init__(self, spans: SpanStarter | None = None, *, capture_content: bool = False) -> None:
        self._spans = spans
        self.capture_content = capture_content

    @property
    def enabled(self) -> bool:
        """True when spans are recorded."""
        return self._spans is not None

    @staticmethod
    def start_later() -> Callable[[], None] | None:
        """What starts the current turn's planned spans on the SDK (and ends those ended), for
        the engine to call once its first token is out; None when none waits. Not called, the
        turn's end starts them."""
        current = trace.get_current_span()
        if type(current) is _Deferred and not current._batch.flushed:
            return current._batch.flush
        return None

    def _start(
        self,
        spans: SpanStarter,
        name: str,
        kind: SpanKind,
        attributes: dict[str, Any],
        *,
        parent: Context | None = None,
        links: Sequence[Link] = (),
        batch: _Batch | None = None,
    ) -> Span:
        """Span ``name``, a child of ``parent``'s current span (None: the current context's): in
        ``batch``, else in the batch of its parent span while that is not flushed, else started."""
        if parent is None:
            parent = otel_context.get_current()
        planned = spans.plan(name, parent, kind, attributes, links)
        if not planned.recording:
            return NonRecordingSpan(planned.context)
        if batch is None:
            current = trace.get_current_span(parent)
            if type(current) is not _Deferred:
                return spans.start(planned)
            batch = current._batch
        return batch.add(planned)

    def turn(self, request: TurnRequest, provider: Provider | None, *, attempt: int) -> _Scope | _Off:
        """The span of one turn (``invoke_agent turnwire``). Its parent is the trace context the
        request carries (``TurnRequest.trace_context``, W3C ``traceparent``/``tracestate``); a
        recovery (``attempt`` > 1 of a crashed turn) starts a new trace with a link to it
        instead, since the original turn span ended with the crashed process. The turn's spans
        are started at the latest when this scope ends."""
        spans = self._spans
        if spans is None:
            return _OFF
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": AGENT_NAME,
            "gen_ai.provider.name": provider_name(provider),
            "gen_ai.request.model": request.model.partition(":")[2],
        }
        parent = propagate.extract(request.trace_context) if request.trace_context else None
        links: Sequence[Link] = ()
        if attempt > 1:
            attributes["turnwire.attempt"] = attempt
            origin = trace.get_current_span(parent).get_span_context() if parent is not None else None
            links = [Link(origin)] if origin is not None and origin.is_valid else ()
            parent = otel_context.Context()
        batch = _Batch(spans)
        span = self._start(
            spans, _TURN_SPAN, SpanKind.INTERNAL, attributes, parent=parent, links=links, batch=batch
        )

        def late() -> dict[str, Any]:
            found: dict[str, Any] = {
                "gen_ai.conversation.id": request.conversation_id,
                "turnwire.request_id": request.request_id,
            }
            if request.continuation:  # absent on the common new turn: each attribute costs µs twice
                found["turnwire.continuation"] = True
            return found

        return _Scope(span, late, batch.flush)

    def end_turn(
        self,
        span: Span,
        *,
        outcome: str,
        usage: Usage,
        error: BaseException | None,
        cost: Cost | None = None,
        cancel_cause: str = "",
    ) -> None:
        """Record how the turn ended: ``turnwire.turn.status`` (completed, error, aborted,
        interrupted, skipped, refused: a budget refused it at its admission), its summed usage and
        cost (:func:`_cost`), for ``error`` and ``refused`` the error, and for a turn a plain
        cancel ended who asked (``turnwire.turn.cancel_cause``: ``cancel_request``,
        ``caller_left``)."""
        if not span.is_recording():
            return
        attributes = {"turnwire.turn.status": outcome, **_usage(usage), **_cost(cost)}
        if cancel_cause and outcome == "aborted":
            attributes["turnwire.turn.cancel_cause"] = cancel_cause
        span.set_attributes(attributes)
        if outcome in ("error", "refused") and error is not None:
            fail(span, error)

    def chat(self, provider: Provider, request: ModelRequest, conversation_id: str) -> _Scope | _Off:
        """The span of one model call (``chat {model}``, a step), a child of the current span."""
        spans = self._spans
        if spans is None:
            return _OFF
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(provider),
            "gen_ai.request.model": request.model,
        }
        span = self._start(spans, f"chat {request.model}", SpanKind.CLIENT, attributes)
        capture = self.capture_content

        def late() -> dict[str, Any]:
            found: dict[str, Any] = {
                "gen_ai.conversation.id": conversation_id,
                "turnwire.step_number": request.step_number,
            }
            settings = request.settings
            for field, key in _SETTINGS:
                value = getattr(settings, field)
                if value is not None:
                    found[key] = value
            if settings.stop_sequences:
                found["gen_ai.request.stop_sequences"] = list(settings.stop_sequences)
            if capture:
                if request.system:
                    found["gen_ai.system_instructions"] = trace_content.system_instructions(request.system)
                found["gen_ai.input.messages"] = trace_content.input_messages(request.messages)
            return found

        return _Scope(span, late)

    def end_chat(
        self, span: Span, finish: FinishStep, reply: AssistantMessage, cost: Cost | None = None
    ) -> None:
        """Record the model call's response: model, id, finish reason, usage, cost (:func:`_cost`);
        with content capture the step's reply (its text and tool calls, from ``reply``)."""
        if not span.is_recording():
            return
        reason = str(finish.raw_finish_reason or finish.finish_reason)  # a plain str (not an enum) to export
        attributes: dict[str, Any] = {
            "gen_ai.response.finish_reasons": [reason],
            **_usage(finish.usage),
            **_cost(cost),
        }
        if finish.response_model:
            attributes["gen_ai.response.model"] = finish.response_model
        if finish.response_id:
            attributes["gen_ai.response.id"] = finish.response_id
        if self.capture_content:
            attributes["gen_ai.output.messages"] = trace_content.output_messages(
                reply.step_text(), reply.step_tool_calls(), reason
            )
        span.set_attributes(attributes)  # one call: the SDK takes its lock once

    def cut_chat(self, usage: Usage, cost: Cost | None) -> None:
        """Record on the current model call's span, a step cut short (a cancel, a stall, an
        in-stream error, a timeout), the usage the provider reported before the cut and its cost
        (:func:`_cost`): the turn's span and the metrics count them (docs/semantics.md §11), so
        the turn's usage is the sum of its ``chat`` spans'."""
        if self._spans is None:
            return
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes({**_usage(usage), **_cost(cost)})

    def tool(
        self, tool_call_id: str, tool_name: str, tool: Tool, arguments: Mapping[str, Any]
    ) -> _Scope | _Off:
        """The span of one tool call (``execute_tool {name}``), hooks included."""
        spans = self._spans
        if spans is None:
            return _OFF
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": tool_name,
            "gen_ai.tool.call.id": tool_call_id,
            "gen_ai.tool.type": "function",
        }
        description = getattr(tool, "description", "")
        if description:
            attributes["gen_ai.tool.description"] = description
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = _json_text(arguments)
        return _Scope(self._start(spans, f"execute_tool {tool_name}", SpanKind.INTERNAL, attributes))

    def end_tool(self, span: Span, *, outcome: str, output: Any, error_text: str | None) -> None:
        """Record the call's ``turnwire.tool.outcome`` (executed, blocked, substituted, failed);
        a failed call is an error (``error.type`` ``tool_error``; the message only with content
        capture, since a tool's error text may quote its input); with content capture the
        result."""
        if not span.is_recording():
            return
        if outcome == "failed":
            span.set_attributes({"turnwire.tool.outcome": outcome, "error.type": "tool_error"})
            description = error_text if self.capture_content else None
            span.set_status(Status(StatusCode.ERROR, description))
            return
        span.set_attribute("turnwire.tool.outcome", outcome)
        if self.capture_content:
            span.set_attribute("gen_ai.tool.call.result", _json_text(output))

    def hook(self, middleware: str, hook: str) -> _Scope | _Off:
        """The span of one hook call (``{hook} {middleware}``)."""
        spans = self._spans
        if spans is None:
            return _OFF
        attributes = {"turnwire.middleware.name": middleware, "turnwire.hook.name": hook}
        return _Scope(self._start(spans, f"{hook} {middleware}", SpanKind.INTERNAL, attributes))


TRACING_OFF = Tracing()
"""Tracing off: no span is created."""


def provider_name(provider: Provider | None) -> str:
    """``gen_ai.provider.name`` for ``provider``: the well-known value of its API (``anthropic``,
    ``openai`` for both OpenAI APIs and compatible servers), else its configured name."""
    if provider is None:
        return "_OTHER"
    kind = getattr(provider, "type", None)
    if isinstance(kind, str) and kind in _PROVIDER_NAMES:
        return _PROVIDER_NAMES[kind]
    return getattr(provider, "name", "") or "_OTHER"


def error_type(error: BaseException) -> str:
    """``error.type`` of ``error``: a provider error's class (``rate_limit``, ``overloaded``,
    ``context_overflow``, …), else the exception's type name."""
    while isinstance(error, TurnFailure):
        error = error.error
    if isinstance(error, ProviderError):
        return classify_error(error)
    if isinstance(error, HookError) and error.__cause__ is not None:
        return type(error.__cause__).__qualname__
    return type(error).__qualname__


def fail(span: Span, error: BaseException) -> None:
    """Mark ``span`` failed with ``error`` (recording errors, OpenTelemetry semantic conventions:
    status ERROR with the message, ``error.type``)."""
    if not span.is_recording():
        return
    span.set_attribute("error.type", error_type(error))
    span.set_status(Status(StatusCode.ERROR, str(error)[:512] or None))


def _cost(cost: Cost | None) -> dict[str, Any]:
    """The cost attributes: ``turnwire.cost.usd`` and ``turnwire.cost.price_source``, absent when
    the cost is unknown. OpenTelemetry's GenAI conventions define no cost attribute
    (https://opentelemetry.io/docs/specs/semconv/gen-ai/gen-ai-spans/), so they are Turnwire's."""
    if cost is None:
        return {}
    return {"turnwire.cost.usd": cost.usd, "turnwire.cost.price_source": cost.price_source}


def _usage(usage: Usage) -> dict[str, int]:
    """The usage attributes of ``usage`` (cache and reasoning counts only when reported)."""
    attributes = {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }
    if usage.cached_input_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_input_tokens
    if usage.cache_write_input_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_input_tokens
    if usage.reasoning_tokens:
        attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
    return attributes


def _json_text(value: Any) -> str:
    try:
        return dumps(value)
    except NotJsonError:
        return repr(value)
