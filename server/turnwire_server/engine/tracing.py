"""The spans of a turn: the turn, each model call, each tool call and each hook call.

The one module that creates spans. It uses only the OpenTelemetry API (a library's part: without
an SDK, or with :data:`TRACING_OFF`, nothing is recorded); the server sets up the SDK and
exporter. Names and attributes follow the OpenTelemetry GenAI semantic conventions (status
Development; https://github.com/open-telemetry/semantic-conventions-genai,
``docs/gen-ai/gen-ai-agent-spans.md`` and ``docs/gen-ai/gen-ai-spans.md``, which replaced the
``gen_ai`` pages of semantic-conventions v1.41):

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
name); Turnwire's own under ``turnwire.*`` (``turnwire.continuation`` only on a continuation).
Message content (``gen_ai.system_instructions``, ``gen_ai.input.messages``,
``gen_ai.output.messages``, ``gen_ai.tool.call.arguments`` / ``result``) is recorded only when
``capture_content`` is on: the conventions' opt-in attributes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import INVALID_SPAN, Link, Span, SpanKind, Status, StatusCode, Tracer

from turnwire.error_classes import classify_error
from turnwire.providers import ModelRequest, ProviderError
from turnwire.types import FinishStep, Usage
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

# Provider adapter types and the gen_ai.provider.name each reports (well-known values).
_PROVIDER_NAMES = {"anthropic": "anthropic", "openai": "openai", "openai-responses": "openai"}

_SETTINGS = (
    ("max_output_tokens", "gen_ai.request.max_tokens"),
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("top_k", "gen_ai.request.top_k"),
    ("presence_penalty", "gen_ai.request.presence_penalty"),
    ("frequency_penalty", "gen_ai.request.frequency_penalty"),
    ("seed", "gen_ai.request.seed"),
)


class _Scope:
    """``with``: ``span`` is the current span inside, and ends on the way out; an exception
    (not a cancellation) marks it failed. ``late()`` gives the attributes set on the way out:
    those no sampler needs wait until the operation is over, off the path to the first token
    (the conventions ask only for the sampling-relevant ones at creation)."""

    __slots__ = ("_late", "_span", "_token")

    def __init__(self, span: Span, late: Callable[[], dict[str, Any]] | None = None) -> None:
        self._span = span
        self._late = late
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


class _Off:
    """The scope when tracing is off: nothing is recorded."""

    __slots__ = ()

    def __enter__(self) -> Span:
        return INVALID_SPAN

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        return None


_OFF = _Off()


class Tracing:
    """Creates the spans of turns, model calls, tool calls and hooks on ``tracer``.

    ``tracer`` None: tracing is off and every scope is a shared no-op (a method call per span).
    ``capture_content`` records message content (the conventions' opt-in attributes).
    """

    __slots__ = ("_tracer", "capture_content")

    def __init__(self, tracer: Tracer | None = None, *, capture_content: bool = False) -> None:
        self._tracer = tracer
        self.capture_content = capture_content

    @property
    def enabled(self) -> bool:
        """True when spans are recorded."""
        return self._tracer is not None

    def turn(self, request: TurnRequest, provider: Provider | None, *, attempt: int) -> _Scope | _Off:
        """The span of one turn (``invoke_agent turnwire``). Its parent is the trace context the
        request carries (``TurnRequest.trace_context``, W3C ``traceparent``/``tracestate``); a
        recovery (``attempt`` > 1 of a crashed turn) starts a new trace with a link to it
        instead, since the original turn span ended with the crashed process."""
        tracer = self._tracer
        if tracer is None:
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
        span = tracer.start_span(f"invoke_agent {AGENT_NAME}", parent, SpanKind.INTERNAL, attributes, links)

        def late() -> dict[str, Any]:
            found: dict[str, Any] = {
                "gen_ai.conversation.id": request.conversation_id,
                "turnwire.request_id": request.request_id,
            }
            if request.continuation:  # absent on the common new turn: each attribute costs µs twice
                found["turnwire.continuation"] = True
            return found

        return _Scope(span, late)

    def end_turn(self, span: Span, *, outcome: str, usage: Usage, error: BaseException | None) -> None:
        """Record how the turn ended: ``turnwire.turn.status`` (completed, error, aborted,
        interrupted, skipped), its summed usage, and for ``error`` the error."""
        if not span.is_recording():
            return
        span.set_attributes({"turnwire.turn.status": outcome, **_usage(usage)})
        if outcome == "error" and error is not None:
            fail(span, error)

    def chat(self, provider: Provider, request: ModelRequest, conversation_id: str) -> _Scope | _Off:
        """The span of one model call (``chat {model}``, a step), a child of the current span."""
        tracer = self._tracer
        if tracer is None:
            return _OFF
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": provider_name(provider),
            "gen_ai.request.model": request.model,
        }
        span = tracer.start_span(f"chat {request.model}", None, SpanKind.CLIENT, attributes)
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

    def end_chat(self, span: Span, finish: FinishStep, reply: AssistantMessage) -> None:
        """Record the model call's response: model, id, finish reason, usage; with content
        capture the step's reply (its text and tool calls, from ``reply``)."""
        if not span.is_recording():
            return
        reason = str(finish.raw_finish_reason or finish.finish_reason)  # a plain str (not an enum) to export
        attributes: dict[str, Any] = {"gen_ai.response.finish_reasons": [reason], **_usage(finish.usage)}
        if finish.response_model:
            attributes["gen_ai.response.model"] = finish.response_model
        if finish.response_id:
            attributes["gen_ai.response.id"] = finish.response_id
        if self.capture_content:
            attributes["gen_ai.output.messages"] = trace_content.output_messages(
                reply.step_text(), reply.step_tool_calls(), reason
            )
        span.set_attributes(attributes)  # one call: the SDK takes its lock once

    def tool(
        self, tool_call_id: str, tool_name: str, tool: Tool, arguments: Mapping[str, Any]
    ) -> _Scope | _Off:
        """The span of one tool call (``execute_tool {name}``), hooks included."""
        tracer = self._tracer
        if tracer is None:
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
        return _Scope(tracer.start_span(f"execute_tool {tool_name}", None, SpanKind.INTERNAL, attributes))

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
        tracer = self._tracer
        if tracer is None:
            return _OFF
        attributes = {"turnwire.middleware.name": middleware, "turnwire.hook.name": hook}
        return _Scope(tracer.start_span(f"{hook} {middleware}", None, SpanKind.INTERNAL, attributes))


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
