"""The AI SDK door (docs/api/ai-sdk.md): the Vercel AI SDK's ``Chat`` with its default transport
(``DefaultChatTransport``, the ``ai`` npm package 6.x, unmodified, driven by
``tests/support/ai_sdk_node.mjs``) against a real ``turnwire serve`` with ``http.listen`` and
``auth:`` on: a message and its streamed text, the sidecar's own tool, a client tool answered with
``addToolOutput``, an approval answered with ``addToolApprovalResponse``, resuming after a
dropped connection, a turn started here read over gRPC and the reverse, tenants, and the raw
stream (headers, ``[DONE]``, errors) read with httpx.

Before issue 36 the listener had no ``/v1/ai-sdk`` routes: every test here fails with a 404.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from support.endless import endless_step
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import new_token
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2

TOKEN_A = new_token()
TOKEN_B = new_token()
NODE_SCRIPT = Path(__file__).resolve().parents[1] / "support" / "ai_sdk_node.mjs"
ANSWER = "answered over the AI SDK door"
LOCATION_TOOL = {
    "description": "The user's location, from their device",
    "inputSchema": {"type": "object", "properties": {"precision": {"type": "string"}}},
}

SCRIPTS = {
    "echo": [
        {
            "reasoning": "The user greets me.",
            "text": ANSWER,
            "chunk_size": 6,
            "usage": {"input_tokens": 7, "output_tokens": 5},
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
    "after": [{"text": "Done with the weather."}],
    "mixed": [
        {
            "tool_calls": [
                {"name": "get_location", "input": {"precision": "city"}},
                {"name": "get_weather", "input": {"city": "Paris"}},
            ]
        },
        {"text": "unreachable"},
    ],
    "fails": [
        {"text": "partial ", "error": {"message": "the model is down", "status": 400, "after_chunks": 1}}
    ],
    "slow": [endless_step("".join(f"w{i} " for i in range(30)), 20)],
    # Overloaded after its first chunk: the step restarts on scripted:echo (the fallback below).
    "falls_over": [
        {
            "text": "dropped partial",
            "chunk_size": 8,
            "error": {"message": "overloaded", "status": 529, "retryable": True, "after_chunks": 1},
        }
    ],
}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("ai-sdk-e2e")
    tokens = {TOKEN_A: ("alice", "tenant-a"), TOKEN_B: ("bob", "tenant-b")}
    config = http_sidecar_config(workdir, tokens, SCRIPTS)
    config["tools"] = {"demo": True, "require_approval": ["get_weather"]}
    config["fallback"] = {"models": {"scripted:falls_over": ["scripted:echo"]}, "after_output": "restart"}
    with running_sidecar(workdir, config) as process:
        yield process


def api(sidecar: SidecarProcess) -> str:
    return f"{http_base(sidecar)}/v1/ai-sdk/chat"


@pytest.fixture
async def grpc_a(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target, token=TOKEN_A) as opened:
        yield opened


async def start_node(
    sidecar: SidecarProcess, scenario: str, chat_id: str, options: dict[str, Any], token: str = TOKEN_A
) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        shutil.which("node") or "node",
        str(NODE_SCRIPT),
        api(sidecar),
        token,
        scenario,
        chat_id,
        json.dumps(options),
        cwd=NODE_SCRIPT.parents[2],
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def finished(node: asyncio.subprocess.Process) -> dict[str, Any]:
    out, err = await asyncio.wait_for(node.communicate(), timeout=120)
    assert node.returncode == 0, err.decode()
    seen: dict[str, Any] = json.loads(out)
    return seen


async def run_node(
    sidecar: SidecarProcess, scenario: str, chat_id: str, options: dict[str, Any], token: str = TOKEN_A
) -> dict[str, Any]:
    return await finished(await start_node(sidecar, scenario, chat_id, options, token))


async def resumed(node: asyncio.subprocess.Process) -> None:
    """Wait for the script's ``RESUMED`` line: its resumed stream is showing text."""
    assert node.stderr is not None
    line = await asyncio.wait_for(node.stderr.readline(), timeout=60)
    assert line == b"RESUMED\n", line


