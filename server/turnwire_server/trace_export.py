"""The OpenTelemetry SDK for traces: a tracer provider exporting over OTLP/gRPC (``tracing:``).

The engine creates spans through the OpenTelemetry API (:mod:`turnwire_server.engine.tracing`);
this module gives it a tracer backed by the SDK: a resource naming the service, a parent-based
sampler, a batch span processor (``OTEL_BSP_*`` tune it; the SDK's defaults) and the OTLP/gRPC
span exporter (``opentelemetry-exporter-otlp-proto-grpc``). Settings left unset fall back to the SDK's own
``OTEL_*`` variables (OpenTelemetry SDK environment variables specification), because the SDK
reads them whenever it is not given a value. The provider is also made the global one, so spans a
user's tool or middleware creates with the OpenTelemetry API join the turn's trace.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, SERVICE_VERSION, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from turnwire_server.config import TracingSettings
from turnwire_server.engine.tracing import TRACING_OFF, Tracing

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


def start_tracing(settings: TracingSettings) -> tuple[Tracing, TracerProvider | None]:
    """The engine's :class:`Tracing` and the SDK provider behind it (None when tracing is off).

    Call ``provider.shutdown()`` at exit: it exports the spans still queued. Raises
    :class:`OSError` when ``ca_file`` cannot be read.
    """
    if not settings.enabled:
        return TRACING_OFF, None
    attributes: dict[str, str] = {SERVICE_VERSION: _version()}
    if settings.service_name is not None:
        attributes[SERVICE_NAME] = settings.service_name
    elif not os.environ.get("OTEL_SERVICE_NAME"):
        attributes[SERVICE_NAME] = "turnwire"
    sampler = (
        None if settings.sampler_ratio is None else ParentBased(TraceIdRatioBased(settings.sampler_ratio))
    )
    provider = TracerProvider(resource=service_resource(attributes), sampler=sampler)
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
    tracer = provider.get_tracer(INSTRUMENTATION_SCOPE, _version())
    return Tracing(tracer, capture_content=settings.capture_message_content), provider


def _version() -> str:
    try:
        return version("turnwire")
    except PackageNotFoundError:  # a plain clone, not installed
        return "0+unknown"
