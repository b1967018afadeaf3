"""Tool approvals and cancel on the OpenAI-compatible door (docs/api/openai.md#tool-approvals,
docs/api/openai.md#routes), driven by the official ``openai`` Python SDK, unmodified, against a
real ``turnwire serve`` whose ``get_weather`` needs approval (``tools.require_approval``).

A call waiting for approval is OpenAI's ``mcp_approval_request`` item, streamed, answered and
retrieved alike; an ``mcp_approval_response`` input item on a follow-up with
``previous_response_id`` approves or denies it through ``SubmitToolApprovals``, and the follow-up
shows the call run (or refused) as an ``mcp_call``. Before, the call was a ``function_call``, the
client's own tool, which an OpenAI client runs itself or fails on, and an
``mcp_approval_response`` was refused (400 ``input[0].type``).

Cancelling a foreground response, running or ended, is refused as OpenAI refuses it (400
``invalid_request_error``, "Cannot cancel a synchronous response."); before, it answered 200.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_output_item import McpApprovalRequest, McpCall
from pydantic import TypeAdapter
from support.endless import endless_step
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import new_token

from turnwire_client import TurnwireClient
from turnwire_client.v1 import message_pb2

TOKEN = new_token()
EVENT = TypeAdapter(ResponseStreamEvent)

SCRIPTS = {
    "weather": [
        {"text": "Let me look.", "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]},
        {"text": "unreachable"},
    ],
    "weather_only": [
        {"tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]},
        {"text": "unreachable"},
    ],
    "after": [{"text": "Done with the weather."}],
    "echo": [{"text": "hello"}],
    "slow": [endless_step("".join(f"w{i} " for i in range(30)), 30)],
}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("openai-approvals-e2e")
    config = http_sidecar_config(workdir, {TOKEN: ("alice", "tenant-a")}, SCRIPTS)
    config["tools"] = {"demo": True, "require_approval": ["get_weather"]}
    with running_sidecar(workdir, config) as process:
        yield process


@pytest.fixture
async def client(sidecar: SidecarProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    base = f"{http_base(sidecar)}/v1"
    async with openai.AsyncOpenAI(base_url=base, api_key=TOKEN, max_retries=0) as opened:
        yield opened


@pytest.fixture
async def grpc(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target, token=TOKEN) as opened:
        yield opened


def approval_request(response: Any) -> McpApprovalRequest:
    """The one ``mcp_approval_request`` of ``response``, read by the SDK's own type."""
    Response.model_validate(response.to_dict())
    assert [item.type for item in response.output] == ["message", "mcp_approval_request"], response.output
    return McpApprovalRequest.model_validate(response.output[1].to_dict())


async def streamed(stream: Any) -> list[dict[str, Any]]:
    events = []
    async for event in stream:
        raw: dict[str, Any] = event.to_dict()
        EVENT.validate_python(raw)
        events.append(raw)
    return events


