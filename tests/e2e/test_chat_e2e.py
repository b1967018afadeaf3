"""Chat turns end to end: a real ``turnwire serve`` process, the Python client, SQLite.

Most tests share one sidecar (each on its own conversation); the pagination
test runs its own so it sees exactly the conversations it made.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2
from support.endless import endless_step, is_prefix_of_repeats
from support.sidecar import SidecarFactory, SidecarProcess, running_sidecar

from turnwire_client import TurnResult, TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2, message_pb2

SLOW_TEXT = "".join(f"word{i} " for i in range(20))

CONFIG = {
    "providers": {
        "scripted": {
            "scripts": {
                "two-calcs": [
                    {
                        "text": "Computing both.",
                        "tool_calls": [
                            {"name": "calculator", "input": {"expression": "2 + 3"}},
                            {"name": "calculator", "input": {"expression": "6 * 7"}},
                        ],
                        "usage": {"input_tokens": 10, "output_tokens": 5},
                    },
                    {
                        "text": "The results are 5 and 42.",
                        "usage": {"input_tokens": 20, "output_tokens": 7, "reasoning_tokens": 0},
                    },
                ],
                # 40 ms before each chunk, never ending on its own: the test cancels it.
                "slow": [endless_step(SLOW_TEXT, 40)],
                # Streams 6 short chunks (about 1.2 s): the second turn is sent once the first
                # has started, and arrives well before it ends, even on a loaded machine.
                "paced": [{"text": "one two three four five", "delay_ms": 200}],
                # Text start and two deltas, then the provider fails as overloaded.
                "overloaded": [
                    {
                        "text": "alpha beta gamma delta epsilon",
                        "error": {
                            "message": "the model is overloaded",
                            "status": 529,
                            "type": "overloaded_error",
                            "retryable": True,
                            "after_chunks": 3,
                        },
                    }
                ],
                # Fails before any output: nothing of the assistant is stored.
                "fails-at-once": [{"error": {"message": "bad gateway", "status": 502, "after_chunks": 0}}],
            }
        }
    }
}

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """A conversation or request id unique within the shared sidecar."""
    return f"{prefix}-{next(_ids)}"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("chat-e2e"), CONFIG) as process:
        yield process


def kinds(result: TurnResult) -> list[str]:
    """Event kinds in order."""
    return [str(event.WhichOneof("event")) for event in result.events]


def squeezed_kinds(result: TurnResult) -> list[str]:
    """Event kinds with each run of consecutive text deltas shown once as ``text_delta+``."""
    out: list[str] = []
    for kind, run in itertools.groupby(kinds(result)):
        if kind == "text_delta":
            out.append("text_delta+")
        else:
            out.extend(run)
    return out


def text_of(message: message_pb2.Message) -> str:
    return "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")


def streamed_text(events: list[event_pb2.TurnEvent]) -> str:
    return "".join(e.text_delta.delta for e in events if e.WhichOneof("event") == "text_delta")


def error_info(status: status_pb2.Status) -> error_details_pb2.ErrorInfo:
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info
    raise AssertionError(f"no google.rpc.ErrorInfo in {status}")


def turn_start(result: TurnResult) -> event_pb2.TurnStart:
    first = result.events[0]
    assert first.WhichOneof("event") == "turn_start", kinds(result)
    return first.turn_start


async def test_tool_call_turn_streams_every_event_and_stores_the_transcript(
    sidecar: SidecarProcess,
) -> None:
    conversation = new_id("weather")
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "What's the weather in Paris?"))

        assert squeezed_kinds(result) == [
            "turn_start",
            "step_start",
            "text_start",
            "text_delta+",
            "text_end",
            "tool_input_start",
            "tool_input_delta",
            "tool_input_available",
            "tool_output_available",
            "step_finish",
            "step_start",
            "text_start",
            "text_delta+",
            "text_end",
            "step_finish",
            "turn_end",
        ]
        assert [e.sequence_number for e in result.events] == list(range(1, len(result.events) + 1))
        assert {(e.conversation_id, e.request_id) for e in result.events} == {
            (conversation, result.request_id)
        }
        assert result.request_id, "the server assigns a request id"
        assert result.status == event_pb2.TURN_STATUS_COMPLETED
        assert result.error is None
        assert result.step_count == 2
        start = turn_start(result)
        assert start.model == "scripted:demo"
        assert not start.continuation

        steps = [e.step_start.step_number for e in result.events if e.HasField("step_start")]
        assert steps == [0, 1]
        finishes = [e.step_finish for e in result.events if e.HasField("step_finish")]
        assert [f.finish_reason for f in finishes] == [
            event_pb2.FINISH_REASON_TOOL_CALLS,
            event_pb2.FINISH_REASON_STOP,
        ]

        # The tool call as streamed ...
        available = next(e.tool_input_available for e in result.events if e.HasField("tool_input_available"))
        assert available.tool_name == "get_weather"
        assert json_format.MessageToDict(available.input) == {"city": "Paris"}
        output_event = next(
            e.tool_output_available for e in result.events if e.HasField("tool_output_available")
        )
        assert output_event.tool_call_id == available.tool_call_id
        assert not output_event.preliminary

        # ... and as the TurnEnd message holds it.
        message = result.message
        assert message is not None
        assert message.id == start.message_id
        assert message.role == message_pb2.ROLE_ASSISTANT
        assert [p.WhichOneof("kind") for p in message.parts] == [
            "step_start",
            "text",
            "tool_call",
            "step_start",
            "text",
        ]
        (call,) = result.tool_calls
        assert call.tool_call_id == available.tool_call_id
        assert call.tool_name == "get_weather"
        assert call.state == "output-available"
        assert call.input == {"city": "Paris"}
        assert call.output["city"] == "Paris"
        assert call.output == json.loads(output_event.output_json)
        assert "Paris" in message.parts[-1].text.text
        # Each text block's deltas add up to the stored text of that block.
        assert streamed_text(result.events) == text_of(message)

        stored = await client.get_conversation(conversation)
    assert stored.conversation_id == conversation
    assert stored.message_count == 2
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    user, assistant = stored.messages
    assert text_of(user) == "What's the weather in Paris?"
    assert user.id and user.HasField("create_time")
    assert assistant == message


async def test_parallel_tool_calls_run_and_usage_is_summed(sidecar: SidecarProcess) -> None:
    conversation = new_id("calcs")
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "compute", model="scripted:two-calcs"))
        stored = await client.get_conversation(conversation)

    assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
    assert turn_start(result).model == "scripted:two-calcs"
    assert result.step_count == 2
    assert squeezed_kinds(result) == [
        "turn_start",
        "step_start",
        "text_start",
        "text_delta+",
        "text_end",
        "tool_input_start",
        "tool_input_delta",
        "tool_input_available",
        "tool_input_start",
        "tool_input_delta",
        "tool_input_available",
        "tool_output_available",
        "tool_output_available",
        "step_finish",
        "step_start",
        "text_start",
        "text_delta+",
        "text_end",
        "step_finish",
        "turn_end",
    ]
    # Results arrive in completion order; each belongs to one call.
    outputs = {
        e.tool_output_available.tool_call_id: json_format.MessageToDict(e.tool_output_available.output)
        for e in result.events
        if e.HasField("tool_output_available")
    }
    calls = result.tool_calls
    assert len(calls) == 2
    assert len({c.tool_call_id for c in calls}) == 2
    # The stored message keeps emission order.
    assert [(c.input or {}).get("expression") for c in calls] == ["2 + 3", "6 * 7"]
    assert [c.output["result"] for c in calls] == [5, 42]
    assert all(c.state == "output-available" for c in calls)
    assert {k: v["result"] for k, v in outputs.items()} == {
        calls[0].tool_call_id: 5,
        calls[1].tool_call_id: 42,
    }
    assert result.text == "Computing both.\n\nThe results are 5 and 42."
    assert [step.text for step in result.steps] == ["Computing both.", "The results are 5 and 42."]

    step_usages = [e.step_finish.usage for e in result.events if e.HasField("step_finish")]
    assert [(u.input_tokens, u.output_tokens, u.total_tokens) for u in step_usages] == [
        (10, 5, 15),
        (20, 7, 27),
    ]
    assert (result.usage.input_tokens, result.usage.output_tokens, result.usage.total_tokens) == (
        30,
        12,
        42,
    )
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert stored.messages[1] == result.message


async def test_list_conversations_paginates_most_recent_first(
    sidecar_factory: SidecarFactory,
) -> None:
    fresh = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(fresh.target) as client:
        for conversation in ("conv-a", "conv-b", "conv-c"):
            result = await collect(client.chat(conversation, "hello"))
            assert result.ok, result.error

        first = await client.list_conversations(page_size=2)
        assert [c.conversation_id for c in first.conversations] == ["conv-c", "conv-b"]
        assert first.next_page_token
        second = await client.list_conversations(page_size=2, page_token=first.next_page_token)
        assert [c.conversation_id for c in second.conversations] == ["conv-a"]
        assert second.next_page_token == ""
        for listed in [*first.conversations, *second.conversations]:
            assert listed.message_count == 2
            assert not listed.messages, "ListConversations leaves messages out"
            assert listed.update_time.ToDatetime() >= listed.create_time.ToDatetime()

        # A new message moves a conversation to the front.
        assert (await collect(client.chat("conv-a", "again"))).ok
        everything = await client.list_conversations()
        assert [c.conversation_id for c in everything.conversations] == ["conv-a", "conv-c", "conv-b"]
        assert everything.conversations[0].message_count == 4
        assert everything.next_page_token == ""


async def test_cancel_chat_of_an_unknown_request_is_a_no_op(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        assert await client.cancel_chat("no-such-request") is False


async def test_cancel_chat_mid_turn_aborts_and_stores_the_partial_reply(
    sidecar: SidecarProcess,
) -> None:
    conversation = new_id("cancel")
    request_id = new_id("req-cancel")
    events: list[event_pb2.TurnEvent] = []
    cancelled: list[bool] = []
    async with TurnwireClient(sidecar.target) as client:

        async def stream() -> None:
            async for event in client.chat(
                conversation, "talk slowly", model="scripted:slow", request_id=request_id
            ):
                events.append(event)
                if event.HasField("text_delta") and not cancelled:
                    cancelled.append(await client.cancel_chat(request_id))

        await asyncio.wait_for(stream(), timeout=10)
        assert cancelled == [True]
        end = events[-1]
        assert end.HasField("turn_end"), [e.WhichOneof("event") for e in events]
        assert end.turn_end.status == event_pb2.TURN_STATUS_ABORTED
        assert [e.sequence_number for e in events] == list(range(1, len(events) + 1))
        delivered = streamed_text(events)
        assert delivered, "at least one delta arrived before the cancel"

        stored = await client.get_conversation(conversation)
        # Finished turns cannot be cancelled again.
        assert await client.cancel_chat(request_id) is False

    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    partial = stored.messages[1]
    assert text_of(partial) == delivered
    assert is_prefix_of_repeats(text_of(partial), SLOW_TEXT)
    assert end.turn_end.message == partial


async def test_provider_error_mid_stream_ends_the_turn_with_error_and_keeps_the_partial(
    sidecar: SidecarProcess,
) -> None:
    conversation = new_id("provider-error")
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "hi", model="scripted:overloaded"))
        stored = await client.get_conversation(conversation)

    assert result.status == event_pb2.TURN_STATUS_ERROR
    assert result.error is not None
    assert result.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert "overloaded" in result.error.message
    info = error_info(result.error)
    assert info.domain == "turnwire.dev"
    assert info.reason == "PROVIDER_ERROR"
    assert info.metadata["http_status"] == "529"
    error = TurnwireError.from_status(result.error)
    assert error.code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(TurnwireError) as raised:
        result.raise_for_error()
    assert raised.value.reason == "PROVIDER_ERROR"

    # The text streamed before the failure is the partial reply, stored.
    delivered = streamed_text(result.events)
    assert delivered == "alpha beta "
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert text_of(stored.messages[1]) == delivered
    assert result.message == stored.messages[1]


async def test_concurrent_chats_on_one_conversation_are_serialized(sidecar: SidecarProcess) -> None:
    conversation = new_id("serialized")
    async with TurnwireClient(sidecar.target) as client:
        # The second is sent once the first runs: it must wait for the first to end.
        first = client.chat(conversation, "first question", model="scripted:paced")
        started = await asyncio.wait_for(anext(first), timeout=10)
        second = asyncio.ensure_future(
            collect(client.chat(conversation, "second question", model="scripted:paced"))
        )
        first_rest = await asyncio.wait_for(collect(first), timeout=10)
        second_result = await asyncio.wait_for(second, timeout=10)
        stored = await client.get_conversation(conversation)

    assert [first_rest.status, second_result.status] == [event_pb2.TURN_STATUS_COMPLETED] * 2
    assert started.HasField("turn_start")
    reply_of = {
        "first question": started.turn_start.message_id,
        "second question": turn_start(second_result).message_id,
    }
    roles = [m.role for m in stored.messages]
    assert roles == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
    ], [(m.role, text_of(m)) for m in stored.messages]
    for user, assistant in (stored.messages[0:2], stored.messages[2:4]):
        assert assistant.id == reply_of[text_of(user)], "each reply follows its own question"
        assert text_of(assistant) == "one two three four five"


async def test_continue_last_turn_skips_after_a_user_message_and_stores_nothing(
    sidecar: SidecarProcess,
) -> None:
    conversation = new_id("continue-skip")
    async with TurnwireClient(sidecar.target) as client:
        failed = await collect(client.chat(conversation, "hello", model="scripted:fails-at-once"))
        assert failed.status == event_pb2.TURN_STATUS_ERROR
        before = await client.get_conversation(conversation)
        assert [m.role for m in before.messages] == [message_pb2.ROLE_USER]

        skipped = await collect(client.continue_last_turn(conversation))
        after = await client.get_conversation(conversation)

    assert skipped.status == event_pb2.TURN_STATUS_SKIPPED
    assert skipped.message is None
    assert skipped.step_count == 0
    assert not {"step_start", "text_delta", "step_finish"} & set(kinds(skipped))
    assert after == before


async def test_continue_last_turn_after_a_reply_stores_a_new_assistant_message(
    sidecar: SidecarProcess,
) -> None:
    conversation = new_id("continue")
    async with TurnwireClient(sidecar.target) as client:
        first = await collect(client.chat(conversation, "hello"))
        assert first.ok, first.error
        continued = await collect(client.continue_last_turn(conversation))
        stored = await client.get_conversation(conversation)

    assert continued.status == event_pb2.TURN_STATUS_COMPLETED, continued.error
    assert turn_start(continued).continuation is True
    assert continued.message is not None and first.message is not None
    assert continued.message.id != first.message.id
    assert text_of(continued.message)
    assert [m.role for m in stored.messages] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
        message_pb2.ROLE_ASSISTANT,
    ]
    assert stored.messages[1] == first.message, "the earlier reply is not appended to"
    assert stored.messages[2] == continued.message
    assert stored.message_count == 3
