"""The AG-UI door (docs/api/ag-ui.md), driven by AG-UI's own client, ``@ag-ui/client``'s
``HttpAgent`` (1.0.0, unmodified, run by ``tests/support/ag_ui_node.mjs``), against a real
``turnwire serve`` with ``http.listen`` and ``auth:`` on: a text run with reasoning and steps, the
sidecar's own calculator tool, a client tool round trip, a failed turn, a run started over AG-UI
read and resumed over gRPC, turns started over gRPC followed over AG-UI (running, and ended), the
client aborting a run, tenants, and bad input. ``HttpAgent`` checks every event against
``@ag-ui/core``'s schemas and its event order rules before a test sees it; a run it refuses fails
the test.

Before issue 36's AG-UI door the listener had no ``/v1/ag-ui`` route: every test here fails.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from support.endless import endless_step, is_prefix_of_repeats
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarFactory, SidecarProcess, running_sidecar
from support.tokens import new_token
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2, message_pb2

TOKEN_A = new_token()
TOKEN_B = new_token()
NODE_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "ag_ui_node.mjs"
SLOW_TEXT = "".join(f"w{i} " for i in range(8))
LOCATION_TOOL = {
    "name": "get_location",
    "description": "The user's location, from their device",
    "parameters": {"type": "object", "properties": {"precision": {"type": "string"}}},
}

SCRIPTS = {
    "echo": [
        {
            "reasoning": "The user greets me.",
            "text": "answered over AG-UI",
            "chunk_size": 6,
            "usage": {"input_tokens": 7, "output_tokens": 5, "reasoning_tokens": 2},
        }
    ],
    "calculate": [
        {"tool_calls": [{"name": "calculator", "input": {"expression": "6 * 7"}}]},
        {"text": "It is 42."},
    ],
    "locate": [
        {
            "text": "Let me ask your device.",
            "tool_calls": [{"name": "get_location", "input": {"precision": "city"}}],
        },
        {"text": "unreachable"},
    ],
    "thanks": [{"text": "You are in Paris."}],
    "weather": [
        {"tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]},
        {"text": "unreachable"},
    ],
    "fails": [
        {"text": "partial ", "error": {"message": "the model is down", "status": 400, "after_chunks": 1}}
    ],
    # Overloaded after its first chunk: the step restarts on scripted:echo (FALLBACK below).
    "falls_over": [
        {
            "text": "dropped partial",
            "chunk_size": 8,
            "error": {"message": "overloaded", "status": 529, "retryable": True, "after_chunks": 1},
        }
    ],
    "slow": [endless_step(SLOW_TEXT, 30)],
    "paced": [{"text": SLOW_TEXT * 3, "chunk_size": 3, "delay_ms": 20}],
}

FALLBACK = {"models": {"scripted:falls_over": ["scripted:echo"]}, "after_output": "restart"}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("ag-ui-e2e")
    tokens = {TOKEN_A: ("alice", "tenant-a"), TOKEN_B: ("bob", "tenant-b")}
    config = http_sidecar_config(workdir, tokens, SCRIPTS)
    config["fallback"] = FALLBACK
    config["tools"] = {"demo": True, "require_approval": ["get_weather"]}
    with running_sidecar(workdir, config) as process:
        yield process


def url_of(sidecar: SidecarProcess) -> str:
    return f"{http_base(sidecar)}/v1/ag-ui"


@pytest.fixture
async def grpc_a(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target, token=TOKEN_A) as opened:
        yield opened


async def start_agent(
    sidecar: SidecarProcess, thread: str, runs: list[dict[str, Any]], token: str = TOKEN_A
) -> Any:
    """``ag_ui_node.mjs`` started on ``runs`` (see its header); await :func:`agent_result`."""
    spec = {"url": url_of(sidecar), "token": token, "threadId": thread, "runs": runs}
    return await asyncio.create_subprocess_exec(
        shutil.which("node") or "node",
        str(NODE_SCRIPT),
        json.dumps(spec),
        cwd=NODE_SCRIPT.parents[2],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def agent_result(node: Any) -> dict[str, Any]:
    out, err = await asyncio.wait_for(node.communicate(), timeout=60)
    assert node.returncode == 0, err.decode()
    seen: dict[str, Any] = json.loads(out)
    return seen


async def run_agent(
    sidecar: SidecarProcess, thread: str, runs: list[dict[str, Any]], token: str = TOKEN_A
) -> dict[str, Any]:
    return await agent_result(await start_agent(sidecar, thread, runs, token))


def types(run: dict[str, Any]) -> list[str]:
    return [event["type"] for event in run["events"]]


def text_of(run: dict[str, Any]) -> str:
    return "".join(e["delta"] for e in run["events"] if e["type"] == "TEXT_MESSAGE_CONTENT")


async def test_a_text_run(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    seen = await run_agent(
        sidecar, "agui-text", [{"runId": "agui-text-r1", "text": "hi", "model": "scripted:echo"}]
    )
    run = seen["runs"][0]
    assert "error" not in run, run
    assert types(run)[0] == "RUN_STARTED" and types(run)[-1] == "RUN_FINISHED"
    for kind in (
        "STEP_STARTED",
        "REASONING_START",
        "REASONING_MESSAGE_CONTENT",
        "TEXT_MESSAGE_START",
        "STEP_FINISHED",
    ):
        assert kind in types(run)
    assert text_of(run) == "answered over AG-UI"
    finished = run["events"][-1]
    assert (finished["threadId"], finished["runId"]) == ("agui-text", "agui-text-r1")
    assert finished["outcome"] == {"type": "success"}
    assert finished["usage"][0]["inputTokens"] == 7 and finished["usage"][0]["reasoningTokens"] == 2
    # the agent built its messages from the events: the reasoning and the reply
    assert [(m["role"], m.get("content")) for m in run["newMessages"]] == [
        ("reasoning", "The user greets me."),
        ("assistant", "answered over AG-UI"),
    ]
    stored = await grpc_a.get_conversation("agui-text")
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert stored.messages[0].id == "agui-text-u0"  # the AG-UI message id is the stored id


async def test_the_sidecar_runs_its_calculator(sidecar: SidecarProcess) -> None:
    seen = await run_agent(sidecar, "agui-calc", [{"text": "6 * 7?", "model": "scripted:calculate"}])
    run = seen["runs"][0]
    assert "error" not in run, run
    kinds = types(run)
    assert kinds.index("TOOL_CALL_START") < kinds.index("TOOL_CALL_END") < kinds.index("TOOL_CALL_RESULT")
    start = next(e for e in run["events"] if e["type"] == "TOOL_CALL_START")
    assert start["toolCallName"] == "calculator"
    args = "".join(e["delta"] for e in run["events"] if e["type"] == "TOOL_CALL_ARGS")
    assert json.loads(args) == {"expression": "6 * 7"}
    result = next(e for e in run["events"] if e["type"] == "TOOL_CALL_RESULT")
    assert "42" in result["content"]
    assert text_of(run) == "It is 42."
    assert run["events"][-1]["outcome"] == {"type": "success"}  # nothing left for the client
    assert [m["role"] for m in run["newMessages"]] == ["assistant", "tool", "assistant"]


async def test_a_client_tool_round_trip(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    seen = await run_agent(
        sidecar,
        "agui-client-tool",
        [
            {"text": "Where am I?", "model": "scripted:locate", "tools": [LOCATION_TOOL]},
            {"answerPending": '{"city": "Paris"}', "model": "scripted:thanks", "tools": [LOCATION_TOOL]},
        ],
    )
    asked, answered = seen["runs"]
    assert "error" not in asked and "error" not in answered, seen
    call = next(e for e in asked["events"] if e["type"] == "TOOL_CALL_START")
    assert call["toolCallName"] == "get_location"
    assert asked["events"][-1]["outcome"] == {"type": "success", "pendingToolCallIds": [call["toolCallId"]]}
    assert "TOOL_CALL_RESULT" not in types(asked)  # the client runs it
    assert text_of(answered) == "You are in Paris."
    stored = await grpc_a.get_conversation("agui-client-tool")
    parts = [part for message in stored.messages for part in message.parts]
    results = [part.tool_call for part in parts if part.HasField("tool_call") and part.tool_call.output_json]
    assert [json.loads(r.output_json) for r in results] == [{"city": "Paris"}]


async def test_a_failed_turn_ends_its_run_with_run_error(sidecar: SidecarProcess) -> None:
    seen = await run_agent(sidecar, "agui-fails", [{"text": "hi", "model": "scripted:fails"}])
    run = seen["runs"][0]
    assert types(run)[-3:] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_ERROR"]
    error = run["events"][-1]
    assert "the model is down" in error["message"] and error["code"] == "provider_error"
    assert "RUN_FINISHED" not in types(run)


async def test_a_step_restarted_on_a_fallback_finishes_its_run(sidecar: SidecarProcess) -> None:
    """A provider fallback restarts a step after output (``after_output: restart``): the earlier
    attempt's message is ended before the new one's, so ``HttpAgent`` accepts the run. Before, it
    failed the run: "Cannot send 'RUN_FINISHED' while text messages are still active" (developer
    trial)."""
    seen = await run_agent(sidecar, "agui-fallback", [{"text": "hi", "model": "scripted:falls_over"}])
    run = seen["runs"][0]
    assert "error" not in run, run
    assert types(run)[-1] == "RUN_FINISHED" and run["events"][-1]["outcome"] == {"type": "success"}
    assert text_of(run).endswith("answered over AG-UI")  # the fallback's answer, after what was shown
    assert run["newMessages"][-1] == {
        "id": run["newMessages"][-1]["id"],
        "role": "assistant",
        "content": "answered over AG-UI",
    }


async def test_an_ag_ui_run_is_read_and_resumed_over_grpc(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    run_id = f"agui-{uuid.uuid4().hex[:8]}"
    node = await start_agent(
        sidecar, "agui-to-grpc", [{"runId": run_id, "text": "go", "model": "scripted:paced"}]
    )
    grpc_events: list[event_pb2.TurnEvent] = []

    async def read_over_grpc() -> bool:
        try:
            grpc_events.extend([event async for event in grpc_a.resume_turn(run_id)])
        except TurnwireError:
            return False  # not started yet
        return True

    await wait_until(read_over_grpc, timeout=30, what="the AG-UI run is never found over gRPC")
    seen = await agent_result(node)
    run = seen["runs"][0]
    assert "error" not in run, run
    grpc_text = "".join(e.text_delta.delta for e in grpc_events if e.HasField("text_delta"))
    assert grpc_text == text_of(run) == SLOW_TEXT * 3
    assert grpc_events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    # resumed after a sequence number: the rest, each once
    middle = grpc_events[len(grpc_events) // 2].sequence_number
    rest = [event async for event in grpc_a.resume_turn(run_id, middle)]
    assert [e.sequence_number for e in rest] == [
        e.sequence_number for e in grpc_events if e.sequence_number > middle
    ]


async def test_a_running_grpc_turn_is_followed_over_ag_ui(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    run_id = f"grpc-{uuid.uuid4().hex[:8]}"
    stream = grpc_a.chat("grpc-to-agui", "go", request_id=run_id, model="scripted:slow")
    assert (await anext(stream)).HasField("turn_start")  # it runs until cancelled
    # the same runId over AG-UI re-attaches to the running turn, from its start
    seen = await run_agent(
        sidecar, "grpc-to-agui", [{"runId": run_id, "text": "go", "abortOn": "TEXT_MESSAGE_CONTENT"}]
    )
    run = seen["runs"][0]
    assert types(run)[:3] == ["RUN_STARTED", "STEP_STARTED", "TEXT_MESSAGE_START"]
    assert run["events"][0]["runId"] == run_id
    assert is_prefix_of_repeats(text_of(run), SLOW_TEXT)
    assert await grpc_a.cancel_chat(run_id)  # leaving a re-attached run left the turn running
    ends = [event async for event in stream if event.HasField("turn_end")]
    assert ends[0].turn_end.status == event_pb2.TURN_STATUS_ABORTED


async def test_a_continuation_after_an_approval_shows_the_approved_call_with_its_arguments(
    grpc_a: TurnwireClient, sidecar: SidecarProcess
) -> None:
    """A continuation (``SubmitToolApprovals`` over gRPC) read by its ``runId`` shows the approved
    call it ran with its arguments (``TOOL_CALL_ARGS``) before its result. Before, the call had
    none: its input was in the stream of the turn that asked for the approval."""
    asked = await collect(grpc_a.chat("agui-approval", "Weather?", model="scripted:weather"))
    [request] = [e.tool_approval_request for e in asked.events if e.HasField("tool_approval_request")]
    run_id = f"agui-approved-{uuid.uuid4().hex[:8]}"
    continued = grpc_a.submit_tool_approvals(
        "agui-approval", {request.tool_call_id: True}, request_id=run_id, model="scripted:thanks"
    )
    assert (await collect(continued)).status == event_pb2.TURN_STATUS_COMPLETED
    run = (await run_agent(sidecar, "agui-approval", [{"runId": run_id, "text": "go"}]))["runs"][0]
    assert "error" not in run, run
    call_events = [e for e in run["events"] if e.get("toolCallId") == request.tool_call_id]
    assert [e["type"] for e in call_events] == [
        "TOOL_CALL_START",
        "TOOL_CALL_ARGS",
        "TOOL_CALL_END",
        "TOOL_CALL_RESULT",
    ]
    assert json.loads(call_events[1]["delta"]) == {"city": "Paris"}
    assert json.loads(call_events[3]["content"])["city"] == "Paris"


async def test_an_ended_grpc_turn_reads_as_the_same_run(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    run_id = f"grpc-{uuid.uuid4().hex[:8]}"
    stream = grpc_a.chat("grpc-ended", "go", request_id=run_id, model="scripted:calculate")
    grpc_text = "".join([e.text_delta.delta async for e in stream if e.HasField("text_delta")])
    seen = await run_agent(sidecar, "grpc-ended", [{"runId": run_id, "text": "go"}])
    run = seen["runs"][0]
    assert "error" not in run, run
    assert text_of(run) == grpc_text == "It is 42."
    assert "TOOL_CALL_RESULT" in types(run)
    assert run["events"][-1]["runId"] == run_id and run["events"][-1]["outcome"] == {"type": "success"}
    again = await run_agent(sidecar, "grpc-ended", [{"runId": run_id, "text": "go"}])
    assert again["runs"][0]["events"] == run["events"]  # the same log, the same run
    stored = await grpc_a.get_conversation("grpc-ended")
    assert [m.role for m in stored.messages] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
    ]  # ran once


async def test_aborting_a_run_cancels_its_turn(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    run_id = f"agui-abort-{uuid.uuid4().hex[:8]}"
    seen = await run_agent(
        sidecar,
        "agui-abort",
        [{"runId": run_id, "text": "go", "model": "scripted:slow", "abortOn": "TEXT_MESSAGE_CONTENT"}],
    )
    run = seen["runs"][0]
    assert "RUN_FINISHED" not in types(run)
    ends: list[event_pb2.TurnEvent] = []

    async def ended() -> bool:
        ends[:] = [e async for e in grpc_a.resume_turn(run_id) if e.HasField("turn_end")]
        return bool(ends)

    await wait_until(ended, timeout=30, what="the aborted run's turn never ended")
    assert ends[0].turn_end.status == event_pb2.TURN_STATUS_ABORTED  # disconnect policy CANCEL
    stored = await grpc_a.get_conversation("agui-abort")
    assert is_prefix_of_repeats(stored.messages[-1].parts[0].text.text, SLOW_TEXT)


async def test_tenants_and_tokens(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    await run_agent(sidecar, "agui-tenant", [{"runId": "agui-tenant-r1", "text": "hi"}])
    # tenant B's thread of the same name is its own; so is its run of the same id
    seen_b = await run_agent(
        sidecar, "agui-tenant", [{"runId": "agui-tenant-r1", "text": "hi"}], token=TOKEN_B
    )
    assert "error" not in seen_b["runs"][0]
    async with TurnwireClient(sidecar.target, token=TOKEN_B) as grpc_b:
        assert len((await grpc_b.get_conversation("agui-tenant")).messages) == 2
    assert len((await grpc_a.get_conversation("agui-tenant")).messages) == 2
    refused = await run_agent(sidecar, "agui-tenant", [{"text": "hi"}], token="not-a-token")
    error = refused["runs"][0]["error"]
    assert error["status"] == 401
    assert error["payload"]["type"] == "RUN_ERROR" and error["payload"]["code"] == "token_invalid"


async def test_bad_input_is_a_clear_4xx(sidecar: SidecarProcess) -> None:
    # through HttpAgent: a thread id Turnwire does not take
    seen = await run_agent(sidecar, "bad id!", [{"text": "hi"}])
    error = seen["runs"][0]["error"]
    assert error["status"] == 400 and error["payload"]["type"] == "RUN_ERROR"
    assert "threadId" in error["payload"]["message"]
    # a body in the wrong shape, the protobuf encoding only, a body that is not JSON
    headers = {"Authorization": f"Bearer {TOKEN_A}", "Accept": "text/event-stream"}
    async with httpx.AsyncClient() as http:
        wrong = await http.post(url_of(sidecar), headers=headers, json={"threadId": "t", "messages": "hi"})
        assert wrong.status_code == 400
        assert wrong.json() == {
            "type": "RUN_ERROR",
            "message": wrong.json()["message"],
            "code": "invalid_request",
        }
        assert wrong.json()["message"].startswith("runId: Field required")
        proto = await http.post(
            url_of(sidecar),
            headers={**headers, "Accept": "application/vnd.ag-ui.event+proto"},
            json={"threadId": "t", "runId": "r", "messages": [{"id": "u", "role": "user", "content": "x"}]},
        )
        assert proto.status_code == 406 and "text/event-stream" in proto.json()["message"]
        not_json = await http.post(url_of(sidecar), headers=headers, content=b"{")
        assert not_json.status_code == 400 and "not JSON" in not_json.json()["message"]


async def test_a_run_past_the_event_retention_reads_from_the_stored_thread(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    """Re-attaching by ``runId`` to a run whose events are past ``durability.event_retention_seconds``
    answers the run made from its stored reply, never running it again. Before, it answered the
    ``RUN_ERROR`` of the refused start (the run exists) although the thread still stored it."""
    config = http_sidecar_config(tmp_path, {TOKEN_A: ("alice", "tenant-a")}, SCRIPTS)
    config["durability"] = {"event_retention_seconds": 0.5}
    sidecar = await sidecar_factory(config).start()
    run_id = f"old-{uuid.uuid4().hex[:8]}"
    async with TurnwireClient(sidecar.target, token=TOKEN_A) as grpc_a:
        stream = grpc_a.chat("ag-old", "go", request_id=run_id, model="scripted:calculate")
        assert [e async for e in stream][-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED

        async def expired() -> bool:
            try:
                async for _ in grpc_a.resume_turn(run_id):
                    pass
            except TurnwireError:
                return True
            return False

        await wait_until(expired, timeout=10, what="the run's events to expire")
        seen = await run_agent(sidecar, "ag-old", [{"runId": run_id, "text": "go"}])
        run = seen["runs"][0]
        assert "error" not in run, run
        assert text_of(run) == "It is 42." and "TOOL_CALL_RESULT" in types(run)
        assert run["events"][-1]["outcome"] == {"type": "success"}
        stored = await grpc_a.get_conversation("ag-old")
        assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
