"""Progress keepalives on silent turn streams, through real ``turnwire serve`` processes (issue 18,
liveness; docs/semantics.md §8).

A proxy or client with an idle timeout closes a call that carries nothing for a while. A turn
stream silent for ``limits.progress_interval_seconds`` (a slow tool, a turn queued behind another)
sends ``Progress`` events: sequence number 0, not stored, never after the TurnEnd; the Python
client skips them unless asked.
"""

from __future__ import annotations

import asyncio

import grpc
from support.hooks import pythonpath_env
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2

TOOL = event_pb2.PROGRESS_PHASE_TOOL
QUEUED = event_pb2.PROGRESS_PHASE_QUEUED


def config(interval: float) -> dict[str, object]:
    def waits(seconds: float) -> list[dict[str, object]]:
        return [{"tool_calls": [{"name": "wait", "input": {"seconds": seconds}}]}, {"text": "waited"}]

    return {
        "default_model": "scripted:wait4",
        "providers": {
            "scripted": {
                "scripts": {
                    "wait30": waits(30),
                    "wait4": waits(4),
                    # 40 chunks, 50 ms apart: about 2 s, never silent for long.
                    "busy": [{"text": " ".join(f"w{i}" for i in range(40)), "delay_ms": 50}],
                }
            }
        },
        "tools": {"python": ["support.durable_tools:wait"]},
        "limits": {"progress_interval_seconds": interval, "drain_seconds": 0},
    }


async def read_all(call: grpc.aio.UnaryStreamCall, idle_timeout: float) -> list[event_pb2.TurnEvent]:
    """Every event of ``call`` until its end, failing like a proxy with an idle timeout would:
    when nothing arrives for ``idle_timeout`` seconds."""
    events: list[event_pb2.TurnEvent] = []
    while True:
        try:
            response = await asyncio.wait_for(call.read(), idle_timeout)
        except TimeoutError:
            call.cancel()
            raise AssertionError(
                f"idle for {idle_timeout} s after {[e.WhichOneof('event') for e in events]}"
            ) from None
        if response is grpc.aio.EOF:
            assert await call.code() == grpc.StatusCode.OK, await call.details()
            return events
        events.append(response.event)


def chat_request(conversation_id: str, model: str, request_id: str = "") -> chat_service_pb2.ChatRequest:
    request = chat_service_pb2.ChatRequest(
        conversation_id=conversation_id, model=model, request_id=request_id
    )
    request.message.parts.add().text.text = "go"
    return request


def turn_events(events: list[event_pb2.TurnEvent]) -> list[event_pb2.TurnEvent]:
    return [e for e in events if not e.HasField("progress")]


def check_keepalives(events: list[event_pb2.TurnEvent], request_id: str) -> list[event_pb2.Progress]:
    """The Progress events of a complete stream, checked: not part of the turn's stream
    (sequence number 0, numbers of the turn events without gaps), ids set, none after the
    TurnEnd."""
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "turn_end", kinds
    numbers = [e.sequence_number for e in turn_events(events)]
    assert numbers == list(range(numbers[0], numbers[0] + len(numbers))), numbers
    progress = [e for e in events if e.HasField("progress")]
    for event in progress:
        assert event.sequence_number == 0
        assert event.request_id == request_id
        assert event.conversation_id
    return [e.progress for e in progress]


async def test_a_30_second_silent_tool_keeps_a_stream_with_a_shorter_idle_timeout_alive(
    sidecar_factory: SidecarFactory,
) -> None:
    """The issue's case: a tool silent for 30 s, a reader that gives up after 10 s of silence
    (shorter than the turn, longer than the 2 s interval): it gets the whole turn."""
    sidecar = await sidecar_factory(config(2.0), env=pythonpath_env()).start()
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        call = stub.Chat(chat_request("slow-tool", "scripted:wait30", "r-30"), timeout=120)
        events = await read_all(call, idle_timeout=10.0)
    progress = check_keepalives(events, "r-30")
    end = events[-1].turn_end
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert end.message.parts[-1].text.text == "waited"
    assert progress, "no Progress during a 30 s tool"
    assert {p.phase for p in progress} == {TOOL}
    elapsed = [p.elapsed.ToTimedelta().total_seconds() for p in progress]
    assert elapsed == sorted(elapsed)  # the same silence, growing
    assert elapsed[-1] >= 2.0 * (len(elapsed) - 1)
    # Not stored: a replay from the start carries the turn events alone.
    async with TurnwireClient(sidecar.target, include_progress=True) as client:
        replayed = [e async for e in client.resume_turn("r-30")]
    assert replayed == turn_events(events)


