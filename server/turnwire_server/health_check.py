"""The ``turnwire health`` command: one Check call on the standard gRPC health service.

Meant for Docker ``HEALTHCHECK``, Kubernetes ``exec`` probes and scripts: the answer is one
word on stdout and the exit status is 0 only for SERVING. Docker reads 0 as healthy and 1 as
unhealthy and reserves 2, so every other outcome exits 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from turnwire_client.metadata import AUTHORIZATION_METADATA
from turnwire_client.tls import TlsOptions

__all__ = ["EXIT_SERVING", "EXIT_UNHEALTHY", "STARTING_SERVER_OPTIONS", "HealthAnswer", "check_health"]

EXIT_SERVING = 0
"""Exit code: the service is SERVING."""
EXIT_UNHEALTHY = 1
"""Exit code: anything else (NOT_SERVING, unknown service, unreachable, another error)."""

UNREACHABLE = "unreachable"

STARTING_SERVER_OPTIONS: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)
"""Channel options for polling a server that is still starting: reconnect every 0.1-0.5 s.
With gRPC's default backoff (1 s, growing 1.6x to 120 s) a channel that met a refused
connection for a while reconnects late: a server SERVING after 40 s of start-up on a loaded
machine was found only past a 60 s deadline (CI, 2026-12-07). A Check made while the channel
waits to reconnect fails at once without trying the server, so polling faster does not help."""


@dataclass(frozen=True)
class HealthAnswer:
    """What one health check found.

    ``status`` is the word printed on stdout: ``SERVING``, ``NOT_SERVING``, ``SERVICE_UNKNOWN``
    (the server does not know the service), ``UNKNOWN``, ``unreachable`` (the connection
    was refused or failed at once, or no answer came within the timeout: ``detail`` says
    which) or ``error`` (the server answered with another gRPC error, e.g. UNIMPLEMENTED when
    it has no health service). ``detail`` is a sentence naming the
    target for every status but SERVING, else empty.
    """

    status: str
    detail: str = ""

    @property
    def exit_code(self) -> int:
        """:data:`EXIT_SERVING` for SERVING, else :data:`EXIT_UNHEALTHY`."""
        return EXIT_SERVING if self.status == "SERVING" else EXIT_UNHEALTHY


def check_health(
    target: str,
    service: str = "",
    timeout: float = 5.0,
    tls: TlsOptions | None = None,
    *,
    token: str | None = None,
) -> HealthAnswer:
    """Ask ``target`` (``HOST:PORT``; plaintext, or TLS with ``tls``) whether ``service``
    (``""``: the whole server) is serving, waiting at most ``timeout`` seconds; ``token`` is sent
    as a bearer token (for ``auth.open_health: false``). Never raises for an RPC outcome: every
    failure is a :class:`HealthAnswer` (a failed TLS handshake is ``unreachable``); raises
    :class:`OSError` when a ``tls`` file cannot be read."""
    what = f"service {service!r}" if service else "the server"
    channel = (
        grpc.insecure_channel(target)
        if tls is None
        else grpc.secure_channel(target, tls.channel_credentials(), options=tls.channel_options())
    )
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            metadata = ((AUTHORIZATION_METADATA, f"Bearer {token}"),) if token else None
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError as error:
            return _failed(target, what, timeout, error)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    if reply.status == health_pb2.HealthCheckResponse.SERVING:
        return HealthAnswer(status)
    return HealthAnswer(status, f"{target}: {what} is {status}")


def _failed(target: str, what: str, timeout: float, error: grpc.RpcError) -> HealthAnswer:
    code = error.code()
    message = error.details() or ""
    if code == grpc.StatusCode.NOT_FOUND:
        return HealthAnswer("SERVICE_UNKNOWN", f"{target}: the health service does not know {what}")
    # Worded by what happened: a refused connection (nothing listens) is UNAVAILABLE at once,
    # long before the deadline; only a host that accepts and stays silent runs into it.
    if code == grpc.StatusCode.UNAVAILABLE:
        what_happened = (
            "the connection was refused at once (is the sidecar running and listening there?)"
            if "refused" in message.lower()
            else "the connection failed at once"
        )
        return HealthAnswer(UNREACHABLE, f"cannot reach {target}: {what_happened} ({code.name}: {message})")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return HealthAnswer(
            UNREACHABLE,
            f"cannot reach {target}: no answer within {timeout:g} s (--timeout) ({code.name}: {message})",
        )
    return HealthAnswer("error", f"{target}: health check of {what} failed ({code.name}: {message})")