def text_of(message: dict[str, Any]) -> str:
    return "".join(part["text"] for part in message["parts"] if part["type"] == "text")


def tool_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    return [part for part in message["parts"] if part["type"].startswith("tool-")]


async def running_request(client: TurnwireClient, conversation: str) -> str:
    """The request id of the turn running on ``conversation`` (once one is)."""

    async def find() -> str | None:
        stored = await client.get_conversation(conversation)
        running = [
            t.request_id for t in stored.partial_replies if t.status == event_pb2.TURN_STATUS_UNSPECIFIED
        ]
        running += [
            t.request_id for t in stored.turns_without_reply if t.status == event_pb2.TURN_STATUS_UNSPECIFIED
        ]
        return running[0] if running else None

    request_id: str | None = await wait_until(find, what=f"a running turn on {conversation}")
    assert request_id is not None
    return request_id


async def test_a_message_streams_its_reply_into_the_chat(sidecar: SidecarProcess) -> None:
    seen = await run_node(sidecar, "send", "ai-text", {"body": {"model": "scripted:echo"}})
    assert seen["status"] == "ready" and seen["error"] is None
    user, reply = seen["messages"]
    assert user["role"] == "user" and reply["role"] == "assistant"
    assert reply["id"].startswith("tw-a-aisdk-")
    assert [part["type"] for part in reply["parts"]] == ["step-start", "reasoning", "text"]
    assert reply["parts"][1]["text"] == "The user greets me." and reply["parts"][1]["state"] == "done"
    assert text_of(reply) == ANSWER


async def test_a_step_restarted_on_a_fallback_leaves_no_part_streaming(sidecar: SidecarProcess) -> None:
    """A provider fallback restarts a step after output (``after_output: restart``): the earlier
    attempt's text part is ended (the AI SDK cannot take it back), so every part of the message is
    ``done``. Before, it stayed ``streaming`` after the turn had ended (developer trial)."""
    seen = await run_node(sidecar, "send", "ai-fallback", {"body": {"model": "scripted:falls_over"}})
    assert seen["status"] == "ready" and seen["error"] is None
    reply = seen["messages"][-1]
    states = [(part["type"], part.get("state")) for part in reply["parts"]]
    assert states == [
        ("step-start", None),
        ("text", "done"),
        ("step-start", None),
        ("reasoning", "done"),
        ("text", "done"),
    ]
    assert reply["parts"][-1]["text"] == ANSWER


async def test_the_chunks_as_the_transport_validates_them(sidecar: SidecarProcess) -> None:
    seen = await run_node(sidecar, "chunks", "ai-chunks", {"body": {"model": "scripted:echo"}})
    kinds = [chunk["type"] for chunk in seen["chunks"]]
    assert kinds[0] == "start" and kinds[1] == "start-step" and kinds[-2:] == ["finish-step", "finish"]
    assert {
        "reasoning-start",
        "reasoning-delta",
        "reasoning-end",
        "text-start",
        "text-delta",
        "text-end",
    } <= set(kinds)
    assert seen["chunks"][-1] == {"type": "finish", "finishReason": "stop"}
    assert "".join(c["delta"] for c in seen["chunks"] if c["type"] == "text-delta") == ANSWER


async def test_the_sidecar_runs_its_own_tool_in_the_stream(sidecar: SidecarProcess) -> None:
    seen = await run_node(sidecar, "send", "ai-calc", {"body": {"model": "scripted:calculate"}})
    reply = seen["messages"][-1]
    (call,) = tool_parts(reply)
    assert call["type"] == "tool-calculator" and call["state"] == "output-available"
    assert call["input"] == {"expression": "6 * 7"} and call["output"]["result"] == 42
    assert [p["type"] for p in reply["parts"]].count("step-start") == 2
    assert text_of(reply) == "It is 42."