async def test_every_blocking_stream_gets_progress_and_clients_skip_it_by_default(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(config(1.0), env=pythonpath_env()).start()
    async with (
        TurnwireClient(sidecar.target) as plain,
        TurnwireClient(sidecar.target, include_progress=True) as client,
    ):
        # A turn in a 4 s tool; a ResumeTurn joining it; a Chat and a submission queued behind it.
        tool_stream = client.chat("c", "go", request_id="r-tool")
        first = await anext(tool_stream)
        assert first.HasField("turn_start")
        running = asyncio.ensure_future(collect_events(tool_stream))
        resumed = asyncio.ensure_future(collect_events(client.resume_turn("r-tool", 1)))
        queued = asyncio.ensure_future(collect_events(client.chat("c", "next", request_id="r-queued")))
        submitted = await client.submit_messages("c", "later", submission_id="s-queued")
        assert submitted.accepted
        watched = asyncio.ensure_future(collect_events(client.watch_submission("s-queued")))
        # The default client: the same kind of turn without a Progress, and collect() with one.
        default = [e async for e in plain.chat("d", "go", request_id="r-plain")]
        collected = await collect(client.chat("e", "go", request_id="r-collected"))

        tool_events = [first, *await running]
        assert {p.phase for p in check_keepalives(tool_events, "r-tool")} == {TOOL}
        resumed_events = await resumed
        assert resumed_events[0].sequence_number == 2
        assert {p.phase for p in check_keepalives(resumed_events, "r-tool")} == {TOOL}
        queued_events = await queued
        queued_progress = check_keepalives(queued_events, "r-queued")
        assert queued_progress[0].phase == QUEUED  # before its TurnStart, behind r-tool
        assert queued_events[0].HasField("progress")
        watched_events = await watched
        assert QUEUED in {p.phase for p in check_keepalives(watched_events, "s-queued")}
        assert turn_events(watched_events)[0].HasField("turn_start")

    assert default[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert not any(e.HasField("progress") for e in default)
    assert len({e.sequence_number for e in default}) == len(default)
    assert collected.status_name == "COMPLETED"


async def test_a_busy_stream_and_a_disabled_interval_send_no_progress(
    sidecar_factory: SidecarFactory,
) -> None:
    busy_server = await sidecar_factory(config(3.0), env=pythonpath_env()).start()
    async with TurnwireClient(busy_server.target, include_progress=True) as client:
        busy = [e async for e in client.chat("b", "go", model="scripted:busy")]
    assert await busy_server.terminate() == 0
    off_server = await sidecar_factory(config(0.0), env=pythonpath_env()).start()  # the same store
    assert busy[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert not [e for e in busy if e.HasField("progress")]
    async with TurnwireClient(off_server.target, include_progress=True) as client:
        silent = [e async for e in client.chat("o", "go")]
    assert silent[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert any(e.HasField("tool_output_available") for e in silent)
    assert not [e for e in silent if e.HasField("progress")]


async def collect_events(stream: object) -> list[event_pb2.TurnEvent]:
    return [e async for e in stream]  # type: ignore[attr-defined]


async def test_hanging_up_after_a_progress_ends_the_call_like_any_other_hang_up(
    sidecar_factory: SidecarFactory,
) -> None:
    """A caller that leaves a Chat after a Progress cancels its turn (disconnect policy CANCEL);
    one that leaves a ResumeTurn after a Progress leaves the turn running."""
    sidecar = await sidecar_factory(config(1.0), env=pythonpath_env()).start()
    async with TurnwireClient(sidecar.target, include_progress=True) as client:
        async with client.chat("h1", "go", request_id="r-hang") as stream:
            async for event in stream:
                if event.HasField("progress"):
                    break  # leaves the stream: cancels the call
        cancelled = await collect(client.resume_turn("r-hang"))
        assert cancelled.status_name == "ABORTED"

        kept = client.chat("h2", "go", request_id="r-kept")
        assert (await anext(kept)).HasField("turn_start")
        async with client.resume_turn("r-kept", 1) as watcher:
            async for event in watcher:
                if event.HasField("progress"):
                    break
        events = [e async for e in kept]
    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert any(e.HasField("progress") for e in events)
