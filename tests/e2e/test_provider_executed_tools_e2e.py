"""Issue 31a end to end: tools the provider runs itself, and the Responses built-ins the application
runs, through a real ``turnwire serve`` on the official SDKs against a replay server speaking each
API's wire format (tests/providers/cases_extra/sse). Each test checks the streamed events, the
stored message (``GetConversation``), what the hooks were given (``support.step_records``) and the
body of the next request.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from providers.helpers import a_blocks, a_text_stream, r_text_stream
from providers.replay import ReplayServer, Reply
from support.hooks import pythonpath_env
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2

CASES = Path(__file__).resolve().parents[1] / "providers" / "cases_extra" / "sse"
SEARCH_ID, FETCH_ID = "srvtoolu_01WsQ8rT5yU2iO9pA3sD6fG1", "srvtoolu_01WfH4jK7lZ0xC3vB6nM9qW2"
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, replay: ReplayServer) -> Iterator[SidecarProcess]:
    config = {
        "default_model": "anthropic:claude-test",
        "providers": {
            "anthropic": {
                "type": "anthropic",
                "api_key_env": "E2E_KEY",
                "base_url": replay.url,
                "max_retries": 0,
            },
            "responses": {
                "type": "openai-responses",
                "api_key_env": "E2E_KEY",
                "base_url": f"{replay.url}/v1",
                "max_retries": 0,
            },
        },
        "tools": {"demo": False},
        "middleware": [
            {"path": "support.provider_options:ProviderOptionsFromBody"},
            {"path": "support.hooks:ModelFromBody"},
            {"path": "support.step_records:RecordToolHooks"},
        ],
    }
    env = {"E2E_KEY": "sk-dummy", **pythonpath_env()}
    with running_sidecar(tmp_path_factory.mktemp("provider-executed-e2e"), config, env) as process:
        yield process


def _serve(replay: ReplayServer, *streams: bytes) -> None:
    replay.replies.clear()
    replay.requests.clear()
    replay.enqueue(*(Reply.sse(stream) for stream in streams))


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _events(events: list[event_pb2.TurnEvent], kind: str) -> list[Any]:
    return [getattr(e, kind) for e in events if e.WhichOneof("event") == kind]


async def test_anthropic_server_tools_are_streamed_stored_shown_to_hooks_and_sent_back(
    sidecar: SidecarProcess, replay: ReplayServer, tmp_path: Path
) -> None:
    _serve(replay, (CASES / "anthropic_web_search_and_fetch_results.sse").read_bytes(), a_text_stream("No."))
    conversation = f"server-tools-{next(_ids)}"
    record = tmp_path / "hooks.jsonl"
    body = {"record_to": str(record)}
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "What changed in example-lib 3.2?", body=body))
        stored = await client.get_conversation(conversation)
        later = await collect(client.chat(conversation, "And in 3.1?"))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, sidecar.log_text())
    assert later.ok, (later.error, sidecar.log_text())

    starts = _events(result.events, "tool_input_start")
    assert [(s.tool_call_id, s.tool_name, s.provider_executed) for s in starts] == [
        (SEARCH_ID, "web_search", True),
        (FETCH_ID, "web_fetch", True),
    ]
    assert all(e.provider_executed for e in _events(result.events, "tool_input_available"))
    outputs = _events(result.events, "tool_output_available")
    assert [(o.tool_call_id, o.provider_executed) for o in outputs] == [(SEARCH_ID, True), (FETCH_ID, True)]
    assert json.loads(outputs[0].output_json)[0]["url"] == "https://example.org/example-lib/changelog"
    (finish,) = _events(result.events, "step_finish")
    assert (
        finish.provider_metadata.fields["anthropic"]
        .struct_value.fields["usage"]
        .struct_value.fields["server_tool_use"]
        .struct_value.fields["web_fetch_requests"]
        .number_value
        == 1
    )

    reply = stored.messages[-1]
    calls = [p.tool_call for p in reply.parts if p.WhichOneof("kind") == "tool_call"]
    assert [(c.tool_name, c.provider_executed, c.state) for c in calls] == [
        ("web_search", True, message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE),
        ("web_fetch", True, message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE),
    ]
    step = next(p.step_start for p in reply.parts if p.WhichOneof("kind") == "step_start")
    assert step.response_id == "msg_01ServerTools7xK"
    assert "anthropic" in step.provider_metadata.fields
    assert [(c.tool_name, c.provider_executed) for c in result.tool_calls] == [
        ("web_search", True),
        ("web_fetch", True),
    ]

    hooks = _records(record)
    assert [h["hook"] for h in hooks] == ["on_step_finish", "on_chat_response"], "no before_tool_call"
    assert [(c["id"], c["provider_executed"]) for c in hooks[0]["tool_calls"]] == [
        (SEARCH_ID, True),
        (FETCH_ID, True),
    ]
    assert hooks[0]["tool_results"] == [SEARCH_ID, FETCH_ID]
    assert [c["state"] for c in hooks[1]["tool_calls"]] == ["TOOL_CALL_STATE_OUTPUT_AVAILABLE"] * 2

    turns = replay.requests[1].json["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["type"] for b in a_blocks(turns[1])] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_fetch_tool_result",
        "text",
    ]
    assert a_blocks(turns[1])[2]["content"][0]["encrypted_content"].startswith("EpMCCioIAhgB")


async def test_responses_built_ins_the_application_runs_wait_for_its_answers(
    sidecar: SidecarProcess, replay: ReplayServer, tmp_path: Path
) -> None:
    _serve(
        replay,
        (CASES / "openai_responses_client_run_built_ins.sse").read_bytes(),
        r_text_stream("Raised to 64."),
    )
    conversation = f"client-run-{next(_ids)}"
    record = tmp_path / "hooks.jsonl"
    body = {"use_model": "responses:gpt-5.1-codex", "record_to": str(record)}
    async with TurnwireClient(sidecar.target) as client:
        first = await collect(client.chat(conversation, "Raise the export chunk size.", body=body))
        assert first.status == event_pb2.TURN_STATUS_COMPLETED, (first.error, sidecar.log_text())
        waiting = [(c.tool_call_id, c.tool_name, c.state, c.client_executed) for c in first.tool_calls]
        assert waiting == [
            ("call_Sh1x", "shell", "input-available", True),
            ("call_Ls2y", "local_shell", "input-available", True),
            ("call_Ap3z", "apply_patch", "input-available", True),
            ("call_Ct4w", "sql", "input-available", True),
        ], "the application answers them, not a silent stop"
        answers = {
            "call_Sh1x": "export.py\n",
            "call_Ls2y": "clean",
            "call_Ap3z": "Done",
            "call_Ct4w": {"n": 12},
        }
        second = await collect(
            client.submit_tool_results(conversation, answers, body={"use_model": "responses:gpt-5.1-codex"})
        )
        stored = await client.get_conversation(conversation)
    assert second.ok, (second.error, sidecar.log_text())
    assert second.text == "Raised to 64."
    hooks = _records(record)
    assert "before_tool_call" not in [h["hook"] for h in hooks]
    assert [c["client_executed"] for c in hooks[-1]["tool_calls"]] == [True] * 4

    calls = [p.tool_call for p in stored.messages[1].parts if p.WhichOneof("kind") == "tool_call"]
    assert {c.state for c in calls} == {message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE}
    items = replay.requests[1].json["input"]
    assert [i.get("type") for i in items[1:]] == [
        "shell_call",
        "local_shell_call",
        "apply_patch_call",
        "custom_tool_call",
        "shell_call_output",
        "local_shell_call_output",
        "apply_patch_call_output",
        "custom_tool_call_output",
    ]
    assert items[-1] == {"type": "custom_tool_call_output", "call_id": "call_Ct4w", "output": '{"n":12}'}


async def test_responses_built_ins_openai_runs_are_kept_and_not_run(
    sidecar: SidecarProcess, replay: ReplayServer, tmp_path: Path
) -> None:
    _serve(replay, (CASES / "openai_responses_built_in_tools.sse").read_bytes(), r_text_stream("Yes."))
    conversation = f"built-ins-{next(_ids)}"
    record = tmp_path / "hooks.jsonl"
    body = {"use_model": "responses:gpt-5.1", "record_to": str(record)}
    store = {**body, "provider_options": {"openai-responses": {"store": True}}}
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "How large can an export be?", body=store))
        later = await collect(client.chat(conversation, "Sure?", body=store))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, sidecar.log_text())
    assert later.ok, (later.error, sidecar.log_text())
    assert [(c.tool_name, c.provider_executed, c.state) for c in result.tool_calls] == [
        ("web_search", True, "output-available"),
        ("file_search", True, "output-available"),
        ("code_interpreter", True, "output-available"),
        ("get_issue", True, "output-available"),
        ("image_generation", True, "output-available"),
    ]
    (finish,) = _events(result.events, "step_finish")
    openai = finish.provider_metadata.fields["openai"].struct_value.fields
    assert openai["phases"].list_value.values[0].struct_value.fields["phase"].string_value == "final_answer"
    hooks = _records(record)
    assert [h["hook"] for h in hooks[:2]] == ["on_step_finish", "on_chat_response"]
    assert len(hooks[0]["tool_results"]) == 5
    assert hooks[0]["provider_metadata"]["openai"]["phases"] == [
        {"item_id": "msg_0mN7", "phase": "final_answer"}
    ]
    references = [i["id"] for i in replay.requests[1].json["input"] if i.get("type") == "item_reference"]
    assert references == ["ws_0aB1", "fs_0cD2", "ci_0eF3", "mcp_0iJ5", "ig_0kL6"]
