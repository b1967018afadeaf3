"""The API layer's Prometheus metrics (prometheus-client's default registry): the gRPC server's,
named and labelled as go-grpc-prometheus (grpc-ecosystem) names them, so existing dashboards and
alerts work, and the open response streams.

Labels: ``grpc_type`` (``unary``, ``client_stream``, ``server_stream``, ``bidi_stream``),
``grpc_service`` (``turnwire.v1.ChatService``, ``grpc.health.v1.Health`` …), ``grpc_method``
(``Chat`` …) and ``grpc_code`` (the status code as Go spells it: ``OK``, ``Canceled``,
``InvalidArgument``, ``ResourceExhausted`` …). Methods are the services' own, so the sets are
bounded. Recorded by :class:`~turnwire_server.api.rpc_observer.RpcObserver`.
"""

from __future__ import annotations

import grpc
from prometheus_client import Counter, Gauge, Histogram

_METHOD = ["grpc_type", "grpc_service", "grpc_method"]

STARTED = Counter(
    "grpc_server_started",
    "RPCs started on the server (their handler began).",
    _METHOD,
)

HANDLED = Counter(
    "grpc_server_handled",
    "RPCs completed on the server, whatever their status.",
    [*_METHOD, "grpc_code"],
)

HANDLING_SECONDS = Histogram(
    "grpc_server_handling_seconds",
    "Seconds from an RPC's start to its end on the server (a stream: until its last message).",
    _METHOD,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0),
)

OPEN_STREAMS = Gauge(
    "turnwire_open_streams",
    "Response streams open now (a streaming RPC from its start to its end), by method.",
    ["grpc_service", "grpc_method"],
    multiprocess_mode="livesum",  # serve --workers N: the sum over the live workers
)


def _go_name(code: grpc.StatusCode) -> str:
    if code is grpc.StatusCode.CANCELLED:
        return "Canceled"  # Go's spelling (codes.Canceled)
    if code is grpc.StatusCode.OK:
        return "OK"
    return "".join(part.capitalize() for part in code.name.split("_"))


CODE_NAMES: dict[grpc.StatusCode, str] = {code: _go_name(code) for code in grpc.StatusCode}
"""``grpc_code`` label values: each status code as go-grpc-prometheus writes it (``codes.Code.String()``)."""
