"""The turn limit is the product's own, against a real ``turnwire serve`` process.

``limits.max_concurrent_rpcs`` counts the turn-running calls (Chat,
SaveMessages, ContinueLastTurn) only. Every call past it ends with
RESOURCE_EXHAUSTED, reason OVERLOADED and a RetryInfo; gRPC core never drops or
cancels part of a burst first. Health checks, reflection and the unary
ChatService calls (CancelChat above all) answer while the limit is reached, and
open health or reflection streams do not use it up.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator

import grpc
import pytest
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2

HELD = {"providers": {"scripted": {"scripts": {"held": [{"text": "never sent", "delay_ms": 600_000}]}}}}
"""A turn that runs until it is cancelled (its first chunk is ten minutes away)."""


def retry_delay(error: TurnwireError) -> float | None:
    """The ``google.rpc.RetryInfo`` delay of ``error`` in seconds, None without one."""
    for detail in error.status.details if error.status is not None else ():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            return float(info.retry_delay.ToTimedelta().total_seconds())
    return None


def assert_overloaded(error: TurnwireError) -> None:
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED, error
    assert error.reason == "OVERLOADED", error
    assert error.domain == "turnwire.dev", error
    delay = retry_delay(error)
    assert delay is not None and delay > 0, f"no RetryInfo in {error}"


async def first_event(stream: AsyncIterator[event_pb2.TurnEvent]) -> event_pb2.TurnEvent | TurnwireError:
    """The stream's first event, or the error the call ended with."""
    try:
        return await anext(stream)
    except TurnwireError as error:
        return error


async def test_a_burst_past_the_limit_is_refused_with_retry_info_and_never_cancelled(
    sidecar_factory: SidecarFactory,
) -> None:
    limit, burst = 200, 600
    sidecar = await sidecar_factory({**HELD, "limits": {"max_concurrent_rpcs": limit}}).start()
    async with TurnwireClient(sidecar.target) as client:
        streams = [client.chat(f"burst-{i}", "hello", model="scripted:held") for i in range(burst)]
        outcomes = await asyncio.gather(*(first_event(stream) for stream in streams))
        started = [o for o in outcomes if isinstance(o, event_pb2.TurnEvent)]
        refused = [o for o in outcomes if isinstance(o, TurnwireError)]
        codes = Counter(f"{error.code.name} [{error.reason}]" for error in refused)
        assert len(started) == limit, f"{len(started)} turns started; refusals: {codes}"
        assert all(event.HasField("turn_start") for event in started)
        assert codes == {"RESOURCE_EXHAUSTED [OVERLOADED]": burst - limit}
        for error in refused:
            assert_overloaded(error)
        for stream in streams:
            await stream.aclose()


async def test_health_reflection_and_cancel_chat_answer_at_the_turn_limit(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory({**HELD, "limits": {"max_concurrent_rpcs": 2}}).start()
    async with (
        TurnwireClient(sidecar.target) as client,
        grpc.aio.insecure_channel(sidecar.target) as channel,
    ):
        first = client.chat("full-1", "hello", request_id="full-1", model="scripted:held")
        second = client.chat("full-2", "hello", request_id="full-2", model="scripted:held")
        assert (await anext(first)).HasField("turn_start")
        assert (await anext(second)).HasField("turn_start")

        # A liveness probe, a watcher and a reflection client all get through.
        health = health_pb2_grpc.HealthStub(channel)
        replies = await asyncio.gather(
            *(health.Check(health_pb2.HealthCheckRequest(), timeout=5) for _ in range(50))
        )
        assert {reply.status for reply in replies} == {health_pb2.HealthCheckResponse.SERVING}
        watch = health.Watch(health_pb2.HealthCheckRequest(service="turnwire.v1.ChatService"), timeout=5)
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        listing = [
            response
            async for response in reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
            )
        ]
        assert listing[0].WhichOneof("message_response") == "list_services_response"
        with pytest.raises(TurnwireError) as refused:
            await collect(client.chat("full-3", "hello", model="scripted:held"))
        assert_overloaded(refused.value)

        # So do the unary ChatService calls: cancelling a turn is how a client sheds load.
        await client.get_conversation("full-1")
        assert await client.cancel_chat("full-1") is True
        ended = [event async for event in first]
        assert ended[-1].turn_end.status == event_pb2.TURN_STATUS_ABORTED
        replacement = client.chat("full-4", "hello", model="scripted:held")
        assert (await anext(replacement)).HasField("turn_start"), "the cancelled turn freed its slot"
        await replacement.aclose()
        await second.aclose()


async def test_open_health_and_reflection_streams_do_not_use_up_the_turn_limit(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory({**HELD, "limits": {"max_concurrent_rpcs": 2}}).start()
    never = asyncio.Event()

    async def reflection_requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        await never.wait()  # keep the request stream open

    async with (
        TurnwireClient(sidecar.target) as client,
        grpc.aio.insecure_channel(sidecar.target) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        watches = [health.Watch(health_pb2.HealthCheckRequest()) for _ in range(4)]
        for watch in watches:
            assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
        streams = [reflection.ServerReflectionInfo(reflection_requests()) for _ in range(2)]
        for stream in streams:
            assert (await stream.read()).WhichOneof("message_response") == "list_services_response"

        turns = [client.chat(f"room-{i}", "hello", model="scripted:held") for i in range(2)]
        for turn in turns:
            event = await first_event(turn)
            assert isinstance(event, event_pb2.TurnEvent), f"six open streams used up the limit: {event}"
            assert event.HasField("turn_start")
        for call in (*watches, *streams):
            call.cancel()
        for turn in turns:
            await turn.aclose()