@pytest.mark.parametrize(("approve", "stream"), [(True, True), (False, False)])
async def test_an_approval_request_is_answered_with_mcp_approval_response(
    client: openai.AsyncOpenAI, grpc: TurnwireClient, approve: bool, stream: bool
) -> None:
    conversation = f"oa-approval-{approve}"
    if stream:
        events = await streamed(
            await client.responses.create(
                model="scripted:weather", input="Weather?", conversation=conversation, stream=True
            )
        )
        added = [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"]
        assert added == ["message", "mcp_approval_request"]
        first = await client.responses.retrieve(events[-1]["response"]["id"])
    else:
        first = await client.responses.create(
            model="scripted:weather", input="Weather?", conversation=conversation
        )
    request = approval_request(first)
    assert (request.server_label, request.name) == ("turnwire", "get_weather")
    assert json.loads(request.arguments) == {"city": "Paris"}
    assert first.status == "completed"
    assert approval_request(await client.responses.retrieve(first.id)) == request  # stored, read again

    answer: dict[str, Any] = {
        "type": "mcp_approval_response",
        "approval_request_id": request.id,
        "approve": approve,
    }
    if not approve:
        answer["reason"] = "not today"
    follow: dict[str, Any] = {"model": "scripted:after", "previous_response_id": first.id, "input": [answer]}
    if stream:
        events = await streamed(await client.responses.create(**follow, stream=True))
        second = Response.model_validate(events[-1]["response"])
    else:
        second = await client.responses.create(**follow)
    assert second.status == "completed" and second.output_text == "Done with the weather."
    assert [item.type for item in second.output] == ["mcp_call", "message"]
    call = McpCall.model_validate(second.output[0].to_dict())
    assert (call.server_label, call.name) == ("turnwire", "get_weather")
    # The call's own arguments and the request it answered, as OpenAI's mcp_call carries them
    # (before: "{}" and no approval_request_id), read back the same.
    assert json.loads(call.arguments) == {"city": "Paris"} and call.approval_request_id == request.id
    assert McpCall.model_validate((await client.responses.retrieve(second.id)).output[0].to_dict()) == call
    stored = await grpc.get_conversation(conversation)
    part = next(p.tool_call for p in stored.messages[1].parts if p.HasField("tool_call"))
    assert part.approval.id == request.id
    if approve:
        assert call.status == "completed" and "Paris" in str(call.output)
        assert part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    else:
        assert call.status == "failed" and call.error is not None and "not today" in str(call.error)
        assert part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED
        assert part.approval.reason == "not today"


async def test_an_item_reference_to_an_approval_request_continues_its_response(
    client: openai.AsyncOpenAI,
) -> None:
    """The AI SDK's OpenAI provider sends the history without ``previous_response_id``: the user's
    message, an ``item_reference`` to the ``mcp_approval_request`` it answers, then the
    ``mcp_approval_response``. The reference names the response that asked it, which the request
    continues, as OpenAI resolves any stored item by its id. Before, such a reference named no
    response: 400 (``previous_response_id``)."""
    first = await client.responses.create(model="scripted:weather_only", input="Weather?")
    assert [item.type for item in first.output] == ["mcp_approval_request"]
    request = McpApprovalRequest.model_validate(first.output[0].to_dict())
    history: list[Any] = [
        {"role": "user", "content": "Weather?"},
        {"type": "item_reference", "id": request.id},
        {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True},
    ]
    second = await client.responses.create(model="scripted:after", input=history)
    assert second.status == "completed" and second.output_text == "Done with the weather."
    assert second.conversation is not None and first.conversation is not None
    assert second.conversation.id == first.conversation.id, "the same conversation, continued"
    call = McpCall.model_validate(second.output[0].to_dict())
    assert (call.approval_request_id, call.status) == (request.id, "completed")
    assert json.loads(call.arguments) == {"city": "Paris"} and "Paris" in str(call.output)


async def test_an_approval_answer_that_names_no_request_is_refused(client: openai.AsyncOpenAI) -> None:
    first = await client.responses.create(
        model="scripted:weather", input="Weather?", conversation="oa-approval-bad"
    )
    approval_request(first)
    wrong = {"type": "mcp_approval_response", "approval_request_id": "tw-ap-nope", "approve": True}
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(previous_response_id=first.id, input=[wrong])  # type: ignore[list-item]
    assert isinstance(refused.value.body, dict)
    assert refused.value.body["param"] == "input[0].approval_request_id"
    assert "tw-ap-nope" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as unanchored:
        await client.responses.create(input=[wrong])  # type: ignore[list-item]
    assert (
        isinstance(unanchored.value.body, dict) and unanchored.value.body["param"] == "previous_response_id"
    )


async def test_chat_completions_end_at_a_call_waiting_for_approval(client: openai.AsyncOpenAI) -> None:
    """Chat Completions has no item for it: the completion ends with the text before the call
    (``finish_reason`` ``stop``) and the call waits; with a named conversation the completion
    reads at the Responses door, where its approval request is answered."""
    completion = await client.chat.completions.create(
        model="scripted:weather",
        messages=[{"role": "user", "content": "Weather?"}],
        extra_body={"conversation": "cc-approval"},
    )
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == (
        "stop",
        "Let me look.",
        None,
    )
    request = approval_request(await client.responses.retrieve(completion.id))
    answer = {"type": "mcp_approval_response", "approval_request_id": request.id, "approve": True}
    second = await client.responses.create(
        model="scripted:after",
        previous_response_id=completion.id,
        input=[answer],  # type: ignore[list-item]
    )
    assert second.output_text == "Done with the weather." and second.output[0].type == "mcp_call"


async def test_a_foreground_response_is_not_cancelled(
    client: openai.AsyncOpenAI, grpc: TurnwireClient
) -> None:
    """OpenAI cancels only background responses; a foreground one, ended or running, is refused
    with 400 and OpenAI's error body, and a running one runs on. Before, 200 (and a running turn
    was cancelled)."""
    ended = await client.responses.create(model="scripted:after", input="hi", conversation="oa-cancel")
    running = grpc.chat("oa-cancel-running", "go", model="scripted:slow", request_id="oa-cancel-r")
    assert (await anext(running)).HasField("turn_start")
    for response_id in (ended.id, "oa-cancel-r"):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.cancel(response_id)
        assert isinstance(refused.value.body, dict)
        body = refused.value.body
        assert body["message"].startswith("Cannot cancel a synchronous response.")
        assert (body["type"], body["param"], body["code"]) == ("invalid_request_error", None, None)
    assert (await client.responses.retrieve(ended.id)).status == "completed"
    assert await grpc.cancel_chat("oa-cancel-r")  # it was still running: gRPC cancels it
    async for _ in running:
        pass
    with pytest.raises(openai.NotFoundError):
        await client.responses.cancel("resp-nothing-here")
