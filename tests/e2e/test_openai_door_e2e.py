"""The OpenAI-compatible door (docs/api/openai.md): Responses and Chat Completions, driven by the official
``openai`` Python SDK, unmodified, against a real ``turnwire serve`` with ``http.listen`` and
``auth:`` on: ``responses.create`` streamed and not, ``responses.stream``, resuming with
``starting_after``, a client tool round trip with ``function_call_output``, the server tool loop,
``previous_response_id``, background responses, cancel, tenants, errors, and a turn started
over gRPC read over this door; ``chat.completions.create`` with the sidecar's tool loop, with client
tools, streamed with usage, and with a named conversation; and the same through the ``openai`` npm SDK
(6.x, the newest major that runs on Node.js 20). Every streamed Responses event is checked
against the SDK's own event types.

Before issue 36 the listener had no ``/v1`` routes: every test here fails with a 404.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolParam
from openai.types.responses import FunctionToolParam, Response, ResponseStreamEvent
from pydantic import TypeAdapter
from support.endless import endless_step
from support.hooks import pythonpath_env
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarFactory, SidecarProcess, running_sidecar
from support.tokens import new_token
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError
from turnwire_client.v1 import message_pb2

TOKEN_A = new_token()
TOKEN_B = new_token()
NODE_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "openai_node.mjs"
AI_SDK_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "ai_sdk_openai_node.mjs"
EVENT = TypeAdapter(ResponseStreamEvent)
LOCATION_TOOL: FunctionToolParam = {
    "type": "function",
    "name": "get_location",
    "description": "The user's location, from their device",
    "parameters": {"type": "object", "properties": {"precision": {"type": "string"}}},
    "strict": False,
}

SCRIPTS = {
    "echo": [
        {
            "reasoning": "The user greets me.",
            "text": "answered over the OpenAI door",
            "chunk_size": 6,
            "usage": {"input_tokens": 7, "output_tokens": 5, "reasoning_tokens": 2},
        }
    ],
    "locate": [
        {
            "text": "Let me ask your device.",
            "tool_calls": [{"name": "get_location", "input": {"precision": "city"}}],
        },
        {"text": "unreachable"},
    ],
    "thanks": [{"text": "You are in Paris."}],
    "calculate": [
        {"tool_calls": [{"name": "calculator", "input": {"expression": "6 * 7"}}]},
        {"text": "It is 42."},
    ],
    "narrate": [
        {
            "text": "Let me calculate.",
            "tool_calls": [{"name": "calculator", "input": {"expression": "6 * 7"}}],
        },
        {"text": "It is 42."},
    ],
    "fails": [
        {"text": "partial ", "error": {"message": "the model is down", "status": 400, "after_chunks": 1}}
    ],
    "slow": [endless_step("".join(f"w{i} " for i in range(30)), 30)],
    "paced": [{"text": "one two three four five six", "chunk_size": 4, "delay_ms": 300}],
}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("openai-responses-e2e")
    tokens = {TOKEN_A: ("alice", "tenant-a"), TOKEN_B: ("bob", "tenant-b")}
    config = http_sidecar_config(workdir, tokens, SCRIPTS)
    config["middleware"] = [{"path": "support.hooks:ModelFromMetadata"}]
    with running_sidecar(workdir, config, env=pythonpath_env()) as process:
        yield process


def openai_client(sidecar: SidecarProcess, token: str = TOKEN_A) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{http_base(sidecar)}/v1", api_key=token, max_retries=0)


@pytest.fixture
async def client(sidecar: SidecarProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai_client(sidecar) as opened:
        yield opened


@pytest.fixture
async def grpc_a(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target, token=TOKEN_A) as opened:
        yield opened


def checked(event: Any) -> dict[str, Any]:
    """The event as sent, validated against the SDK's own event types (strict shapes)."""
    raw: dict[str, Any] = event.to_dict()
    EVENT.validate_python(raw)
    return raw


async def test_create_answers_a_stored_turn(client: openai.AsyncOpenAI, grpc_a: TurnwireClient) -> None:
    response = await client.responses.create(model="scripted:echo", input="hi", conversation="oa-plain")
    Response.model_validate(response.to_dict())
    assert response.status == "completed"
    assert response.output_text == "answered over the OpenAI door"
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (7, 5)
    assert response.usage.output_tokens_details.reasoning_tokens == 2
    assert response.conversation is not None and response.conversation.id == "oa-plain"
    stored = await grpc_a.get_conversation("oa-plain")
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]


