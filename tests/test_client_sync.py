"""The synchronous client and the plain-value results, against a real ``turnwire serve``.

Every RPC through :class:`SyncTurnwireClient`; tool inputs and outputs as exact Python values
(integers past 2**53 included) both ways; errors with their details; cancellation by leaving
the iteration, by ``stream.cancel()`` and by ``cancel_chat``.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from support.endless import endless_step, is_prefix_of_repeats
from support.hooks import pythonpath_env
from support.sidecar import SidecarProcess, running_sidecar
from support.waiting import wait_until

from turnwire_client import ChatMessage, SyncTurnwireClient, TurnwireError, Usage
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

pytestmark = pytest.mark.e2e

BIG = 2**64 + 1  # past 2**53: a double cannot hold it
ENDLESS = "".join(f"w{i} " for i in range(100))
SCRIPTS = {
    # The default demo model answers the weather with its get_weather tool; these add:
    "big-input": [
        {"tool_calls": [{"name": "lookup", "input": {"n": BIG, "ratio": 0.1, "tags": ["a", None]}}]}
    ],
    # Never ends on its own: only the cancel a test makes ends it.
    "long": [endless_step(ENDLESS, 50)],
    "echo": [{"text": "answered"}],
    "wait": [{"tool_calls": [{"name": "wait", "input": {"seconds": 2}}]}, {"text": "waited"}],
}
LOOKUP = {"name": "lookup", "description": "look it up", "input_schema": {"type": "object"}}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    config = {
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "tools": {"require_approval": ["get_current_time"], "python": ["support.durable_tools:wait"]},
        "limits": {"progress_interval_seconds": 0.5},
    }
    with running_sidecar(tmp_path_factory.mktemp("client-sync"), config, env=pythonpath_env()) as process:
        yield process


@pytest.fixture
def client(sidecar: SidecarProcess) -> Iterator[SyncTurnwireClient]:
    with SyncTurnwireClient(sidecar.target) as opened:
        yield opened


def _aborted_reply(client: SyncTurnwireClient, conversation_id: str) -> str | None:
    """The stored reply's text once its turn ended ABORTED; None before."""
    conversation = client.get_conversation(conversation_id)
    if [reply.status for reply in conversation.partial_replies] != [event_pb2.TURN_STATUS_ABORTED]:
        return None
    reply = ChatMessage.from_proto(conversation.messages[-1])
    assert reply.role == "assistant"
    return reply.text


def test_a_chat_with_a_tool_in_plain_values(client: SyncTurnwireClient) -> None:
    result = client.chat("sync-weather", "What's the weather in Paris?").collect()
    assert result.ok, result.error
    (call,) = result.tool_calls
    assert (call.tool_name, call.state, call.input) == ("get_weather", "output-available", {"city": "Paris"})
    assert isinstance(call.output, dict) and call.output["city"] == "Paris"
    assert isinstance(call.output["temperature_c"], int | float)
    # Two model steps: the call, then the answer; text per step and joined by a blank line.
    assert len(result.steps) == 2 and result.steps[0].tool_calls == [call]
    assert result.text == "\n\n".join(s.text.strip() for s in result.steps if s.text.strip())
    assert "Paris" in result.steps[1].text
    assert isinstance(result.usage, Usage) and result.usage.total_tokens > 0
    assert type(result.usage.total_tokens) is int

    stored = [ChatMessage.from_proto(m) for m in client.get_conversation("sync-weather").messages]
    assert [m.role for m in stored] == ["user", "assistant"]
    assert stored[0].text == "What's the weather in Paris?"
    assert stored[1] == result.reply and stored[1].tool_calls == [call]
    assert stored[1].create_time is not None and stored[1].create_time.tzinfo is not None


def test_big_integers_stay_exact_both_ways(client: SyncTurnwireClient) -> None:
    pending = client.chat("sync-big", "look", model="scripted:big-input", client_tools=[LOOKUP]).collect()
    (call,) = pending.tool_calls
    assert call.state == "input-available" and call.client_executed
    assert call.input == {"n": BIG, "ratio": 0.1, "tags": ["a", None]}
    assert type(call.input["n"]) is int

    output = {"big": -(2**70), "items": [1, 2.5, None, True, "x"], "nested": {"n": 2**63}}
    answered = client.submit_tool_results(
        "sync-big", {call.tool_call_id: output}, auto_continue=False
    ).collect()
    assert answered.status_name == "SKIPPED"
    stored = ChatMessage.from_proto(client.get_conversation("sync-big").messages[-1])
    (done,) = stored.tool_calls
    assert (done.state, done.output) == ("output-available", output)
    assert type(done.output["big"]) is int and type(done.output["items"][0]) is int


