"""The OpenTelemetry SDK for traces: a tracer provider exporting over OTLP/gRPC (``tracing:``).

The engine creates spans through the OpenTelemetry API (:mod:`turnwire_server.engine.tracing`);
this module gives it a tracer backed by the SDK: a resource naming the service, a parent-based
sampler, a batch span processor (``OTEL_BSP_*`` tune it; the SDK's defaults) and the OTLP/gRPC
span exporter (``opentelemetry-exporter-otlp-proto-grpc``). Settings left unset fall back to the SDK's own
``OTEL_*`` variables (OpenTelemetry SDK environment variables specification), because the SDK
reads them whenever it is not given a value. The provider is also made the global one, so spans a
user's tool or middleware creates with the OpenTelemetry API join the turn's trace.

:class:`SdkSpans` is the SDK piece the engine's deferred spans need (its ``SpanStarter``): a span's
ids and sampling decision fixed when the engine plans it, and the SDK span started later with
exactly those.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_INSTANCE_ID, SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, SamplingResult, TraceIdRatioBased
from opentelemetry.trace import Link, Span, SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.util.types import Attributes

from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.tracing_settings import TracingSettings

log = logging.getLogger("turnwire.tracing")

INSTRUMENTATION_SCOPE = "turnwire"
"""The tracer's instrumentation scope name."""


class HashedResource(Resource):
    """A :class:`~opentelemetry.sdk.resources.Resource` hashed once.

    The OTLP encoder groups the spans of every export batch by resource, hashing each span's;
    ``Resource.__hash__`` serializes all the attributes to JSON on every call (opentelemetry-sdk
    1.45), about 11 µs a span on the exporter's thread, an eighth of a one-step turn's export.
    A resource is immutable, so its hash can be kept. Equality stays the SDK's.
    """

    def __init__(self, attributes: Mapping[str, Any], schema_url: str | None = None) -> None:
        super().__init__(attributes, schema_url)
        self._hash = super().__hash__()

    def __hash__(self) -> int:
        return self._hash


def service_resource(attributes: Mapping[str, str]) -> HashedResource:
    """The resource of the server's spans: ``attributes`` over the SDK's defaults and
    ``OTEL_RESOURCE_ATTRIBUTES`` / ``OTEL_SERVICE_NAME`` (``Resource.create``), hashed once."""
    resource = Resource.create(dict(attributes))
    return HashedResource(resource.attributes, resource.schema_url)


class _Staged(threading.local):
    """What the next span this thread starts gets instead of new ids and a new sampling decision
    (set by :meth:`SdkSpans.start` around one ``start_span`` call; 0 / None: nothing staged)."""

    trace_id = 0
    span_id = 0
    sampling: SamplingResult | None = None


class _StagedIds(IdGenerator):
    """The provider's id generator, giving a staged id once when there is one."""

    def __init__(self, inner: IdGenerator, staged: _Staged) -> None:
        self.inner = inner
        self._staged = staged

    def generate_span_id(self) -> int:
        staged = self._staged
        if staged.span_id:
            span_id, staged.span_id = staged.span_id, 0
            return span_id
        return self.inner.generate_span_id()

    def generate_trace_id(self) -> int:
        staged = self._staged
        if staged.trace_id:
            trace_id, staged.trace_id = staged.trace_id, 0
            return trace_id
        return self.inner.generate_trace_id()

    def is_trace_id_random(self) -> bool:
        return self.inner.is_trace_id_random()


class _StagedSampler(Sampler):
    """The provider's sampler, giving a staged decision once when there is one (a span's
    decision is made once, when it is planned, even for a sampler that is not deterministic)."""

    def __init__(self, inner: Sampler, staged: _Staged) -> None:
        self.inner = inner
        self._staged = staged

    def should_sample(  # noqa: PLR0917 - the SDK's Sampler signature
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: TraceState | None = None,
    ) -> SamplingResult:
        staged = self._staged
        if staged.sampling is not None:
            sampling, staged.sampling = staged.sampling, None
            return sampling
        return self.inner.should_sample(parent_context, trace_id, name, kind, attributes, links, trace_state)

    def get_description(self) -> str:
        return self.inner.get_description()


@dataclass(slots=True)
class _Plan:
    """A planned span (the engine's ``PlannedSpan``): what :meth:`SdkSpans.start` starts it with."""

    name: str
    parent: Context
    kind: SpanKind
    attributes: Attributes
    links: Sequence[Link]
    context: SpanContext
    recording: bool
    sampling: SamplingResult