async def test_create_streams_openai_events_numbered_without_gaps(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model="scripted:echo", input="hi", conversation="oa-stream", stream=True
    )
    events = [checked(event) async for event in stream]
    kinds = [event["type"] for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert "response.reasoning_text.delta" in kinds and "response.output_item.done" in kinds
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == "answered over the OpenAI door"
    assert events[-1]["response"]["usage"]["total_tokens"] == 12


async def test_the_stream_helper_gives_the_final_response(client: openai.AsyncOpenAI) -> None:
    async with client.responses.stream(model="scripted:echo", input="hi", conversation="oa-helper") as stream:
        deltas = [event.delta async for event in stream if event.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert "".join(deltas) == final.output_text == "answered over the OpenAI door"


async def test_resume_after_a_sequence_number(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model="scripted:echo", input="hi", conversation="oa-resume", stream=True
    )
    first = [checked(event) async for event in stream]
    response_id = first[0]["response"]["id"]
    resumed = await client.responses.retrieve(response_id, stream=True, starting_after=4)
    rest = [checked(event) async for event in resumed]

    def strip(event: dict[str, Any]) -> dict[str, Any]:  # a Response's timestamps differ
        return {key: value for key, value in event.items() if key != "response"}

    assert [strip(e) for e in rest] == [strip(e) for e in first[5:]]
    again = await client.responses.retrieve(response_id)
    assert again.status == "completed" and again.output_text == "answered over the OpenAI door"


async def test_a_client_tool_round_trip_with_function_call_output(
    client: openai.AsyncOpenAI, grpc_a: TurnwireClient
) -> None:
    first = await client.responses.create(
        model="scripted:locate", input="Where am I?", tools=[LOCATION_TOOL], conversation="oa-tools"
    )
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_location"
    assert json.loads(calls[0].arguments) == {"precision": "city"}
    second = await client.responses.create(
        model="scripted:thanks",
        previous_response_id=first.id,
        tools=[LOCATION_TOOL],
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"city": "Paris"}'}],
    )
    assert second.status == "completed" and second.output_text == "You are in Paris."
    assert second.conversation is not None and second.conversation.id == "oa-tools"
    stored = await grpc_a.get_conversation("oa-tools")
    call_part = next(p.tool_call for m in stored.messages for p in m.parts if p.HasField("tool_call"))
    assert json.loads(call_part.output_json) == {"city": "Paris"}
    assert call_part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE


async def test_the_sidecar_runs_its_own_tools_and_shows_them(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(
        model="scripted:calculate", input="6 * 7?", conversation="oa-calc"
    )
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_call", "message"], kinds  # a tool the server ran, with its output
    call = response.output[0].to_dict()
    assert (call["name"], call["server_label"], call["status"]) == ("calculator", "turnwire", "completed")
    assert "42" in str(call["output"]) and json.loads(str(call["arguments"])) == {"expression": "6 * 7"}
    assert response.output_text == "It is 42."


async def test_previous_response_id_of_an_older_response_continues_a_fork(
    client: openai.AsyncOpenAI, grpc_a: TurnwireClient
) -> None:
    first = await client.responses.create(input="one", conversation="oa-branch")
    second = await client.responses.create(input="two", previous_response_id=first.id)
    assert second.conversation is not None and second.conversation.id == "oa-branch"
    # An older response: a branch, on a fork made at it (docs/forks.md); the original stays.
    third = await client.responses.create(input="three", previous_response_id=first.id)
    assert third.status == "completed"
    assert third.conversation is not None and third.conversation.id.startswith("conv-")
    branch = await grpc_a.get_conversation(third.conversation.id)
    assert branch.forked_from.conversation_id == "oa-branch"
    assert [m.parts[0].text.text for m in branch.messages][::2] == ["one", "three"]
    original = await grpc_a.get_conversation("oa-branch")
    assert [m.parts[0].text.text for m in original.messages][::2] == ["one", "two"]
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(input="four", previous_response_id="resp-unknown")


def _said(role: message_pb2.Role.ValueType, text: str) -> message_pb2.Message:
    message = message_pb2.Message(role=role)
    message.parts.add().text.text = text
    return message


async def test_previous_response_id_forks_at_a_reply_an_added_assistant_message_follows(
    client: openai.AsyncOpenAI, grpc_a: TurnwireClient
) -> None:
    """The latest turn is not the latest reply when an assistant message was added after it
    (AddMessages, no turn): the response is forked at, as an older one is. User messages added
    after it leave it the latest reply: its own conversation, with them, continues."""
    first = await client.responses.create(input="one", conversation="oa-added")
    await grpc_a.add_messages("oa-added", [_said(message_pb2.ROLE_USER, "noted")])
    second = await client.responses.create(input="two", previous_response_id=first.id)
    assert second.conversation is not None and second.conversation.id == "oa-added"
    await grpc_a.add_messages("oa-added", [_said(message_pb2.ROLE_ASSISTANT, "an added reply")])
    third = await client.responses.create(input="three", previous_response_id=second.id)
    assert third.conversation is not None and third.conversation.id.startswith("conv-")
    branch = await grpc_a.get_conversation(third.conversation.id)
    assert [m.parts[0].text.text for m in branch.messages if m.role == message_pb2.ROLE_USER] == [
        "one",
        "noted",
        "two",
        "three",
    ]
    original = await grpc_a.get_conversation("oa-added")
    assert original.messages[-1].parts[0].text.text == "an added reply"


async def test_background_is_a_submission(client: openai.AsyncOpenAI) -> None:
    queued = await client.responses.create(input="later", conversation="oa-background", background=True)
    assert queued.status == "queued" and queued.background

    async def finished() -> Any:
        # A background response not yet started answers "queued" at once; a started one is
        # answered when its turn ends: poll, as OpenAI's docs say for background responses.
        response = await client.responses.retrieve(queued.id)
        return response if response.status != "queued" else None

    done = await wait_until(finished, what="the background response to run")
    assert done.status == "completed" and done.output_text == "answered over the OpenAI door"


async def test_a_queued_background_response_is_cancelled(
    client: openai.AsyncOpenAI, grpc_a: TurnwireClient
) -> None:
    running = grpc_a.chat("oa-queue", "go", model="scripted:slow", request_id="oa-queue-r")
    assert (await anext(running)).HasField("turn_start")
    queued = await client.responses.create(input="later", conversation="oa-queue", background=True)
    assert (await client.responses.retrieve(queued.id)).status == "queued"  # behind the running turn
    cancelled = await client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert (await client.responses.retrieve(queued.id)).status == "cancelled"
    await grpc_a.cancel_chat("oa-queue-r")  # a foreground turn: not cancelled over this door
    async for _ in running:
        pass


async def test_a_grpc_turn_is_read_over_this_door_and_its_cancel_seen(
    client: openai.AsyncOpenAI, grpc_a: TurnwireClient
) -> None:
    turn = grpc_a.chat("oa-cross", "go", model="scripted:slow", request_id="oa-cross-r")
    assert (await anext(turn)).HasField("turn_start")
    stream = await client.responses.retrieve("oa-cross-r", stream=True)
    seen: list[dict[str, Any]] = []
    cancelled = False
    async for event in stream:
        seen.append(checked(event))
        if not cancelled and sum(e["type"] == "response.output_text.delta" for e in seen) == 3:
            # A foreground response: this door does not cancel it, as OpenAI does not.
            with pytest.raises(openai.BadRequestError):
                await client.responses.cancel("oa-cross-r")
            cancelled = await grpc_a.cancel_chat("oa-cross-r")
            assert cancelled  # it still ran
    assert seen[-1]["type"] == "response.incomplete" and seen[-1]["response"]["status"] == "cancelled"
    async for _ in turn:
        pass


async def test_retrieving_an_unknown_response_says_no_such_response_exists(
    client: openai.AsyncOpenAI,
) -> None:
    """Fresh-user trial: a plain retrieve of an id nothing holds was told "no turn with request_id
    … has a stream to resume", wording for resuming a stream; a streamed read keeps it."""
    with pytest.raises(openai.NotFoundError) as plain:
        await client.responses.retrieve("resp-doesnotexist")
    assert isinstance(plain.value.body, dict)
    assert plain.value.body["message"] == (
        "no response with id 'resp-doesnotexist': a response id is the id of a response this door "
        "created (resp-<hex>, from POST /v1/responses) or the request id of a turn started over gRPC, "
        "Connect or another door; a response whose conversation was deleted is not found either"
    )
    assert plain.value.body["type"] == "not_found_error" and plain.value.body["code"] == "turn_not_found"
    with pytest.raises(openai.NotFoundError) as streamed:
        await client.responses.retrieve("resp-doesnotexist", stream=True)
    assert isinstance(streamed.value.body, dict)
    assert (
        "no turn with request_id 'resp-doesnotexist' has a stream to resume" in streamed.value.body["message"]
    )


async def test_a_response_past_the_event_retention_is_read_from_the_stored_conversation(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """A response whose turn ended longer ago than ``durability.event_retention_seconds`` is still
    stored (its record, its reply in the conversation): it reads, streams and continues as before
    its events were dropped, and its cancel is refused as a foreground response's is (400, not
    404: the response is still known). Before, every one of these answered 404 ("its events are
    gone") an hour after the turn although the conversation kept the reply: ``retrieve``,
    ``retrieve(stream=True)``, ``cancel``, a background response's ``retrieve``, a Chat
    Completions turn's ``retrieve``, and ``previous_response_id`` (also for a client tool's
    ``function_call_output``), so an app could not continue a conversation after an hour."""
    config = http_sidecar_config(tmp_path, {TOKEN_A: ("alice", "tenant-a")}, SCRIPTS)
    config["durability"] = {"event_retention_seconds": 0.5}
    sidecar = await sidecar_factory(config).start()
    async with openai_client(sidecar) as client, TurnwireClient(sidecar.target, token=TOKEN_A) as grpc_a:
        echo = await client.responses.create(model="scripted:echo", input="hi", conversation="oa-old")
        calc = await client.responses.create(
            model="scripted:calculate", input="6*7?", conversation="oa-old-c"
        )
        located = await client.responses.create(
            model="scripted:locate", input="Where am I?", tools=[LOCATION_TOOL], conversation="oa-old-t"
        )
        background = await client.responses.create(input="later", conversation="oa-old-b", background=True)
        completion = await client.chat.completions.create(
            model="scripted:thanks",
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"conversation": "cc-old"},
        )
        await wait_until(
            lambda: _ran(client, background.id), timeout=10, what="the background response to run"
        )
        ids = [echo.id, calc.id, located.id, background.id, completion.id]

        async def expired() -> bool:
            for response_id in ids:
                try:
                    async for _ in grpc_a.resume_turn(response_id):
                        pass
                except TurnwireError as error:
                    assert error.code == grpc.StatusCode.NOT_FOUND, error
                    continue
                return False
            return True

        await wait_until(expired, timeout=10, what="the responses' events to expire")
        with pytest.raises(TurnwireError) as gone:  # says where the reply is, in the caller's own ids
            async for _ in grpc_a.resume_turn(echo.id):
                pass
        assert gone.value.error_metadata["conversation_id"] == "oa-old", gone.value.error_metadata
        assert "GetConversation of conversation 'oa-old'" in gone.value.message, gone.value.message

        read = await client.responses.retrieve(echo.id)
        Response.model_validate(read.to_dict())
        assert (read.id, read.status, read.output_text) == (echo.id, "completed", echo.output_text)
        assert [item.type for item in read.output] == ["reasoning", "message"]
        assert read.conversation is not None and read.conversation.id == "oa-old"
        assert read.model == "scripted:echo" and read.usage is None  # the record keeps no tokens
        assert read.created_at <= (read.completed_at or 0)

        tools = await client.responses.retrieve(calc.id)
        assert [item.type for item in tools.output] == ["mcp_call", "message"]
        assert tools.output_text == "It is 42."

        events = [checked(e) async for e in await client.responses.retrieve(echo.id, stream=True)]
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        assert events[-1]["type"] == "response.completed"
        assert "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta") == (
            echo.output_text
        )
        with pytest.raises(openai.NotFoundError) as numbered:  # its numbers are the gone events'
            await client.responses.retrieve(echo.id, stream=True, starting_after=3)
        assert (
            isinstance(numbered.value.body, dict)
            and "event_retention_seconds" in numbered.value.body["message"]
        )

        with pytest.raises(openai.BadRequestError):  # a foreground response, as OpenAI refuses it
            await client.responses.cancel(echo.id)
        assert (await client.responses.retrieve(background.id)).output_text == "answered over the OpenAI door"
        assert (await client.responses.retrieve(completion.id)).output_text == "You are in Paris."

        call = next(item for item in located.output if item.type == "function_call")
        answered = await client.responses.create(
            model="scripted:thanks",
            previous_response_id=located.id,
            tools=[LOCATION_TOOL],
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"city": "Paris"}'}],
        )
        assert answered.output_text == "You are in Paris."
        assert answered.conversation is not None and answered.conversation.id == "oa-old-t"
        located_again = await client.responses.retrieve(located.id)  # the call as it ended the response
        assert [item.type for item in located_again.output] == ["message", "function_call"]

        later = await client.responses.create(
            model="scripted:thanks", input="more", previous_response_id=echo.id
        )
        assert later.conversation is not None and later.conversation.id == "oa-old"
        with pytest.raises(openai.NotFoundError):
            await client.responses.create(input="x", previous_response_id="resp-unknown")


