"""Waiting for a sidecar that starts slowly finds it as soon as it serves.

A poll loop on one gRPC channel met gRPC's default reconnect backoff (1 s growing 1.6x to 120 s):
a Check made while the channel waits to reconnect fails at once without trying the server, so a
server SERVING after 40 s of start-up on a loaded machine was found past a 60 s deadline (the
conformance runner in CI, 2026-12-07). Every such loop (``turnwire demo``'s, the test harness's,
the conformance runner's) reconnects every 0.1-0.5 s while it waits
(``turnwire_server.health_check.STARTING_SERVER_OPTIONS``).
"""

from __future__ import annotations

import asyncio
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from support.sidecar import free_port
from support.waiting import wait_until

from turnwire_server.cli.demo import wait_until_serving

# Connections the waiting loop has seen fail before the server comes up. Under gRPC's default
# backoff the sixth comes about 16 s in and the seventh ~10 s after it (each gap jittered by
# 20 %): the old loop found a server started then seconds late.
REFUSED_ATTEMPTS = 6


async def test_a_server_that_starts_late_is_found_within_a_second_of_serving() -> None:
    port = free_port()
    attempts = 0

    async def refuse(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Not a gRPC server: the connection closes before HTTP/2's handshake, a failed attempt.
        nonlocal attempts
        attempts += 1
        writer.close()

    refusing = await asyncio.start_server(refuse, "127.0.0.1", port)
    waiting = asyncio.create_task(wait_until_serving(f"127.0.0.1:{port}", limit_s=90))
    server = grpc.aio.server()
    try:
        await wait_until(
            lambda: attempts >= REFUSED_ATTEMPTS, timeout=60, what=f"{REFUSED_ATTEMPTS} failed connections"
        )
        refusing.close()
        await refusing.wait_closed()
        health = HealthServicer()
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        serving = time.monotonic()
        await waiting
        late = time.monotonic() - serving
        assert late < 1.5, f"found {late:.1f} s after the server was SERVING"
    finally:
        waiting.cancel()
        refusing.close()
        await server.stop(None)