async def test_a_client_tool_round_trip_with_add_tool_output(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    seen = await run_node(
        sidecar,
        "clientTool",
        "ai-client-tool",
        {
            "body": {"model": "scripted:locate", "tools": {"get_location": LOCATION_TOOL}},
            "followUpModel": "scripted:thanks",
            "expect": "You are in Paris.",
        },
    )
    assert seen["error"] is None
    user, reply = seen["messages"]  # the continuation streams into the message it continues
    (call,) = tool_parts(reply)
    assert call["type"] == "tool-get_location" and call["state"] == "output-available"
    assert call["output"] == {"city": "Paris", "input": {"precision": "city"}}
    assert text_of(reply) == "Let me ask your device.You are in Paris."
    stored = await grpc_a.get_conversation("ai-client-tool")
    roles = [m.role for m in stored.messages]
    assert roles == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT, message_pb2.ROLE_ASSISTANT]
    stored_call = next(p.tool_call for p in stored.messages[1].parts if p.HasField("tool_call"))
    assert stored_call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
    assert json.loads(stored_call.output_json) == {"city": "Paris", "input": {"precision": "city"}}
    assert stored.messages[0].id == user["id"]  # the UIMessage's id is the stored message's


@pytest.mark.parametrize("approved", [True, False])
async def test_an_approval_with_add_tool_approval_response(
    sidecar: SidecarProcess, grpc_a: TurnwireClient, approved: bool
) -> None:
    chat_id = f"ai-approval-{approved}"
    seen = await run_node(
        sidecar,
        "approval",
        chat_id,
        {
            "body": {"model": "scripted:weather"},
            "followUpModel": "scripted:after",
            "approved": approved,
            "expect": "Done with the weather.",
        },
    )
    assert seen["error"] is None
    assert seen["requested"]["type"] == "tool-get_weather" and seen["requested"]["input"] == {"city": "Paris"}
    (call,) = tool_parts(seen["messages"][-1])
    # The continuation announces the call with its input (before: null, which replaced it).
    assert call["input"] == {"city": "Paris"}
    if approved:
        assert call["state"] == "output-available" and call["output"]["city"] == "Paris"
    else:
        assert call["state"] == "output-denied"
    stored = await grpc_a.get_conversation(chat_id)
    stored_call = next(p.tool_call for p in stored.messages[1].parts if p.HasField("tool_call"))
    expected = (
        message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        if approved
        else message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED
    )
    assert stored_call.state == expected


