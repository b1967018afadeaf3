"""A local OTLP/gRPC trace receiver: ``TraceService.Export`` from ``opentelemetry-proto``'s
generated stubs, keeping every span it is sent (the tests' and the benchmark's collector).

``async with otlp_receiver() as receiver``: ``receiver.endpoint`` is its ``http://127.0.0.1:PORT``;
``receiver.spans`` the received spans, each with its resource's attributes; ``receiver.metadata``
the metadata of each export call.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


def attribute_values(attributes: Any) -> dict[str, Any]:
    """OTLP ``KeyValue``\\ s as a dict of plain values (arrays as tuples)."""
    return {kv.key: _value(kv.value) for kv in attributes}


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in value.array_value.values)
    return getattr(value, kind) if kind else None


@dataclass
class ReceivedSpan:
    """One exported span and the attributes of the resource it came with."""

    span: trace_pb2.Span
    resource: dict[str, Any]

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def attributes(self) -> dict[str, Any]:
        return attribute_values(self.span.attributes)


@dataclass
class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """The servicer; ``spans`` grows as exports arrive, ``metadata`` holds each export call's."""

    endpoint: str = ""
    spans: list[ReceivedSpan] = field(default_factory=list)
    metadata: list[dict[str, str]] = field(default_factory=list)

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.metadata.append({key: str(value) for key, value in context.invocation_metadata() or ()})
        for resource_spans in request.resource_spans:
            resource = attribute_values(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(ReceivedSpan(span, resource) for span in scope_spans.spans)
        return trace_service_pb2.ExportTraceServiceResponse()

    def named(self, name: str) -> list[ReceivedSpan]:
        """The received spans called ``name``."""
        return [span for span in self.spans if span.name == name]


@contextlib.asynccontextmanager
async def otlp_receiver() -> AsyncIterator[OtlpReceiver]:
    """A started receiver on 127.0.0.1 (a free port), stopped on exit."""
    receiver = OtlpReceiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)  # type: ignore[no-untyped-call]  # opentelemetry-proto's grpc module is unannotated
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    receiver.endpoint = f"http://127.0.0.1:{port}"
    try:
        yield receiver
    finally:
        await server.stop(None)
