"""A client that stops reading, through a real server: bounded memory and the turn stopped.

docs/semantics.md §5 (backpressure). Before: the server buffered the whole reply for a
client that read the start event and then nothing (+63 MB for a 512 KiB reply of small
deltas) and the turn ran on. Now the server holds at most ``stream_buffer_events`` unsent
events per stream; the turn is stopped (partial stored); a client that reads again later
gets what was buffered and the terminal event saying ``SLOW_CONSUMER``.
"""

from __future__ import annotations

import grpc
import psutil
from google.rpc import error_details_pb2
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2

REPLY_BYTES = 512 * 1024
LONG = " ".join(f"w{i:05d}" for i in range(REPLY_BYTES // 7))  # about 75,000 one-word deltas


def config() -> dict[str, object]:
    return {
        "providers": {"scripted": {"scripts": {"long": [{"text": LONG}]}}},
        "limits": {"stream_buffer_events": 256, "slow_reader_timeout_seconds": 1.0},
    }


async def test_a_reader_that_stops_holds_little_memory_and_its_turn_and_call_end(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(config()).start()
    server = psutil.Process(sidecar.pid)
    async with TurnwireClient(sidecar.target) as client:
        warm = await collect(client.chat("warm-up", "hi"))
        assert warm.status_name == "COMPLETED"
    baseline = server.memory_info().rss

    channel = grpc.aio.insecure_channel(sidecar.target)
    stub = chat_service_pb2_grpc.ChatServiceStub(channel)
    request = chat_service_pb2.ChatRequest(conversation_id="stuck", model="scripted:long")
    request.message.parts.add().text.text = "talk a lot"
    call = stub.Chat(request)
    first = await call.read()
    assert first.event.WhichOneof("event") == "turn_start"
    # Read nothing more. The turn must stop on its own (its stop is logged) ...
    await wait_until(
        lambda: "stopped: the client read no event" in sidecar.log_text(),
        timeout=30,
        what="the turn of the stuck reader is stopped",
    )
    grown = server.memory_info().rss - baseline
    assert grown < 40 * 1024 * 1024, f"the server grew by {grown / 2**20:.1f} MiB for one stuck reader"
    # ... and when the client reads again, the stream ends with the terminal event saying why.
    last = first
    while (response := await call.read()) is not grpc.aio.EOF:
        last = response
    assert last.event.WhichOneof("event") == "turn_end"
    assert last.event.turn_end.status == event_pb2.TURN_STATUS_ABORTED
    info = error_details_pb2.ErrorInfo()
    assert last.event.turn_end.error.details[0].Unpack(info) and info.reason == "SLOW_CONSUMER"
    assert await call.code() == grpc.StatusCode.OK
    await channel.close()

    async with TurnwireClient(sidecar.target) as client:
        stored = await client.get_conversation("stuck")
    reply = stored.messages[-1]
    assert reply.role == message_pb2.ROLE_ASSISTANT
    words = "".join(p.text.text for p in reply.parts if p.WhichOneof("kind") == "text").split()
    assert 0 < len(words) < len(LONG.split())  # the partial reply, stored