def test_every_rpc(client: SyncTurnwireClient) -> None:
    conversation = "sync-every"
    first = client.chat(conversation, "hi", model="scripted:echo", request_id="sync-every-1").collect()
    assert (first.ok, first.request_id, first.text) == (True, "sync-every-1", "answered")
    saved = client.save_messages(conversation, "again", model="scripted:echo").collect()
    assert saved.text == "answered"
    continued = client.continue_last_turn(conversation, model="scripted:echo").collect()
    assert continued.ok
    resumed = client.resume_turn("sync-every-1").collect()
    assert resumed.request_id == "sync-every-1" and resumed.text == "answered"
    assert client.cancel_chat("sync-every-1") is False  # finished already

    page = client.get_conversation_page(conversation, page_size=1)
    assert len(page.conversation.messages) == 1 and page.next_page_token
    rest = client.get_conversation_page(conversation, page_token=page.next_page_token)
    everything = client.get_conversation(conversation)
    assert list(page.conversation.messages) + list(rest.conversation.messages) == list(everything.messages)
    listed = client.list_conversations(page_size=1000)
    assert conversation in [c.conversation_id for c in listed.conversations]

    note = message_pb2.Message(
        id="note-1",
        role=message_pb2.ROLE_SYSTEM,
        parts=[message_pb2.Part(text=message_pb2.TextPart(text="n"))],
    )
    added = client.add_messages(conversation, [note])
    assert added.added_count == 1
    assert client.add_messages(conversation, [note], upsert=True).unchanged_count == 1

    submitted = client.submit_messages(
        conversation, "later", submission_id="sync-sub-1", model="scripted:echo"
    )
    assert submitted.accepted and submitted.submission.submission_id == "sync-sub-1"
    watched = client.watch_submission("sync-sub-1").collect()
    assert watched.ok and watched.text == "answered"
    assert client.get_submission("sync-sub-1").state == chat_service_pb2.SUBMISSION_STATE_COMPLETED
    listing = client.list_submissions(conversation_id=conversation)
    assert [s.submission_id for s in listing.submissions] == ["sync-sub-1"]
    assert client.cancel_submission("sync-sub-1").state == chat_service_pb2.SUBMISSION_STATE_COMPLETED

    assert client.delete_conversation(conversation) is True
    assert client.delete_conversation(conversation, allow_missing=True) is False


def test_approvals_through_the_sync_client(client: SyncTurnwireClient) -> None:
    waiting = client.chat("sync-approve", "What time is it?").collect()
    (call,) = waiting.tool_calls
    assert call.state == "approval-requested" and call.approval_id and call.approved is None
    approved = client.submit_tool_approvals("sync-approve", {call.tool_call_id: True}).collect()
    assert approved.ok, approved.error
    stored = [ChatMessage.from_proto(m) for m in client.get_conversation("sync-approve").messages]
    (done,) = [c for m in stored for c in m.tool_calls if c.tool_call_id == call.tool_call_id]
    assert (done.state, done.approved) == ("output-available", True)
    assert set(done.output) >= {"iso", "timezone"}


def test_errors_carry_their_details(client: SyncTurnwireClient) -> None:
    with pytest.raises(TurnwireError) as missing:
        client.get_conversation("sync-no-such-conversation")
    assert missing.value.code == grpc.StatusCode.NOT_FOUND
    assert (missing.value.reason, missing.value.domain) == ("CONVERSATION_NOT_FOUND", "turnwire.dev")
    assert missing.value.retry_delay is None

    stream = client.chat("", "hi")
    with pytest.raises(TurnwireError) as invalid:
        stream.collect()
    assert invalid.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [field for field, _ in invalid.value.field_violations] == ["conversation_id"]

    with pytest.raises(TypeError, match="unknown option"):
        client.chat("sync-typo", "hi", modle="scripted:echo")  # type: ignore[call-arg]


def test_unreachable_sidecar_raises_unavailable() -> None:
    with SyncTurnwireClient("127.0.0.1:1") as client, pytest.raises(TurnwireError) as raised:
        client.list_conversations(timeout=5)
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE and raised.value.reason == ""


async def test_leaving_the_iteration_cancels_the_turn(client: SyncTurnwireClient) -> None:
    with client.chat("sync-break", "go", model="scripted:long") as stream:
        for event in stream:
            if event.WhichOneof("event") == "text_delta":
                break
    text = await wait_until(
        lambda: _aborted_reply(client, "sync-break"), timeout=10, what="the turn ended ABORTED"
    )
    assert text and is_prefix_of_repeats(text, ENDLESS), text


async def test_an_explicit_cancel_ends_the_stream_and_the_turn(client: SyncTurnwireClient) -> None:
    stream = client.chat("sync-cancel", "go", model="scripted:long")
    for event in stream:
        if event.WhichOneof("event") == "text_delta":
            assert stream.cancel() is True
            break
    assert stream.cancel() is False  # already ended
    text = await wait_until(
        lambda: _aborted_reply(client, "sync-cancel"), timeout=10, what="the turn ended ABORTED"
    )
    assert text and is_prefix_of_repeats(text, ENDLESS), text


def test_cancel_chat_aborts_a_running_turn_by_request_id(client: SyncTurnwireClient) -> None:
    events = []
    cancelled = None
    for event in client.chat("sync-cancel-chat", "go", model="scripted:long", request_id="sync-long-1"):
        events.append(event)
        if event.WhichOneof("event") == "text_delta" and cancelled is None:
            cancelled = client.cancel_chat("sync-long-1")
    assert cancelled is True
    end = events[-1].turn_end
    assert end.status == event_pb2.TURN_STATUS_ABORTED
    text = ChatMessage.from_proto(end.message).text
    assert text and is_prefix_of_repeats(text, ENDLESS), text


def test_progress_keepalives_only_when_asked_for(sidecar: SidecarProcess, client: SyncTurnwireClient) -> None:
    """A 2 s silent tool on a 0.5 s progress interval: the stream carries Progress events, which
    the default client skips and ``include_progress=True`` yields (sequence number 0);
    ``collect()`` folds a stream with them."""
    with SyncTurnwireClient(sidecar.target, include_progress=True) as seeing:
        events = list(seeing.chat("sync-progress", "go", model="scripted:wait"))
        collected = seeing.chat("sync-progress", "once more", model="scripted:wait").collect()
    progress = [e for e in events if e.HasField("progress")]
    assert progress and all(e.sequence_number == 0 for e in progress)
    assert {e.progress.phase for e in progress} == {event_pb2.PROGRESS_PHASE_TOOL}
    assert collected.ok and collected.text == "waited"
    plain = list(client.chat("sync-progress", "again", model="scripted:wait"))
    assert not any(e.HasField("progress") for e in plain)
    assert plain[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