async def test_a_client_tool_output_and_an_approval_in_one_request(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    """The results are stored first (``SubmitToolResults`` without continuing), then the approval
    continues the turn (``SubmitToolApprovals``)."""
    options = {
        "body": {"model": "scripted:mixed", "tools": {"get_location": LOCATION_TOOL}},
        "followUpModel": "scripted:after",
        "expect": "Done with the weather.",
    }
    seen = await run_node(sidecar, "mixed", "ai-mixed", options)
    assert seen["error"] is None
    states = {part["type"]: part["state"] for part in tool_parts(seen["messages"][-1])}
    assert states == {"tool-get_location": "output-available", "tool-get_weather": "output-available"}
    stored = await grpc_a.get_conversation("ai-mixed")
    calls = {p.tool_call.tool_name: p.tool_call for p in stored.messages[1].parts if p.HasField("tool_call")}
    assert json.loads(calls["get_location"].output_json) == {"city": "Paris"}
    assert json.loads(calls["get_weather"].output_json)["city"] == "Paris"


async def test_resume_after_a_dropped_connection(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    """With ``disconnectPolicy: "continue"`` the turn outlives the aborted fetch, and the
    transport's reconnect replays it from its start, then follows it live."""
    node = await start_node(
        sidecar,
        "dropAndResume",
        "ai-drop",
        {"body": {"model": "scripted:slow", "disconnectPolicy": "continue"}},
    )
    await resumed(node)
    await grpc_a.cancel_chat(await running_request(grpc_a, "ai-drop"))
    seen = await finished(node)
    reply = seen["messages"][-1]
    assert text_of(reply).startswith(seen["before"]) and len(text_of(reply)) > len(seen["before"])
    assert seen["status"] == "ready" and seen["error"] is None


async def test_leaving_the_stream_cancels_the_turn_by_default_and_regenerate_answers_it(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    async with (
        httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN_A}"}) as http,
        http.stream("POST", api(sidecar), json=body("ai-leave", "scripted:slow")) as response,
    ):
        async for line in response.aiter_lines():
            if '"text-delta"' in line:
                break

    async def ended() -> Any:
        stored = await grpc_a.get_conversation("ai-leave")
        ends = [t.status for t in stored.partial_replies] + [t.status for t in stored.turns_without_reply]
        return [status for status in ends if status != event_pb2.TURN_STATUS_UNSPECIFIED] or None

    assert await wait_until(ended, what="the left turn to end") == [event_pb2.TURN_STATUS_ABORTED]
    # chat.regenerate() after it: the same user message, answered by a new turn.
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN_A}"}) as http:
        again = body("ai-leave", "scripted:thanks", trigger="regenerate-message")
        response = await http.post(api(sidecar), json=again)
    deltas = [
        json.loads(line[6:])
        for line in response.text.splitlines()
        if line.startswith('data: {"type":"text-delta"')
    ]
    assert "".join(delta["delta"] for delta in deltas) == "You are in Paris."
    stored = await grpc_a.get_conversation("ai-leave")
    assert [m.id for m in stored.messages if m.role == message_pb2.ROLE_USER] == ["ai-leave-u1"]


async def test_a_grpc_turn_is_resumed_over_this_door(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    turn = grpc_a.chat("ai-from-grpc", "go", model="scripted:slow", request_id="ai-from-grpc-r")
    assert (await anext(turn)).HasField("turn_start")
    node = await start_node(sidecar, "resume", "ai-from-grpc", {"running": True})
    await resumed(node)
    await grpc_a.cancel_chat("ai-from-grpc-r")
    seen = await finished(node)
    (reply,) = seen["messages"]
    assert reply["id"] == "tw-a-ai-from-grpc-r" and text_of(reply).startswith("w0 w1 ")
    async for _ in turn:
        pass
    idle = await run_node(sidecar, "resume", "ai-from-grpc", {})
    assert idle["messages"] == [] and idle["status"] == "ready"  # no running turn: 204


async def test_a_turn_of_this_door_is_read_over_grpc(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    seen = await run_node(sidecar, "send", "ai-to-grpc", {"body": {"model": "scripted:echo"}})
    user, reply = seen["messages"]
    stored = await grpc_a.get_conversation("ai-to-grpc")
    assert [m.id for m in stored.messages] == [user["id"], reply["id"]]
    request_id = reply["id"].removeprefix("tw-a-")
    result = await collect(grpc_a.resume_turn(request_id))
    assert result.text == ANSWER == text_of(reply)


def body(chat_id: str, model: str, text: str = "hi", **extra: Any) -> dict[str, Any]:
    """A body as the default transport sends it."""
    message = {"id": f"{chat_id}-u1", "role": "user", "parts": [{"type": "text", "text": text}]}
    return {"id": chat_id, "messages": [message], "trigger": "submit-message", "model": model, **extra}


async def test_the_raw_stream_and_its_headers(sidecar: SidecarProcess) -> None:
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN_A}"}) as http:
        response = await http.post(api(sidecar), json=body("ai-raw", "scripted:echo"))
    assert response.status_code == 200
    assert response.headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert response.headers["content-type"].startswith("text/event-stream")
    data = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert json.loads(data[0])["type"] == "start"


async def test_a_failed_turn_is_an_error_chunk(sidecar: SidecarProcess) -> None:
    seen = await run_node(sidecar, "send", "ai-fails", {"body": {"model": "scripted:fails"}})
    assert seen["status"] == "error" and "the model is down" in seen["error"]


async def test_regenerate_answers_a_failed_turn_again(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    """``chat.regenerate()`` resends the last user message: a turn that did not complete runs again
    on it (stored once); a completed one is refused, since a stored conversation cannot branch."""
    options = {"body": {"model": "scripted:fails"}, "followUpModel": "scripted:thanks"}
    seen = await run_node(sidecar, "regenerate", "ai-regenerate", options)
    assert seen["first"]["status"] == "error" and "the model is down" in seen["first"]["error"]
    assert seen["status"] == "ready" and text_of(seen["messages"][-1]) == "You are in Paris."
    stored = await grpc_a.get_conversation("ai-regenerate")
    assert [m.id for m in stored.messages if m.role == message_pb2.ROLE_USER] == [seen["messages"][0]["id"]]
    options = {"body": {"model": "scripted:thanks"}, "followUpModel": "scripted:thanks"}
    again = await run_node(sidecar, "regenerate", "ai-regenerate-done", options)
    assert again["first"]["status"] == "ready" and again["status"] == "error"
    assert "answer" in again["error"].lower()


async def test_tenants_and_tokens(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    turn = grpc_a.chat("ai-tenant", "go", model="scripted:slow", request_id="ai-tenant-r")
    assert (await anext(turn)).HasField("turn_start")
    try:
        async with httpx.AsyncClient() as http:
            mine = await http.get(
                f"{api(sidecar)}/ai-tenant/stream", headers={"authorization": f"Bearer {TOKEN_B}"}
            )
            assert mine.status_code == 204  # another tenant's conversation: no turn to see
            stranger = await http.post(
                api(sidecar), json=body("ai-x", "scripted:echo"), headers={"authorization": "Bearer nope"}
            )
            assert stranger.status_code == 401 and stranger.headers["content-type"].startswith("text/plain")
    finally:
        await grpc_a.cancel_chat("ai-tenant-r")
        async for _ in turn:
            pass
    seen = await run_node(sidecar, "send", "ai-tenant", {"body": {"model": "scripted:thanks"}}, token=TOKEN_B)
    assert text_of(seen["messages"][-1]) == "You are in Paris."  # B's own conversation of that id
    stored = await grpc_a.get_conversation("ai-tenant")
    assert all("Paris" not in p.text.text for m in stored.messages for p in m.parts)


async def test_bad_requests_say_what_to_fix(sidecar: SidecarProcess) -> None:
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {TOKEN_A}"}) as http:
        regenerate = body("ai-bad", "", trigger="regenerate-message")
        regenerate["messages"][0] |= {"role": "assistant", "parts": [{"type": "text", "text": "x"}]}
        refused = await http.post(api(sidecar), json=regenerate)
        assert refused.status_code == 400 and "regenerate-message" in refused.text
        image = body("ai-bad", "")
        image["messages"][0]["parts"] = [{"type": "reasoning", "text": "x"}]
        refused = await http.post(api(sidecar), json=image)
        assert refused.status_code == 400 and "messages[0].parts[0].type" in refused.text
        huge = await http.post(api(sidecar), json=body("ai-bad", "", text="x" * (5 << 20)))
        assert huge.status_code == 400 and "limits.max_message_bytes" in huge.text  # the servicer's limit
        bad_id = await http.post(api(sidecar), json=body("bad id!", ""))
        assert bad_id.status_code == 400 and "conversation_id" in bad_id.text
    seen = await run_node(sidecar, "send", "bad id!", {}, token=TOKEN_A)
    assert seen["status"] == "error" and "conversation_id" in seen["error"]
