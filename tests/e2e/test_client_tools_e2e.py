"""Client-side tools, tool results and approvals end to end (docs/semantics.md §6, §8, §12), against
real ``turnwire serve`` processes.

- A client tool's call ends the turn with the call pending (``input-available``,
  ``client_executed``), without ``before_tool_call``/``after_tool_call``; a server tool called in
  the same step still runs.
- Results come back through ``SaveMessages`` (a tool-result part) or ``SubmitToolResults``; once
  the last call of the batch has its result exactly one continuation runs, even with 20 results
  racing. Refusals (unknown call, repeated result, output that is not JSON) store nothing.
- Approvals: an approved call runs in the continuation (its result stored in the original
  message), ``before_tool_call`` can still block it; a denied call reaches the model as a denial.
- Transcript repair keeps a pending call until the user moves past it; an expired one becomes an
  errored result and a late answer is refused with ``EXPIRED``.

The scripted model replays a script per turn from step 0, so continuations name another script
(``model``) that answers in text; ``record_requests`` shows what the model was sent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import json_format, struct_pb2
from support.hooks import BlockToolsFromBody, pythonpath_env
from support.sidecar import SidecarProcess, running_sidecar
from support.waiting import wait_until

from turnwire_client import TurnResult, TurnwireClient, TurnwireError, collect
from turnwire_client.stream import TurnStream
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2

DENIED = "Tool execution denied by user"
LOCATION = {"city": "Paris", "lat": 48.8566, "id": 12345678901234567890123}
LOCATION_JSON = '{"city":"Paris","lat":48.8566,"id":12345678901234567890123}'

SCRIPTS = {
    "client_call": [
        {
            "text": "Let me ask your device.",
            "tool_calls": [{"name": "get_location", "input": {"precision": "city"}}],
        },
        {"text": "unreachable"},
    ],
    "client_pair": [
        {"tool_calls": [{"name": "get_location", "input": {}}, {"name": "read_clipboard", "input": {}}]},
        {"text": "unreachable"},
    ],
    "mixed": [
        {
            "tool_calls": [
                {"name": "get_location", "input": {}},
                {"name": "get_weather", "input": {"city": "Oslo"}},
            ]
        },
        {"text": "unreachable"},
    ],
    "approval": [
        {"tool_calls": [{"name": "calculator", "input": {"expression": "6 * 7"}}]},
        {"text": "unreachable"},
    ],
    "answer": [{"text": "Thanks, all done."}],
}


def _config(records: Path, **durability: Any) -> dict[str, Any]:
    return {
        "default_model": "scripted:client_call",
        "providers": {"scripted": {"scripts": SCRIPTS, "record_requests": str(records)}},
        "tools": {"demo": True, "require_approval": ["calculator"]},
        "events": {"hook_timeline": True},
        "durability": durability,
        "middleware": [
            {"path": "support.hooks:EveryHook", "options": {"label": "every"}},
            {"path": "support.hooks:BlockToolsFromBody"},
        ],
    }


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("client-tools-records") / "requests.jsonl"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, records: Path) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("client-tools-e2e")
    with running_sidecar(workdir, _config(records), env=pythonpath_env()) as process:
        yield process


@pytest.fixture
async def channel(sidecar: SidecarProcess) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(sidecar.target) as opened:
        yield opened


_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}-{next(_ids)}-{time.monotonic_ns()}"


def client_tool(name: str) -> chat_service_pb2.ClientTool:
    schema = struct_pb2.Struct()
    schema.update({"type": "object", "properties": {"precision": {"type": "string"}}})
    return chat_service_pb2.ClientTool(
        name=name, description=f"{name} (runs on the client)", input_schema=schema
    )


CLIENT_TOOLS = [client_tool("get_location"), client_tool("read_clipboard")]


def stub(channel: grpc.aio.Channel) -> Any:
    return chat_service_pb2_grpc.ChatServiceStub(channel)


async def chat(channel: grpc.aio.Channel, conversation_id: str, text: str, model: str) -> TurnResult:
    request = chat_service_pb2.ChatRequest(
        conversation_id=conversation_id,
        message=message_pb2.Message(parts=[message_pb2.Part(text=message_pb2.TextPart(text=text))]),
        model=model,
        client_tools=CLIENT_TOOLS,
    )
    return await collect(TurnStream(stub(channel).Chat(request)))


def results_request(
    conversation_id: str, *results: chat_service_pb2.ToolResult, auto_continue: bool = True, **extra: Any
) -> chat_service_pb2.SubmitToolResultsRequest:
    return chat_service_pb2.SubmitToolResultsRequest(
        conversation_id=conversation_id,
        results=list(results),
        auto_continue=auto_continue,
        model="scripted:answer",
        client_tools=CLIENT_TOOLS,
        **extra,
    )


async def submit_results(
    channel: grpc.aio.Channel, request: chat_service_pb2.SubmitToolResultsRequest
) -> TurnResult:
    return await collect(TurnStream(stub(channel).SubmitToolResults(request)))


async def submit_approvals(
    channel: grpc.aio.Channel, conversation_id: str, *approvals: chat_service_pb2.ToolApproval, **extra: Any
) -> TurnResult:
    request = chat_service_pb2.SubmitToolApprovalsRequest(
        conversation_id=conversation_id,
        approvals=list(approvals),
        auto_continue=True,
        model="scripted:answer",
        **extra,
    )
    return await collect(TurnStream(stub(channel).SubmitToolApprovals(request)))


async def stored(sidecar: SidecarProcess, conversation_id: str) -> list[message_pb2.Message]:
    async with TurnwireClient(sidecar.target) as client:
        return list((await client.get_conversation(conversation_id)).messages)


def calls_of(message: message_pb2.Message | None) -> dict[str, message_pb2.ToolCallPart]:
    assert message is not None
    return {
        p.tool_call.tool_call_id: p.tool_call for p in message.parts if p.WhichOneof("kind") == "tool_call"
    }


def kinds(result: TurnResult) -> list[str]:
    return [str(event.WhichOneof("event")) for event in result.events]


def error_reason(status: Any) -> str:
    return TurnwireError.from_status(status).reason


def requests_of(records: Path, conversation_id: str) -> list[dict[str, Any]]:
    """The model requests recorded for the conversation (by its user text), in order."""
    found = []
    for line in records.read_text().splitlines():
        request = json.loads(line)
        if conversation_id in json.dumps(request["messages"]):
            found.append(request)
    return found


def tool_parts(request: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        part["toolCall"]["toolCallId"]: part["toolCall"]
        for message in request["messages"]
        for part in message.get("parts", [])
        if "toolCall" in part
    }


async def pending_turn(
    channel: grpc.aio.Channel, model: str = "scripted:client_call"
) -> tuple[str, TurnResult]:
    conversation_id = new_id("conv")
    result = await chat(channel, conversation_id, f"[{conversation_id}] help me", model)
    assert result.ok, result
    return conversation_id, result


# --- client tools ------------------------------------------------------------------------------


async def test_a_client_tool_call_ends_the_turn_pending_and_skips_the_tool_hooks(
    channel: grpc.aio.Channel,
) -> None:
    _, result = await pending_turn(channel)
    seen = kinds(result)
    # One "text_delta" per run: deltas the server read in one piece may merge (docs/semantics.md §10).
    runs = [kind for i, kind in enumerate(seen) if not (kind == "text_delta" and seen[i - 1] == kind)]
    assert runs == [
        "turn_start",
        "step_start",
        "text_start",
        "text_delta",
        "text_end",
        "tool_input_start",
        "tool_input_delta",
        "tool_input_available",
        "step_finish",
        "turn_end",
    ]
    [call] = calls_of(result.message).values()
    assert call.tool_name == "get_location" and call.client_executed
    assert call.state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    assert json.loads(call.input_json) == {"precision": "city"}
    assert result.step_count == 1, "the step with the client call ends the turn"
    timeline = json_format.MessageToDict(result.events[-1].turn_end.metadata)["hook_timeline"]
    hooks = {entry["hook"] for entry in timeline}
    assert "before_step" in hooks and "on_step_finish" in hooks
    assert not hooks & {"before_tool_call", "after_tool_call"}, "no tool hooks for a client tool"


async def test_a_server_tool_called_with_a_client_tool_still_runs(
    channel: grpc.aio.Channel, sidecar: SidecarProcess
) -> None:
    _, result = await pending_turn(channel, "scripted:mixed")
    calls = list(calls_of(result.message).values())
    assert [(c.tool_name, c.state) for c in calls] == [
        ("get_location", message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE),
        ("get_weather", message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE),
    ]
    assert "tool_output_available" in kinds(result)
    assert result.step_count == 1


async def test_save_messages_with_a_tool_result_part_completes_the_call_and_continues(
    channel: grpc.aio.Channel, sidecar: SidecarProcess, records: Path
) -> None:
    conversation_id, first = await pending_turn(channel)
    assert first.message is not None
    [call_id] = calls_of(first.message)
    answer = message_pb2.Message(role=message_pb2.ROLE_ASSISTANT)
    answer.parts.add().tool_call.CopyFrom(
        message_pb2.ToolCallPart(
            tool_call_id=call_id,
            tool_name="get_location",
            state=message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
            output_json=LOCATION_JSON,
        )
    )
    request = chat_service_pb2.SaveMessagesRequest(
        conversation_id=conversation_id, messages=[answer], model="scripted:answer"
    )
    continuation = await collect(TurnStream(stub(channel).SaveMessages(request)))
    assert continuation.ok, continuation
    start = continuation.events[0].turn_start
    assert start.continuation and start.message_id != first.message.id
    assert continuation.text == "Thanks, all done."
    messages = await stored(sidecar, conversation_id)
    assert [m.id for m in messages][1:] == [first.message.id, start.message_id], "one new message, no copy"
    call = calls_of(messages[1])[call_id]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert call.output_json == LOCATION_JSON, "the client's JSON is stored exactly"
    sent = requests_of(records, conversation_id)[-1]
    assert sent["model"] == "answer"
    assert tool_parts(sent)[call_id]["outputJson"] == LOCATION_JSON, "the model sees the result"


async def test_twenty_racing_results_for_a_batch_run_exactly_one_continuation(
    channel: grpc.aio.Channel, sidecar: SidecarProcess
) -> None:
    conversation_id, first = await pending_turn(channel, "scripted:client_pair")
    call_ids = list(calls_of(first.message))
    assert len(call_ids) == 2

    async def submit(index: int) -> TurnResult | TurnwireError:
        result = chat_service_pb2.ToolResult(
            tool_call_id=call_ids[index % 2], output_json=json.dumps({"n": index})
        )
        try:
            return await submit_results(channel, results_request(conversation_id, result))
        except TurnwireError as error:
            return error

    outcomes = await asyncio.gather(*(submit(index) for index in range(20)))
    turns = [o for o in outcomes if isinstance(o, TurnResult)]
    errors = [o for o in outcomes if isinstance(o, TurnwireError)]
    continued = [t for t in turns if t.events[0].HasField("turn_start")]
    skipped = [t for t in turns if t.status == event_pb2.TURN_STATUS_SKIPPED]
    assert len(continued) == 1 and continued[0].ok and continued[0].events[0].turn_start.continuation
    assert len(skipped) == 1
    assert error_reason(skipped[0].error) == "TOOL_RESULTS_INCOMPLETE"
    assert len(errors) == 18
    assert {(e.code, e.reason) for e in errors} == {
        (grpc.StatusCode.FAILED_PRECONDITION, "TOOL_CALL_NOT_PENDING")
    }
    messages = await stored(sidecar, conversation_id)
    assert len(messages) == 3, "user, the reply with the calls, one continuation"
    assert all(
        c.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE for c in calls_of(messages[1]).values()
    )


async def test_refused_results_store_nothing(channel: grpc.aio.Channel, sidecar: SidecarProcess) -> None:
    conversation_id, first = await pending_turn(channel)
    [call_id] = calls_of(first.message)
    before = await stored(sidecar, conversation_id)

    async def refused(request: chat_service_pb2.SubmitToolResultsRequest) -> TurnwireError:
        with pytest.raises(TurnwireError) as caught:
            await submit_results(channel, request)
        assert await stored(sidecar, conversation_id) == before, "a refusal stores nothing"
        return caught.value

    unknown = await refused(
        results_request(
            conversation_id, chat_service_pb2.ToolResult(tool_call_id="no-such-call", output_json="1")
        )
    )
    assert (unknown.code, unknown.reason) == (grpc.StatusCode.NOT_FOUND, "TOOL_CALL_NOT_FOUND")
    not_json = await refused(
        results_request(
            conversation_id, chat_service_pb2.ToolResult(tool_call_id=call_id, output_json="{nope")
        )
    )
    assert (not_json.code, not_json.reason) == (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_FIELD")
    assert [v[0] for v in not_json.field_violations] == ["results[0].output_json"]
    bad_tool = await refused(
        chat_service_pb2.SubmitToolResultsRequest(
            conversation_id=conversation_id,
            results=[chat_service_pb2.ToolResult(tool_call_id=call_id, output_json="1")],
            client_tools=[chat_service_pb2.ClientTool(name="bad name!")],
        )
    )
    assert [v[0] for v in bad_tool.field_violations] == ["client_tools[0].name"]

    answer = chat_service_pb2.ToolResult(tool_call_id=call_id, error=True)
    done = await submit_results(channel, results_request(conversation_id, answer, auto_continue=False))
    assert done.status == event_pb2.TURN_STATUS_SKIPPED and done.error is None
    assert calls_of(done.message)[call_id].error_text == DENIED, "an error result without text"
    before = await stored(sidecar, conversation_id)
    repeated = await refused(results_request(conversation_id, answer))
    assert (repeated.code, repeated.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "TOOL_CALL_NOT_PENDING")


async def test_client_tool_definitions_are_validated(channel: grpc.aio.Channel) -> None:
    schema = struct_pb2.Struct()
    schema.update({"type": "string"})
    request = chat_service_pb2.ChatRequest(
        conversation_id=new_id("conv"),
        message=message_pb2.Message(parts=[message_pb2.Part(text=message_pb2.TextPart(text="hi"))]),
        client_tools=[
            chat_service_pb2.ClientTool(name="ok_tool"),
            chat_service_pb2.ClientTool(name="ok_tool"),
            chat_service_pb2.ClientTool(name="x" * 65),
            chat_service_pb2.ClientTool(name="typed", input_schema=schema),
        ],
    )
    with pytest.raises(TurnwireError) as caught:
        await collect(TurnStream(stub(channel).Chat(request)))
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v[0] for v in caught.value.field_violations] == [
        "client_tools[1].name",
        "client_tools[2].name",
        "client_tools[3].input_schema",
    ]


# --- approvals ---------------------------------------------------------------------------------


async def approval_turn(channel: grpc.aio.Channel) -> tuple[str, str, TurnResult]:
    conversation_id, result = await pending_turn(channel, "scripted:approval")
    [call] = calls_of(result.message).values()
    assert call.state == message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED and call.approval.id
    [request] = [e.tool_approval_request for e in result.events if e.HasField("tool_approval_request")]
    assert (request.tool_call_id, request.approval_id) == (call.tool_call_id, call.approval.id)
    assert "tool_output_available" not in kinds(result), "a call waiting for approval does not run"
    return conversation_id, call.tool_call_id, result


async def test_an_approved_call_runs_in_the_continuation_and_its_result_is_stored_in_the_original_message(
    channel: grpc.aio.Channel, sidecar: SidecarProcess, records: Path
) -> None:
    conversation_id, call_id, first = await approval_turn(channel)
    result = await submit_approvals(
        channel, conversation_id, chat_service_pb2.ToolApproval(tool_call_id=call_id, approved=True)
    )
    assert result.ok, result
    assert kinds(result)[:4] == ["turn_start", "tool_input_available", "tool_output_available", "step_start"]
    announced = result.events[1].tool_input_available  # its input and approval, for the doors
    asked = calls_of(first.message)[call_id]
    assert (announced.tool_call_id, announced.input_json, announced.approval_id) == (
        call_id,
        asked.input_json,
        asked.approval.id,
    )
    output = result.events[2].tool_output_available
    assert output.tool_call_id == call_id and json.loads(output.output_json)["result"] == 42
    assert calls_of(result.message) == {}, "the continuation's own message holds no copy of the call"
    messages = await stored(sidecar, conversation_id)
    assert first.message is not None and messages[1].id == first.message.id
    call = calls_of(messages[1])[call_id]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE and call.approval.approved
    assert tool_parts(requests_of(records, conversation_id)[-1])[call_id]["outputJson"] == output.output_json


async def test_a_denied_call_is_stored_denied_and_the_model_is_told(
    channel: grpc.aio.Channel, sidecar: SidecarProcess, records: Path
) -> None:
    conversation_id, call_id, _ = await approval_turn(channel)
    result = await submit_approvals(
        channel, conversation_id, chat_service_pb2.ToolApproval(tool_call_id=call_id, approved=False)
    )
    assert result.ok, result
    assert kinds(result)[:4] == ["turn_start", "tool_input_available", "tool_output_denied", "step_start"]
    announced = result.events[1].tool_input_available
    assert announced.tool_call_id == call_id and announced.approval_id.startswith("tw-ap-")
    assert announced.input_json
    denied = result.events[2].tool_output_denied
    assert (denied.tool_call_id, denied.reason) == (call_id, DENIED)
    call = calls_of((await stored(sidecar, conversation_id))[1])[call_id]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED and call.error_text == DENIED
    sent = tool_parts(requests_of(records, conversation_id)[-1])[call_id]
    assert (sent["state"], sent["errorText"]) == ("TOOL_CALL_STATE_OUTPUT_DENIED", DENIED)


async def test_before_tool_call_still_blocks_an_approved_call(
    channel: grpc.aio.Channel, sidecar: SidecarProcess
) -> None:
    conversation_id, call_id, _ = await approval_turn(channel)
    body = struct_pb2.Struct()
    body.update({"block_tools": ["calculator"]})
    result = await submit_approvals(
        channel,
        conversation_id,
        chat_service_pb2.ToolApproval(tool_call_id=call_id, approved=True),
        body=body,
    )
    assert result.ok, result
    output = next(e.tool_output_available for e in result.events if e.HasField("tool_output_available"))
    assert json.loads(output.output_json) == BlockToolsFromBody.REASON
    call = calls_of((await stored(sidecar, conversation_id))[1])[call_id]
    assert json.loads(call.output_json) == BlockToolsFromBody.REASON, "the block wins over the approval"


# --- transcript repair -------------------------------------------------------------------------


async def test_a_pending_call_survives_a_continuation_until_the_user_moves_past_it(
    channel: grpc.aio.Channel, sidecar: SidecarProcess, records: Path
) -> None:
    conversation_id, first = await pending_turn(channel)
    [call_id] = calls_of(first.message)
    async with TurnwireClient(sidecar.target) as client:
        continued = await collect(client.continue_last_turn(conversation_id, model="scripted:answer"))
    assert continued.ok, continued
    messages = await stored(sidecar, conversation_id)
    assert calls_of(messages[1])[call_id].state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    sent = tool_parts(requests_of(records, conversation_id)[-1])[call_id]
    assert sent["state"] == "TOOL_CALL_STATE_OUTPUT_ERROR", "the model never sees a call without a result"

    moved_on = await chat(channel, conversation_id, f"[{conversation_id}] never mind", "scripted:answer")
    assert moved_on.ok
    call = calls_of((await stored(sidecar, conversation_id))[1])[call_id]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR and "moved on" in call.error_text
    with pytest.raises(TurnwireError) as late:
        await submit_results(
            channel,
            results_request(
                conversation_id, chat_service_pb2.ToolResult(tool_call_id=call_id, output_json="1")
            ),
        )
    assert late.value.reason == "TOOL_CALL_NOT_PENDING"


EXPIRY_SECONDS = 1.0


@pytest.fixture(scope="module")
def expiring_sidecar(tmp_path_factory: pytest.TempPathFactory, records: Path) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("client-tools-expiry-e2e")
    config = _config(records, pending_expiry_seconds=EXPIRY_SECONDS)
    with running_sidecar(workdir, config, env=pythonpath_env()) as process:
        yield process


async def test_an_expired_pending_call_refuses_a_late_result_and_becomes_an_error_the_model_is_told(
    expiring_sidecar: SidecarProcess, records: Path
) -> None:
    async with grpc.aio.insecure_channel(expiring_sidecar.target) as channel:
        conversation_id, first = await pending_turn(channel)
        [call_id] = calls_of(first.message)
        assert first.message is not None
        created = first.message.create_time.ToDatetime().timestamp()
        await wait_until(
            lambda: time.time() > created + EXPIRY_SECONDS + 0.05, timeout=10, what="the expiry passed"
        )
        with pytest.raises(TurnwireError) as late:
            await submit_results(
                channel,
                results_request(
                    conversation_id, chat_service_pb2.ToolResult(tool_call_id=call_id, output_json="1")
                ),
            )
        assert (late.value.code, late.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "EXPIRED")
        async with TurnwireClient(expiring_sidecar.target) as client:
            continued = await collect(client.continue_last_turn(conversation_id, model="scripted:answer"))
        assert continued.ok
        call = calls_of((await stored(expiring_sidecar, conversation_id))[1])[call_id]
        assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR and "expired" in call.error_text
        sent = tool_parts(requests_of(records, conversation_id)[-1])[call_id]
        assert "expired" in sent["errorText"], "the model is told the call expired"


async def test_save_messages_with_an_approval_part_runs_the_approved_call(
    channel: grpc.aio.Channel, sidecar: SidecarProcess
) -> None:
    conversation_id, call_id, first = await approval_turn(channel)
    assert first.message is not None
    answer = message_pb2.Message(id=first.message.id, role=message_pb2.ROLE_ASSISTANT)
    part = answer.parts.add().tool_call
    part.CopyFrom(calls_of(first.message)[call_id])
    part.state = message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED
    part.approval.approved = True
    request = chat_service_pb2.SaveMessagesRequest(
        conversation_id=conversation_id, messages=[answer], model="scripted:answer"
    )
    result = await collect(TurnStream(stub(channel).SaveMessages(request)))
    assert result.ok and result.events[0].turn_start.continuation, result
    assert "tool_output_available" in kinds(result)
    call = calls_of((await stored(sidecar, conversation_id))[1])[call_id]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert json.loads(call.output_json)["result"] == 42
