"""Event batches (docs/semantics.md §10, "Event batches") against a real ``turnwire serve``: a
caller that sends ``turnwire-event-batches: 1`` gets the events that were ready at once in one
message (``more_events``), the same events in the same order as a caller without it, which gets
one event a message; the Python client reads both."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import grpc
import pytest
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client import TurnwireClient, collect
from turnwire_client.metadata import EVENT_BATCHES_METADATA
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2

# The scripted model sends a step's chunks without pausing: its events are ready at once.
CONFIG = {
    "default_model": "scripted:burst",
    "providers": {
        "scripted": {
            "scripts": {
                "burst": [
                    {
                        "text": "Let me add that up for you.",
                        "chunk_size": 3,
                        "tool_calls": [
                            {"name": "calculator", "input": {"expression": "2 + 3"}},
                            {"name": "calculator", "input": {"expression": "4 * 5"}},
                        ],
                    },
                    {"text": "It is 5 and 20.", "chunk_size": 2},
                ]
            }
        }
    },
}
BATCHES = ((EVENT_BATCHES_METADATA, "1"),)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("event-batches"), CONFIG) as process:
        yield process


@pytest.fixture
async def stub(sidecar: SidecarProcess) -> AsyncIterator[chat_service_pb2_grpc.ChatServiceStub]:
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        yield chat_service_pb2_grpc.ChatServiceStub(channel)


async def chat(
    stub: chat_service_pb2_grpc.ChatServiceStub,
    conversation_id: str,
    metadata: Sequence[tuple[str, str]] = (),
) -> list[chat_service_pb2.ChatResponse]:
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "What are 2 + 3 and 4 * 5?"
    request = chat_service_pb2.ChatRequest(conversation_id=conversation_id, message=message)
    return [response async for response in stub.Chat(request, metadata=metadata)]


def events(responses: Sequence[chat_service_pb2.ChatResponse]) -> list[event_pb2.TurnEvent]:
    return [event for response in responses for event in (response.event, *response.more_events)]


def shape(event: event_pb2.TurnEvent) -> tuple[str, int]:
    """What a turn's event is, without its ids and times (they differ between two turns)."""
    return event.WhichOneof("event") or "", event.sequence_number


async def test_a_caller_that_asks_gets_the_same_events_in_fewer_messages(
    stub: chat_service_pb2_grpc.ChatServiceStub,
) -> None:
    one_by_one = await chat(stub, "batches-off")
    batched = await chat(stub, "batches-on", BATCHES)

    assert not any(response.more_events for response in one_by_one)
    assert any(response.more_events for response in batched), [len(r.more_events) for r in batched]
    assert len(batched) < len(one_by_one)
    # The same events, in the same order, numbered without a gap; TurnStart first, TurnEnd last.
    flat = events(batched)
    assert [shape(e) for e in flat] == [shape(e) for e in events(one_by_one)]
    assert [e.sequence_number for e in flat] == list(range(1, len(flat) + 1))
    assert batched[0].event.HasField("turn_start")
    assert flat[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert all(e.request_id == flat[0].request_id for e in flat)


async def test_the_python_client_reads_batches(
    sidecar: SidecarProcess, stub: chat_service_pb2_grpc.ChatServiceStub
) -> None:
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("batches-client", "What are 2 + 3 and 4 * 5?"))
    assert result.ok, result.error
    assert result.text.endswith("It is 5 and 20.")
    assert [call.output["result"] for call in result.tool_calls] == [5, 20]
    reference = events(await chat(stub, "batches-reference"))
    assert [shape(e) for e in result.events] == [shape(e) for e in reference]


async def test_a_resumed_turn_replays_every_event_once(stub: chat_service_pb2_grpc.ChatServiceStub) -> None:
    """ResumeTurn gives the stored stream as the turn's own call saw it: one event a message
    without the header, the events read together in fewer messages with it; from the start and
    from the middle."""
    turn = events(await chat(stub, "batches-resumed", BATCHES))
    request_id = turn[0].request_id
    for after in (0, 5):
        messages = {}
        for metadata in ((), BATCHES):
            request = chat_service_pb2.ResumeTurnRequest(request_id=request_id, after_sequence_number=after)
            responses = [r async for r in stub.ResumeTurn(request, metadata=metadata)]
            assert [shape(e) for e in events(responses)] == [shape(e) for e in turn[after:]]
            messages[bool(metadata)] = len(responses)
        assert messages[False] == len(turn) - after, "one event a message without the header"
        assert messages[True] < messages[False], "fewer messages with it"


async def test_a_watched_submission_gets_its_events_in_batches(
    stub: chat_service_pb2_grpc.ChatServiceStub,
) -> None:
    """WatchSubmission of a submitted turn, once ended (stored) and attached while it runs."""
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "What are 2 + 3 and 4 * 5?"
    submitted = await stub.SubmitMessages(
        chat_service_pb2.SubmitMessagesRequest(conversation_id="batches-watched", messages=[message])
    )
    watch = chat_service_pb2.WatchSubmissionRequest(submission_id=submitted.submission.submission_id)
    live = [r async for r in stub.WatchSubmission(watch, metadata=BATCHES)]
    again = [r async for r in stub.WatchSubmission(watch, metadata=BATCHES)]
    one_by_one = [r async for r in stub.WatchSubmission(watch)]
    reference = [shape(e) for e in events(one_by_one)]
    assert reference[0] == ("turn_start", 1) and reference[-1][0] == "turn_end"
    assert [shape(e) for e in events(live)] == reference
    assert [shape(e) for e in events(again)] == reference
    assert len(again) < len(one_by_one) == len(reference)


def test_the_header_is_named_in_the_docs() -> None:
    semantics = (Path(__file__).resolve().parents[2] / "docs" / "semantics.md").read_text()
    assert f"`{EVENT_BATCHES_METADATA}: 1`" in semantics