async def _ran(client: openai.AsyncOpenAI, response_id: str) -> bool:
    return (await client.responses.retrieve(response_id)).status == "completed"


async def test_tenants_and_tokens(sidecar: SidecarProcess, client: openai.AsyncOpenAI) -> None:
    mine = await client.responses.create(input="private", conversation="oa-tenant")
    async with openai_client(sidecar, TOKEN_B) as other:
        with pytest.raises(openai.NotFoundError):
            await other.responses.retrieve(mine.id)
        with pytest.raises(openai.NotFoundError):
            await other.responses.create(input="x", previous_response_id=mine.id)
    async with openai_client(sidecar, "not-a-token") as stranger:
        with pytest.raises(openai.AuthenticationError):
            await stranger.responses.create(input="hi")


async def test_bad_requests_name_the_param(client: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as bad_id:
        await client.responses.create(input="hi", conversation="bad id!")
    assert isinstance(bad_id.value.body, dict) and bad_id.value.body["param"] == "conversation"
    image = {"type": "input_image", "image_url": "https://example.com/a.png"}
    with pytest.raises(openai.BadRequestError) as bad_item:
        await client.responses.create(input=[{"role": "user", "content": [image]}])  # type: ignore[misc,list-item]
    assert (
        isinstance(bad_item.value.body, dict) and bad_item.value.body["param"] == "input[0].content[0].type"
    )
    with pytest.raises(openai.BadRequestError) as bad_tool:
        await client.responses.create(input="hi", tools=[{"type": "web_search"}])
    assert isinstance(bad_tool.value.body, dict) and bad_tool.value.body["param"] == "tools[0].type"


async def test_an_oversized_message_names_the_request_param_it_came_in(client: openai.AsyncOpenAI) -> None:
    """A message over ``limits.max_message_bytes`` is refused naming where the caller sent it.
    Before, the ``param`` was the Turnwire field: ``message`` for a Responses ``input`` string,
    ``messages[2]`` for ``input[1]`` after ``instructions``, and ``messages[0]`` for the third of a
    Chat Completions request's messages (a named conversation takes those after the last
    assistant message) or for a message after a ``tool`` message."""
    big = "x" * (1100 * 1024)

    async def param_of(call: Any) -> Any:
        with pytest.raises(openai.BadRequestError) as refused:
            await call
        assert isinstance(refused.value.body, dict) and refused.value.body["code"] == "message_too_large"
        return refused.value.body["param"]

    assert await param_of(client.responses.create(input=big)) == "input"
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": big}]
    assert await param_of(client.responses.create(instructions="Be brief.", input=two)) == "input[1]"  # type: ignore[arg-type]
    assert await param_of(client.responses.create(input=two, background=True)) == "input[1]"  # type: ignore[arg-type]
    history: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": big},
    ]
    named = client.chat.completions.create(messages=history, model="", extra_body={"conversation": "cc-big"})
    assert await param_of(named) == "messages[2]"
    answered: list[ChatCompletionMessageParam] = [
        {"role": "user", "content": "a"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "user", "content": big},
    ]
    assert await param_of(client.chat.completions.create(messages=answered, model="")) == "messages[3]"


