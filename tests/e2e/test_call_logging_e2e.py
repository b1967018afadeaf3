"""What a real sidecar logs for malformed requests and client cancellations.

Both are things any client can cause as often as it likes, so neither may log a
traceback or more than one short line per event (log amplification). Malformed
requests are refused with INVALID_ARGUMENT and reported at WARNING, throttled;
cancellations (cancel, deadline) log nothing at INFO.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, TurnwireError

HELD = {"providers": {"scripted": {"scripts": {"held": [{"text": "never sent", "delay_ms": 600_000}]}}}}

REPEAT = 5
MAX_LINE_CHARS = 400

BAD_TAG = b"\x00"
"""Field number 0 does not exist: no message decodes from this."""
BAD_UTF8 = b"\x0a\x02\xff\xfe"
"""Field 1 (``conversation_id``, a string) holding bytes that are not UTF-8."""

# (method, response streaming?, request bytes)
MALFORMED: list[tuple[str, bool, bytes]] = [
    ("/turnwire.v1.ChatService/Chat", True, BAD_TAG),
    ("/turnwire.v1.ChatService/Chat", True, BAD_UTF8),
    ("/turnwire.v1.ChatService/SaveMessages", True, BAD_TAG),
    ("/turnwire.v1.ChatService/GetConversation", False, BAD_TAG),
    ("/turnwire.v1.ChatService/CancelChat", False, BAD_TAG),
    ("/grpc.health.v1.Health/Check", False, BAD_TAG),
    ("/grpc.health.v1.Health/Watch", True, BAD_TAG),
]
REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def raw(payload: bytes) -> Callable[[Any], bytes]:
    """A request serializer that sends ``payload`` whatever the request."""
    return lambda _request: payload


async def send_malformed(
    channel: grpc.aio.Channel, method: str, streaming: bool, payload: bytes
) -> TurnwireError:
    """Call ``method`` with ``payload`` as its request; the error it ends with."""
    try:
        if streaming:
            call = channel.unary_stream(method, request_serializer=raw(payload), response_deserializer=bytes)
            async for _ in call(None, timeout=10):
                pass
        else:
            await channel.unary_unary(method, request_serializer=raw(payload), response_deserializer=bytes)(
                None, timeout=10
            )
    except grpc.aio.AioRpcError as error:
        return TurnwireError.from_rpc_error(error)
    raise AssertionError(f"{method} accepted {payload!r}")


async def send_malformed_stream(channel: grpc.aio.Channel) -> TurnwireError:
    """Open a reflection stream whose first message does not decode; the error it ends with."""
    call = channel.stream_stream(REFLECTION, request_serializer=raw(BAD_TAG), response_deserializer=bytes)
    try:
        async for _ in call(iter([None]), timeout=10):
            pass
    except grpc.aio.AioRpcError as error:
        return TurnwireError.from_rpc_error(error)
    raise AssertionError("the reflection stream accepted an undecodable message")


async def cancel_turns(client: TurnwireClient, count: int) -> None:
    """``count`` turns each cancelled by the client right after it started."""

    async def one(index: int) -> None:
        stream = client.chat(f"cancelled-{index}", "hello", model="scripted:held")
        assert (await anext(stream)).HasField("turn_start")
        await stream.aclose()  # cancels the call

    await asyncio.gather(*(one(i) for i in range(count)))


async def cancel_at_once(channel: grpc.aio.Channel, count: int) -> None:
    """``count`` Chat calls cancelled as soon as they are sent."""
    calls = []
    for _ in range(count):
        stream = channel.unary_stream(
            "/turnwire.v1.ChatService/Chat", request_serializer=raw(b""), response_deserializer=bytes
        )(None)
        calls.append(stream)
        await asyncio.sleep(0)
        stream.cancel()
    for call in calls:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.CancelledError):
            await call.wait_for_connection()


async def run_past_deadline(client: TurnwireClient, count: int) -> None:
    """``count`` turns whose calls reach their deadline while the turn runs."""

    async def one(index: int) -> None:
        try:
            async for _ in client.chat(f"deadline-{index}", "hello", model="scripted:held", timeout=0.5):
                pass
        except TurnwireError as error:
            assert error.code == grpc.StatusCode.DEADLINE_EXCEEDED, error
        else:
            raise AssertionError("the held turn ended before its deadline")

    await asyncio.gather(*(one(i) for i in range(count)))


async def cancel_watches_and_reflection(channel: grpc.aio.Channel, count: int) -> None:
    """``count`` health Watches and ``count`` reflection streams, each cancelled after its first reply."""
    never = asyncio.Event()

    async def requests() -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
        yield reflection_pb2.ServerReflectionRequest(list_services="")
        await never.wait()

    health = health_pb2_grpc.HealthStub(channel)
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    for _ in range(count):
        watch = health.Watch(health_pb2.HealthCheckRequest())
        await watch.read()
        watch.cancel()
        stream = reflection.ServerReflectionInfo(requests())
        await stream.read()
        stream.cancel()


async def test_malformed_requests_and_client_cancels_log_one_short_line_at_most(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(HELD).start()
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        errors = [
            await send_malformed(channel, method, streaming, payload)
            for method, streaming, payload in MALFORMED
            for _ in range(REPEAT)
        ]
        errors += [await send_malformed_stream(channel) for _ in range(REPEAT)]
        malformed = len(errors)

        async with TurnwireClient(sidecar.target) as client:
            await cancel_turns(client, 30)
            await cancel_at_once(channel, 30)
            await run_past_deadline(client, 10)
        await cancel_watches_and_reflection(channel, 10)
        cancels = 30 + 30 + 10 + 10 * 2

    assert await sidecar.terminate() == 0, sidecar.log_text()
    log = sidecar.log_text()
    assert "Traceback" not in log, log
    lines = log.splitlines()
    assert not [line for line in lines if " ERROR " in line], log
    begin = next(i for i, line in enumerate(lines) if "turnwire listening on" in line)
    end = next(i for i, line in enumerate(lines) if "shutting down" in line)
    during = lines[begin + 1 : end]
    assert len(during) <= malformed + cancels, log
    assert all(len(line) <= MAX_LINE_CHARS for line in during), log
    reports = [line for line in during if "malformed request" in line]
    assert 1 <= len(reports) <= malformed, log
    assert all(" WARNING " in line for line in reports), log

    # Each malformed request was refused as the caller's mistake, not as a server failure.
    for error in errors:
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT, error
        assert error.reason == "INVALID_FIELD", error
        assert "is not a valid" in error.message, error
