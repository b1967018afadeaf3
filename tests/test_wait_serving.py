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

from turnwire_server.cli.demo import wait_until_serving

# Long enough for gRPC's default backoff to have grown past 4 s (attempts at about 0, 1, 2.6, 5.2,
# 9.3 and 15.8 s, each gap jittered by 20 %): the old loop found a server started now seconds late.
SLOW_START_SECONDS = 12.0


async def test_a_server_that_starts_late_is_found_within_a_second_of_serving() -> None:
    port = free_port()
    started = asyncio.get_running_loop().create_future()

    async def start_late() -> grpc.aio.Server:
        await asyncio.sleep(SLOW_START_SECONDS)  # the slow start being simulated, not a wait
        server = grpc.aio.server()
        health = HealthServicer()
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        started.set_result(time.monotonic())
        return server

    starting = asyncio.create_task(start_late())
    try:
        await wait_until_serving(f"127.0.0.1:{port}", limit_s=60)
        found = time.monotonic()
        late = found - await started
        assert late < 1.5, f"found {late:.1f} s after the server was SERVING"
    finally:
        server = await starting
        await server.stop(None)