async def test_an_endpoint_the_door_does_not_serve_says_so(client: openai.AsyncOpenAI) -> None:
    """``models.list``, ``input_items.list``, ``responses.delete`` … answer OpenAI's error body naming
    what is served. Before, a plain-text ``Not Found`` (``Method Not Allowed`` for a delete), which
    the SDKs show as ``Error code: 404`` and nothing else."""
    calls = [
        client.models.list(),
        client.responses.input_items.list("resp-x"),
        client.responses.delete("resp-x"),
        client.embeddings.create(model="x", input="hi"),
    ]
    for call in calls:
        with pytest.raises(openai.NotFoundError) as refused:
            await call  # type: ignore[misc]
        assert isinstance(refused.value.body, dict), refused.value.body
        assert refused.value.body["code"] == "unknown_url"
        assert "POST /v1/responses" in refused.value.body["message"]
        assert "not served by this sidecar" in str(refused.value)
    completion = await client.chat.completions.create(model="", messages=[{"role": "user", "content": "hi"}])
    assert completion.choices  # the served routes still come first


async def test_an_idempotency_key_makes_the_sdks_retries_one_response(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    """The SDK sends a request again when it times out (twice by default), and the sidecar cannot
    tell a retry from a new request: each ran a turn of its own, storing the question again and
    calling the model again (three turns for one call). With ``Idempotency-Key`` (kept by the SDK's
    retries) every request of a key answers the one response the first started."""
    sent: list[str | None] = []

    async def count(request: Any) -> None:
        sent.append(request.headers.get("idempotency-key"))

    key = f"key-{uuid.uuid4().hex}"
    hasty = openai.AsyncOpenAI(
        base_url=f"{http_base(sidecar)}/v1",
        api_key=TOKEN_A,
        timeout=0.8,  # retries start about 1.3, 3.1, 5.9 s in: one after the 2 s turn, even under load
        max_retries=4,
        http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [count]}),
    )
    async with hasty:  # the turn takes 2 s: the first request times out, a retry gets the answer
        response = await hasty.responses.create(
            model="scripted:paced",
            input="hi",
            conversation="oa-keyed",
            extra_headers={"Idempotency-Key": key},
        )
    assert len(sent) >= 2 and set(sent) == {key}, sent  # retried, with the key
    assert response.status == "completed" and response.output_text == "one two three four five six"
    stored = await grpc_a.get_conversation("oa-keyed")
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert stored.messages[1].id == f"tw-a-{response.id}"
    async with openai_client(sidecar) as client:  # sent again later: the same response, not run again
        again = await client.responses.create(
            model="scripted:paced",
            input="hi",
            conversation="oa-keyed",
            extra_headers={"Idempotency-Key": key},
        )
    assert again.id == response.id and again.output_text == response.output_text
    assert len((await grpc_a.get_conversation("oa-keyed")).messages) == 2  # still ran once


