"""Bursts of turn calls past ``limits.max_concurrent_rpcs``, against a real ``turnwire serve`` process.

Every call of a burst gets either a normal stream (ending with its TurnEnd) or
RESOURCE_EXHAUSTED with reason OVERLOADED and a RetryInfo: never CANCELLED,
UNAVAILABLE or anything else, and health checks answer throughout.

Sized to run in seconds in CI: a limit of 20 and bursts of 60. Set
``TURNWIRE_STRESS_SCALE=N`` to multiply both (``N=10``: a limit of 200 and
bursts of 600, the size of the original report).
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator

import grpc
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2

SCALE = max(1, int(os.environ.get("TURNWIRE_STRESS_SCALE", "1")))
LIMIT = 20 * SCALE
BURST = 60 * SCALE
PHASE_TIMEOUT = 60.0 * SCALE

CONFIG = {
    "limits": {"max_concurrent_rpcs": LIMIT},
    "providers": {
        "scripted": {
            "scripts": {
                # Runs until cancelled: the first chunk is ten minutes away.
                "held": [{"text": "never sent", "delay_ms": 600_000}],
                # About half a second: long enough to overlap the burst, short enough to finish.
                "brief": [{"text": "one two three four five", "delay_ms": 100}],
            }
        }
    },
}


def retry_delay(error: TurnwireError) -> float | None:
    """The ``google.rpc.RetryInfo`` delay of ``error`` in seconds, None without one."""
    for detail in error.status.details if error.status is not None else ():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return None


def verdict(error: TurnwireError) -> str:
    """``overloaded`` for the one acceptable refusal; the code and reason otherwise."""
    delay = retry_delay(error)
    if (
        error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        and error.reason == "OVERLOADED"
        and delay is not None
        and delay > 0
    ):
        return "overloaded"
    return f"{error.code.name} [{error.reason}] retry={delay}"


async def first_event(stream: AsyncIterator[event_pb2.TurnEvent]) -> str:
    """``started`` when the stream's first event is a TurnStart, else the call's verdict."""
    try:
        event = await anext(stream)
    except TurnwireError as error:
        return verdict(error)
    return "started" if event.HasField("turn_start") else f"first event {event.WhichOneof('event')}"


async def whole_turn(client: TurnwireClient, index: int) -> str:
    """``completed`` when the call streams a whole turn, else the call's verdict."""
    try:
        result = await collect(client.chat(f"wave-{index}", "hello", model="scripted:brief"))
    except TurnwireError as error:
        return verdict(error)
    return "completed" if result.status == event_pb2.TURN_STATUS_COMPLETED else f"turn {result.status}"


async def health_checks(target: str, count: int) -> Counter[str]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)

        async def one() -> str:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
            except grpc.aio.AioRpcError as error:
                return str(error.code().name)
            return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))

        return Counter(await asyncio.gather(*(one() for _ in range(count))))


async def test_a_burst_of_held_turns_admits_exactly_the_limit(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        streams = [
            client.chat(f"held-{i}", "hello", model="scripted:held", request_id=f"held-{i}")
            for i in range(BURST)
        ]
        outcomes, health = await asyncio.wait_for(
            asyncio.gather(
                asyncio.gather(*(first_event(stream) for stream in streams)),
                health_checks(sidecar.target, LIMIT),
            ),
            PHASE_TIMEOUT,
        )
        assert Counter(outcomes) == {"started": LIMIT, "overloaded": BURST - LIMIT}, sidecar.log_text()
        assert health == {"SERVING": LIMIT}

        # The admitted streams end normally when their turns are cancelled (TurnEnd ABORTED).
        admitted = [i for i, outcome in enumerate(outcomes) if outcome == "started"]
        cancelled = await asyncio.gather(*(client.cancel_chat(f"held-{i}") for i in admitted))
        assert all(cancelled)
        for i in admitted:
            events = [event async for event in streams[i]]
            assert events[-1].turn_end.status == event_pb2.TURN_STATUS_ABORTED
        for stream in streams:
            await stream.aclose()
    assert await sidecar.terminate() == 0, sidecar.log_text()
    assert "Traceback" not in sidecar.log_text()


async def test_waves_of_short_turns_complete_or_are_refused_with_retry_info(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        for wave in range(2):
            outcomes = await asyncio.wait_for(
                asyncio.gather(*(whole_turn(client, wave * BURST + i) for i in range(BURST))),
                PHASE_TIMEOUT,
            )
            counts = Counter(outcomes)
            assert set(counts) <= {"completed", "overloaded"}, counts
            assert counts["completed"] >= LIMIT, counts
        assert (await collect(client.chat("after", "hello"))).ok, "capacity is back after the waves"
    assert await sidecar.terminate() == 0, sidecar.log_text()
    assert "Traceback" not in sidecar.log_text()
