"""What every log line says about where it came from: the conversation, the request, the trace.

The ids live in context variables, set where a call or a turn begins (the API's per-call
interceptor, a turn's task) and inherited by every task started from there; asyncio gives each
gRPC call and each turn its own context, so they never leak between calls.
:class:`LogContextFilter` copies them, and the current OpenTelemetry span's trace and span ids
(through the OpenTelemetry API: with no SDK installed, or outside a span, there are none), onto
each record as ``conversation_id``, ``request_id``, ``trace_id`` and ``span_id`` (empty strings
when unknown; ids in the W3C Trace Context hex form).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar

from opentelemetry import trace

CONVERSATION_ID: ContextVar[str] = ContextVar("turnwire_log_conversation_id", default="")
REQUEST_ID: ContextVar[str] = ContextVar("turnwire_log_request_id", default="")

CONTEXT_FIELDS = ("conversation_id", "request_id", "trace_id", "span_id")
"""The attributes :class:`LogContextFilter` sets on every record."""

REPLICA_ID: ContextVar[str] = ContextVar("turnwire_log_replica_id", default="")

REPLICA_FIELD = "replica_id"
"""The attribute :class:`LogContextFilter` sets on every record logged where
:func:`name_replica` named the replica ("" elsewhere): JSON lines carry it, text lines do not
(their readers see one process's stderr)."""


def name_replica(replica_id: str) -> None:
    """Name the replica the server serves as (``replica-…``, its spans' ``service.instance.id``)
    for the current task and every task it starts from now on (the server's main task: its calls,
    turns and background loops): ``--workers`` interleaves its workers' lines on one stderr."""
    REPLICA_ID.set(replica_id)


def bind(conversation_id: str = "", request_id: str = "") -> None:
    """Name the conversation and request the current task (and the tasks it starts) work for;
    an empty id leaves the current value."""
    if conversation_id:
        CONVERSATION_ID.set(conversation_id)
    if request_id:
        REQUEST_ID.set(request_id)


def bind_request(request: object) -> None:
    """Name the conversation and request of a call from its request message's fields
    (``conversation_id``; ``request_id``, else ``submission_id``): :func:`bind` where a call
    begins, and again once its ids are scoped to the caller's tenant (``<tenant>/<id>``, as the
    turn's own lines spell them)."""
    bind(
        getattr(request, "conversation_id", ""),
        getattr(request, "request_id", "") or getattr(request, "submission_id", ""),
    )


class LogContextFilter(logging.Filter):
    """Sets :data:`CONTEXT_FIELDS` on each record (install it on a handler; it drops nothing).
    A value the caller passed in ``extra`` wins."""

    def filter(self, record: logging.LogRecord) -> bool:
        attributes = record.__dict__
        attributes.setdefault("conversation_id", CONVERSATION_ID.get())
        attributes.setdefault("request_id", REQUEST_ID.get())
        attributes.setdefault(REPLICA_FIELD, REPLICA_ID.get())
        span = trace.get_current_span().get_span_context()
        if span.is_valid:
            attributes.setdefault("trace_id", trace.format_trace_id(span.trace_id))
            attributes.setdefault("span_id", trace.format_span_id(span.span_id))
        else:
            attributes.setdefault("trace_id", "")
            attributes.setdefault("span_id", "")
        return True


__all__ = [
    "CONTEXT_FIELDS",
    "CONVERSATION_ID",
    "REPLICA_FIELD",
    "REPLICA_ID",
    "REQUEST_ID",
    "LogContextFilter",
    "bind",
    "bind_request",
    "name_replica",
]
