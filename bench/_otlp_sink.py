"""A local OTLP/gRPC trace sink for ``observability.py``: accepts every export and counts spans.

    python bench/_otlp_sink.py --port N --count FILE

``TraceService.Export`` from ``opentelemetry-proto``'s generated stubs; after each export the
number of spans received so far is written to FILE, so the benchmark shows the exporter worked.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Sink(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, count: Path) -> None:
        self.count = count
        self.spans = 0

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.spans += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        self.count.write_text(str(self.spans))
        return trace_service_pb2.ExportTraceServiceResponse()


async def serve(port: int, count: Path) -> None:
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Sink(count), server)  # type: ignore[no-untyped-call]  # opentelemetry-proto's grpc module is unannotated
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--count", type=Path, required=True)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.count))


if __name__ == "__main__":
    main()