class SdkSpans:
    """The engine's ``SpanStarter`` (:class:`turnwire_server.engine.tracing.SpanStarter`) and the
    SDK ``provider`` behind it (``resource``; ``sampler`` None: the SDK's, ``OTEL_TRACES_SAMPLER``).

    :meth:`plan` makes a span's ids and sampling decision as the SDK's ``Tracer.start_span`` does
    (opentelemetry-sdk 1.45: the parent's trace id or a new one, the sampler on the parent
    context, the sampled and random-trace-id flags, the sampler's trace state), without the span;
    :meth:`start` starts the SDK span with exactly those, through the provider's id generator and
    sampler, which give staged values when there are (else their own: spans others start through
    the provider are unaffected)."""

    def __init__(self, resource: Resource | None = None, sampler: Sampler | None = None) -> None:
        staged = _Staged()
        self._staged = staged
        self._ids = _StagedIds(RandomIdGenerator(), staged)
        self.provider = TracerProvider(resource=resource, sampler=sampler, id_generator=self._ids)
        # Wrapped once the provider has picked its sampler (OTEL_TRACES_SAMPLER when None).
        self._sampler = _StagedSampler(self.provider.sampler, staged)
        self.provider.sampler = self._sampler
        self._tracer = self.provider.get_tracer(INSTRUMENTATION_SCOPE, _version())

    def plan(
        self, name: str, parent: Context, kind: SpanKind, attributes: Attributes, links: Sequence[Link]
    ) -> _Plan:
        """The span ``name`` would be, child of ``parent``'s current span (a root when it has
        none): its ids, flags and sampling decision."""
        parent_span = trace.get_current_span(parent).get_span_context()
        ids = self._ids.inner
        root = not parent_span.is_valid
        trace_id = ids.generate_trace_id() if root else parent_span.trace_id
        sampling = self._sampler.inner.should_sample(parent, trace_id, name, kind, attributes, links)
        decision = sampling.decision
        flags = TraceFlags.SAMPLED if decision is Decision.RECORD_AND_SAMPLE else TraceFlags.DEFAULT
        if ids.is_trace_id_random() if root else parent_span.trace_flags.random_trace_id:
            flags |= TraceFlags.RANDOM_TRACE_ID
        context = SpanContext(
            trace_id, ids.generate_span_id(), False, TraceFlags(flags), sampling.trace_state
        )
        recording = decision is not Decision.DROP
        return _Plan(name, parent, kind, attributes, links, context, recording, sampling)

    def start(
        self, planned: _Plan, start_time: int | None = None, attributes: Mapping[str, Any] | None = None
    ) -> Span:
        """Start ``planned`` (a recording one) on the SDK, started at ``start_time``
        (``time.time_ns``; None: now), with the planned ids and sampling decision; ``attributes``
        (set since it was planned) are recorded with the planned ones, as set after them."""
        sampling = planned.sampling
        if attributes:
            # One pass of the SDK's attribute checks and lock instead of a set_attributes call more.
            sampling = SamplingResult(
                sampling.decision, {**sampling.attributes, **attributes}, sampling.trace_state
            )
        staged = self._staged
        staged.trace_id = planned.context.trace_id  # taken only by a root span
        staged.span_id = planned.context.span_id
        staged.sampling = sampling
        try:
            return self._tracer.start_span(
                planned.name, planned.parent, planned.kind, planned.attributes, planned.links, start_time
            )
        finally:
            staged.trace_id = staged.span_id = 0
            staged.sampling = None


def start_tracing(settings: TracingSettings, replica_id: str = "") -> tuple[Tracing, TracerProvider | None]:
    """The engine's :class:`Tracing` and the SDK provider behind it (None when tracing is off).
    The spans' ``service.instance.id`` is ``replica_id`` (the id the start-up line, the store's
    sessions and the lease log lines name), unless ``OTEL_RESOURCE_ATTRIBUTES`` sets it.

    Call ``provider.shutdown()`` at exit: it exports the spans still queued. Raises
    :class:`OSError` when ``ca_file`` cannot be read.
    """
    if not settings.enabled:
        return TRACING_OFF, None
    attributes: dict[str, str] = {SERVICE_VERSION: _version()}
    if replica_id and f"{SERVICE_INSTANCE_ID}=" not in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", ""):
        attributes[SERVICE_INSTANCE_ID] = replica_id
    if settings.service_name is not None:
        attributes[SERVICE_NAME] = settings.service_name
    elif not os.environ.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME] = "turnwire"
    sampler = (
        None if settings.sampler_ratio is None else ParentBased(TraceIdRatioBased(settings.sampler_ratio))
    )
    spans = SdkSpans(service_resource(attributes), sampler)
    provider = spans.provider
    credentials = None
    if settings.ca_file is not None:
        credentials = grpc.ssl_channel_credentials(root_certificates=settings.ca_file.read_bytes())
    headers = {name.lower(): value.get_secret_value() for name, value in settings.headers.items()}
    exporter = OTLPSpanExporter(
        endpoint=settings.endpoint,
        insecure=settings.insecure,
        credentials=credentials,
        headers=headers or None,
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    log.info(
        "tracing on: OTLP/gRPC to %s%s",
        settings.endpoint
        or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "http://localhost:4317",
        ", message content captured" if settings.capture_message_content else "",
    )
    return Tracing(spans, capture_content=settings.capture_message_content), provider


def _version() -> str:
    try:
        return version("turnwire")
    except PackageNotFoundError:  # a plain clone, not installed
        return "0+unknown"
