"""Overload is rejected with RESOURCE_EXHAUSTED, never by silently dropping calls.

Two bounds: the server-wide ``limits.max_concurrent_rpcs`` (turn calls at once,
enforced by the sidecar's call gate, ``turnwire_server.api.admission``) and the
per-conversation turn queue
(``limits.max_queued_turns_per_conversation``, enforced at admission with
google.rpc details). Both run against a real ``turnwire serve`` process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2

SLOW = {
    "providers": {
        "scripted": {
            "scripts": {
                # About 4.5 s from its start: still running when the over-the-limit call arrives
                # (a call or two later, seconds on a loaded machine), then it completes.
                "slow": [{"text": "a b c d e f g h", "delay_ms": 500}],
                "quick": [{"text": "done"}],
            }
        }
    }
}


async def _started(events: AsyncIterator[event_pb2.TurnEvent]) -> event_pb2.TurnEvent:
    """Wait for the first event (TurnStart) of a stream that stays open."""
    return await anext(events)


async def test_calls_beyond_max_concurrent_rpcs_get_resource_exhausted(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory({**SLOW, "limits": {"max_concurrent_rpcs": 2}}).start()
    async with TurnwireClient(sidecar.target) as client:
        first = client.chat("busy-1", "hello", model="scripted:slow")
        second = client.chat("busy-2", "hello", model="scripted:slow")
        assert (await _started(first)).HasField("turn_start")
        assert (await _started(second)).HasField("turn_start")
        with pytest.raises(TurnwireError) as refused:
            await collect(client.chat("busy-3", "hello", model="scripted:slow"))
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The admitted turns are unaffected and complete.
        for stream in (first, second):
            events = [event async for event in stream]
            assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
        # Capacity is back once they ended.
        result = await collect(client.chat("busy-3", "hello", model="scripted:quick"))
        assert result.status == event_pb2.TURN_STATUS_COMPLETED


async def _admitted(client: TurnwireClient, request_id: str) -> bool:
    """Whether the server has admitted a turn with ``request_id`` (it is running or queued).

    Asks with a Chat that reuses the id on another conversation and a model that does not
    exist: admission checks the id before the model, so the probe is refused either as
    ALREADY_EXISTS (the turn is there) or as INVALID_ARGUMENT (it is not); it never runs.
    """
    with pytest.raises(TurnwireError) as probe:
        await collect(client.chat("queue-probe", "probe", request_id=request_id, model="absent:probe"))
    refused = probe.value
    if refused.code == grpc.StatusCode.ALREADY_EXISTS:
        return True
    assert (refused.code, refused.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "UNKNOWN_MODEL"), refused
    return False


async def test_a_full_conversation_queue_is_refused_with_details(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory({**SLOW, "limits": {"max_queued_turns_per_conversation": 1}}).start()
    async with TurnwireClient(sidecar.target) as client:
        running = client.chat("queue", "first", model="scripted:slow")
        assert (await _started(running)).HasField("turn_start")
        queued = asyncio.ensure_future(
            collect(client.chat("queue", "second", request_id="second", model="scripted:quick"))
        )
        await wait_until(lambda: _admitted(client, "second"), what="the second call is queued")
        with pytest.raises(TurnwireError) as refused:
            await collect(client.chat("queue", "third", model="scripted:slow"))
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert refused.value.reason == "OVERLOADED"
        assert "retry" in refused.value.message
        assert [event async for event in running][-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
        assert (await queued).status == event_pb2.TURN_STATUS_COMPLETED
        conversation = await client.get_conversation("queue")
        texts = [m.parts[0].text.text for m in conversation.messages if m.role == 1]
        assert texts == ["first", "second"]  # the refused message was never stored
