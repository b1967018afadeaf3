"""Spans in memory for tests: an SDK tracer provider with an in-memory exporter, and readers.

``memory_tracing()`` gives the engine's :class:`Tracing` and the exporter whose
``get_finished_spans()`` holds every ended span (exported at once: a simple span processor).
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from turnwire_server.engine.tracing import Tracing
from turnwire_server.trace_export import SdkSpans

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
CALLER_SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{CALLER_SPAN_ID:016x}-01"
"""A caller's W3C ``traceparent`` (the example of the Trace Context recommendation)."""


def memory_tracing(*, capture_content: bool = False) -> tuple[Tracing, InMemorySpanExporter]:
    """Tracing into memory, on the SDK as the server sets it up (:class:`SdkSpans`); the provider
    is not made the global one."""
    exporter = InMemorySpanExporter()
    spans = SdkSpans()
    spans.provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Tracing(spans, capture_content=capture_content), exporter


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    """The spans called ``name``, in the order they ended."""
    return [span for span in spans if span.name == name]


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    """The only span called ``name``."""
    found = named(spans, name)
    assert len(found) == 1, f"{len(found)} spans named {name!r} among {[s.name for s in spans]}"
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    """The span id of ``span``'s parent (None for a root)."""
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    """``span``'s own span id."""
    context = span.get_span_context()
    assert context is not None
    return context.span_id


def traceparent_of(span: ReadableSpan) -> str:
    """The W3C ``traceparent`` that names ``span`` as the parent, with its trace flags."""
    context = span.get_span_context()
    assert context is not None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def all_attribute_text(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute value, event and status description of ``spans`` as one string (to look
    for content that must not be there)."""
    pieces: list[str] = []
    for span in spans:
        pieces.extend(str(value) for value in (span.attributes or {}).values())
        pieces.extend(str(event.attributes) for event in span.events)
        pieces.append(span.status.description or "")
    return "\n".join(pieces)