async def test_an_idempotency_key_makes_chat_completions_retries_one_completion(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    """The same kind on Chat Completions with a named conversation (stop 67): each SDK retry
    stored the question again and ran the turn again. With ``Idempotency-Key`` the retries and a
    later resend answer the first request's completion, its question stored once."""
    key = f"key-{uuid.uuid4().hex}"
    sent: list[str | None] = []

    async def count(request: Any) -> None:
        sent.append(request.headers.get("idempotency-key"))

    hasty = openai.AsyncOpenAI(
        base_url=f"{http_base(sidecar)}/v1",
        api_key=TOKEN_A,
        timeout=0.8,  # as above
        max_retries=4,
        http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [count]}),
    )
    create: dict[str, Any] = {
        "model": "scripted:paced",
        "messages": [{"role": "user", "content": "hi"}],
        "extra_body": {"conversation": "cc-keyed"},
        "extra_headers": {"Idempotency-Key": key},
    }
    async with hasty:  # the turn takes 2 s: the first request times out, a retry follows the turn
        completion = await hasty.chat.completions.create(**create)
    assert len(sent) >= 2 and set(sent) == {key}, sent
    assert completion.choices[0].message.content == "one two three four five six"
    stored = await grpc_a.get_conversation("cc-keyed")
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    async with openai_client(sidecar) as client:  # sent again later, streamed: the same completion
        chunks = [chunk async for chunk in await client.chat.completions.create(**create, stream=True)]
    assert {chunk.id for chunk in chunks} == {completion.id}
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert text == "one two three four five six"
    assert len((await grpc_a.get_conversation("cc-keyed")).messages) == 2  # still ran once


