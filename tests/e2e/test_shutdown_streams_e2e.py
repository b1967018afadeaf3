"""Graceful shutdown waits for turns, not for streams that never end, against a real process.

On SIGTERM the sidecar gives running turns ``limits.shutdown_grace_seconds``.
A health ``Watch`` or an open reflection stream never ends on its own; once
every turn is done the sidecar closes them and exits, instead of waiting out
the whole grace period (plus gRPC's margin) for them.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

GRACE = 20.0
"""Long enough that waiting it out (plus gRPC's 5 s margin) is unmistakable, and that a one-second turn
ends within it on a loaded CI (at 8 s it was cut once)."""

QUICK_EXIT = GRACE / 2
"""What a prompt exit takes at most: closing the store and ending the process, with room to spare."""

CONFIG = {
    "limits": {"shutdown_grace_seconds": GRACE},
    "providers": {
        "scripted": {"scripts": {"second": [{"text": "one two three four five", "delay_ms": 200}]}}
    },
}

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVING = health_pb2.HealthCheckResponse.SERVING


async def watch_statuses(call: grpc.aio.UnaryStreamCall) -> list[int]:
    """The statuses a Watch delivers until it ends, however it ends."""
    statuses: list[int] = []
    try:
        while (reply := await call.read()) is not grpc.aio.EOF:
            statuses.append(reply.status)
    except grpc.aio.AioRpcError:
        pass
    return statuses


async def open_reflection_stream(
    channel: grpc.aio.Channel, closed: asyncio.Event
) -> grpc.aio.StreamStreamCall:
    """A reflection stream that has answered once and stays open until ``closed`` is set."""

    async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        await closed.wait()

    call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(requests())
    assert (await call.read()).WhichOneof("message_response") == "list_services_response"
    return call


@pytest.mark.parametrize("stream", ["health watch", "reflection"])
async def test_an_open_non_turn_stream_does_not_hold_up_shutdown(
    sidecar_factory: SidecarFactory, stream: str
) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    closed = asyncio.Event()
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        if stream == "health watch":
            call = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            assert (await call.read()).status == SERVING
        else:
            call = await open_reflection_stream(channel, closed)
        async with TurnwireClient(sidecar.target) as client:
            assert (await collect(client.chat("done", "hello"))).ok  # a turn ran, and ended

        started = time.monotonic()
        code = await sidecar.terminate(timeout=GRACE + 15)
        elapsed = time.monotonic() - started
        closed.set()
        assert code == 0, sidecar.log_text()
        assert elapsed < QUICK_EXIT, (
            f"shutdown took {elapsed:.1f} s with every turn done (grace {GRACE:g} s):\n{sidecar.log_text()}"
        )
        if stream == "health watch":
            assert (await watch_statuses(call))[-1:] == [NOT_SERVING]
        call.cancel()


async def test_shutdown_ends_when_the_last_turn_ends_despite_open_watches(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    closed = asyncio.Event()
    async with (
        grpc.aio.insecure_channel(sidecar.target) as channel,
        TurnwireClient(sidecar.target) as client,
    ):
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert (await watch.read()).status == SERVING
        statuses = asyncio.ensure_future(watch_statuses(watch))
        reflection = await open_reflection_stream(channel, closed)

        turn = client.chat("running", "hello", model="scripted:second")
        assert (await anext(turn)).HasField("turn_start")
        started = time.monotonic()
        sidecar.send_signal(signal.SIGTERM)  # while the turn runs (about a second more)
        events = [event async for event in turn]
        turn_done = time.monotonic() - started
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED, "the turn had its grace"

        code = await sidecar.wait(timeout=GRACE + 15)
        elapsed = time.monotonic() - started
        closed.set()
        assert code == 0, sidecar.log_text()
        assert elapsed < turn_done + QUICK_EXIT, (
            f"the last turn ended after {turn_done:.1f} s, the process after {elapsed:.1f} s:\n"
            f"{sidecar.log_text()}"
        )
        assert (await statuses)[-1:] == [NOT_SERVING], "watchers were told before being closed"
        reflection.cancel()