async def test_chat_completions_refuse_more_than_one_choice(client: openai.AsyncOpenAI) -> None:
    """``n`` above 1 is refused naming ``n``. Before, it was dropped: ``n=2`` answered one choice,
    so code reading ``choices[1]`` failed far from the cause."""
    with pytest.raises(openai.BadRequestError) as refused:
        await client.chat.completions.create(model="", n=2, messages=[{"role": "user", "content": "hi"}])
    assert isinstance(refused.value.body, dict)
    assert (refused.value.body["param"], refused.value.body["code"]) == ("n", "unsupported_value")
    one = await client.chat.completions.create(model="", n=1, messages=[{"role": "user", "content": "hi"}])
    assert len(one.choices) == 1


async def test_hooks_see_the_request_fields_they_are_handed(client: openai.AsyncOpenAI) -> None:
    """``metadata`` reaches ``before_turn`` in ``body``; the hook's choice of model is the one used."""
    response = await client.responses.create(
        input="hi", conversation="oa-hooks", metadata={"use_model": "scripted:thanks"}
    )
    assert response.output_text == "You are in Paris."
    assert response.metadata == {"use_model": "scripted:thanks"}
    completion = await client.chat.completions.create(
        messages=[{"role": "user", "content": "hi"}], model="", metadata={"use_model": "scripted:thanks"}
    )
    assert completion.choices[0].message.content == "You are in Paris."


async def test_instructions_are_stored_before_the_input(
    client: openai.AsyncOpenAI, grpc_a: TurnwireClient
) -> None:
    await client.responses.create(instructions="Be brief.", input="hi", conversation="oa-instructions")
    stored = await grpc_a.get_conversation("oa-instructions")
    roles = [m.role for m in stored.messages]
    assert roles == [message_pb2.ROLE_SYSTEM, message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert stored.messages[0].parts[0].text.text == "Be brief."


async def test_a_failed_turn_is_a_failed_response(client: openai.AsyncOpenAI) -> None:
    response = await client.responses.create(model="scripted:fails", input="hi", conversation="oa-fails")
    assert response.status == "failed" and response.error is not None
    assert "the model is down" in response.error.message
    stream = await client.responses.create(
        model="scripted:fails", input="again", conversation="oa-fails", stream=True
    )
    events = [checked(event) async for event in stream]
    assert events[-1]["type"] == "response.failed" and events[-1]["response"]["status"] == "failed"
    assert events[-2]["type"] == "response.output_item.done"  # the cut message is closed first
    assert events[-2]["item"]["status"] == "incomplete"


async def test_closing_a_stream_cancels_its_turn(client: openai.AsyncOpenAI) -> None:
    stream = await client.responses.create(
        model="scripted:slow", input="go", conversation="oa-leave", stream=True
    )
    response_id = ""
    async for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            break
    await stream.close()
    ended = await client.responses.retrieve(response_id)  # waits for the turn to end
    assert ended.status == "cancelled"
    assert ended.output_text  # the partial reply is kept


# -- Chat Completions ---------------------------------------------------------------------------

WEATHER_FUNCTION: ChatCompletionToolParam = {
    "type": "function",
    "function": {
        "name": "get_location",
        "description": "The user's location, from their device",
        "parameters": {"type": "object", "properties": {"precision": {"type": "string"}}},
    },
}


async def test_chat_completions_run_the_tool_loop_and_keep_nothing(
    client: openai.AsyncOpenAI, grpc_a: TurnwireClient
) -> None:
    completion = await client.chat.completions.create(
        model="scripted:narrate", messages=[{"role": "user", "content": "6 * 7?"}]
    )
    # The sidecar ran the calculator; each step's text is kept, a blank line between them.
    assert completion.choices[0].message.content == "Let me calculate.\n\nIt is 42."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    listed = await grpc_a.list_conversations(page_size=1000)
    assert not [c for c in listed.conversations if c.conversation_id.startswith("chatcmpl-")]


async def test_chat_completions_with_client_tools(client: openai.AsyncOpenAI) -> None:
    asked: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Where am I?"}]
    first = await client.chat.completions.create(
        model="scripted:locate", messages=asked, tools=[WEATHER_FUNCTION]
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_location"
    assert json.loads(call.function.arguments) == {"precision": "city"}
    history: list[ChatCompletionMessageParam] = [
        *asked,
        choice.message.model_dump(exclude_none=True),  # type: ignore[list-item]
        {"role": "tool", "tool_call_id": call.id, "content": '{"city": "Paris"}'},
    ]
    second = await client.chat.completions.create(
        model="scripted:thanks", messages=history, tools=[WEATHER_FUNCTION]
    )
    assert second.choices[0].message.content == "You are in Paris."


async def test_chat_completions_stream_with_usage(client: openai.AsyncOpenAI) -> None:
    stream = await client.chat.completions.create(
        model="scripted:echo",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "answered over the OpenAI door"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 12
    # On the wire every other chunk says "usage": null, as OpenAI's do (stop 67, migrator trial).
    raw = await client.chat.completions.with_raw_response.create(
        model="scripted:echo",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    sent = [
        json.loads(line.removeprefix("data: "))
        async for line in raw.http_response.aiter_lines()
        if line.startswith("data: {")
    ]
    assert len(sent) > 2 and all(chunk["usage"] is None for chunk in sent[:-1]), sent
    assert sent[-1]["usage"]["total_tokens"] == 12


async def test_a_named_conversation_keeps_the_turn(
    client: openai.AsyncOpenAI, grpc_a: TurnwireClient
) -> None:
    completion = await client.chat.completions.create(
        model="scripted:echo",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"conversation": "cc-named"},
    )
    stored = await grpc_a.get_conversation("cc-named")
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    again = await client.responses.retrieve(completion.id)  # the same turn, read at the Responses door
    assert again.output_text == completion.choices[0].message.content


# -- the openai npm SDK ------------------------------------------------------------------------


async def _node_run(script: Path, sidecar: SidecarProcess) -> Any:
    """What ``script`` printed (JSON) after its calls to the sidecar's OpenAI door as tenant A."""
    node = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node",
        str(script),
        f"{http_base(sidecar)}/v1",
        TOKEN_A,
        cwd=script.parents[2],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(node.communicate(), timeout=120)
    assert node.returncode == 0, err.decode()
    return json.loads(out)


async def test_the_openai_npm_sdk(sidecar: SidecarProcess) -> None:
    """``tests/support/openai_node.mjs``: the same calls through the official Node.js SDK."""
    assert sidecar.config is not None
    seen = await _node_run(NODE_SCRIPT, sidecar)
    assert seen["plain"]["status"] == "completed" and seen["plain"]["text"] == "answered over the OpenAI door"
    assert seen["plain"]["usage"]["total_tokens"] == 12 and seen["plain"]["conversation"] == {
        "id": "node-plain"
    }
    streamed = seen["streamed"]
    assert streamed[0] == ["response.created", 0] and streamed[-1][0] == "response.completed"
    assert [number for _, number in streamed] == list(range(len(streamed)))
    assert seen["resumed"] == streamed[5:]
    answer = "answered over the OpenAI door"
    assert seen["helper"] == {"deltas": answer, "text": answer, "status": "completed"}
    assert seen["tools"] == {
        "name": "get_location",
        "arguments": {"precision": "city"},
        "answer": "You are in Paris.",
    }
    assert seen["chat"] == {"finish": "tool_calls", "name": "get_location", "answer": "You are in Paris."}
    assert seen["error"] == {
        "class": "BadRequestError",
        "status": 400,
        "param": "conversation",
        "code": "invalid_field",
    }


async def test_the_ai_sdk_openai_provider_sees_the_sidecars_tools_as_run(sidecar: SidecarProcess) -> None:
    """``tests/support/ai_sdk_openai_node.mjs``: the Vercel AI SDK's OpenAI provider
    (``@ai-sdk/openai``, unmodified, its default Responses model). A call the sidecar ran reaches it
    as a tool the provider executed, with its result; a call of the application's own tool as one it
    runs. Before, a turn with a sidecar tool failed ``generateText`` ("Invalid JSON response": a
    ``function_call_output`` output item) and, streamed, was a call of a tool the application does
    not have (``NoSuchToolError``, finish ``tool-calls``)."""
    seen = await _node_run(AI_SDK_SCRIPT, sidecar)
    assert seen["generated"]["text"] == "It is 42." and seen["generated"]["finish"] == "stop"
    assert seen["generated"]["calls"] == [{"name": "mcp.calculator", "providerExecuted": True}]
    assert "42" in seen["generated"]["results"][0]
    assert seen["streamed"]["text"] == "It is 42." and seen["streamed"]["finish"] == "stop"
    assert seen["streamed"]["parts"] == [
        ["tool-call", "mcp.calculator", True],
        ["tool-result", "mcp.calculator", True],
    ]
    assert seen["client"] == {
        "finish": "tool-calls",
        "calls": [{"name": "get_location", "input": {"precision": "city"}}],
        "results": [{"city": "Paris"}],
    }
    # The SDK's tool loop and a history of messages refer to the door's items (item_reference):
    # they continue the stored response's conversation. Before, the loop's second step was refused
    # (400, "send function_call_output items without new messages") and a history lost its replies.
    loop = seen["loop"]
    assert loop["steps"] == 2 and loop["text"] == "You are in Paris.", loop
    assert loop["conversations"][0] is not None and loop["conversations"] == [loop["conversations"][0]] * 2
    async with TurnwireClient(sidecar.target, token=TOKEN_A) as grpc_a:
        stored = await grpc_a.get_conversation(loop["conversations"][0])
    call = next(p.tool_call for m in stored.messages for p in m.parts if p.HasField("tool_call"))
    assert json.loads(call.output_json) == {"city": "Paris"}
    history = seen["history"]
    assert history["text"] == "You are in Paris."
    assert history["conversations"][0] == history["conversations"][1], history
