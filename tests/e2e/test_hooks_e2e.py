"""Lifecycle hooks end to end: a real ``turnwire serve`` process whose config lists
middlewares by dotted path, driven by the Python client.

As the client sees them: a hook changes the model (``before_turn`` → ``model``),
a hook restricts the tools (``active_tools``: a call of another tool is a
``tool_input_error``), and the tool policy blocks a call (the model's result is
the block reason, stored as ``output-available``). docs/semantics.md §3
and §4. The hook timeline in ``TurnEnd.metadata`` shows the onion order of
the configured chain. Test-only middlewares live in ``tests/support/hooks.py``;
the process imports them through ``PYTHONPATH``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf import json_format
from support.hooks import pythonpath_env
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client import TurnResult, TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2

DENIED = 'Tool "get_weather" is blocked by the tool policy\'s deny list.'

CONFIG = {
    "default_model": "scripted:main",
    "providers": {
        "scripted": {
            "scripts": {
                "main": [{"text": "Answer from the main model."}],
                "cheap": [{"text": "Answer from the cheap model."}],
                "calc": [
                    {"tool_calls": [{"name": "calculator", "input": {"expression": "6 * 7"}}]},
                    {"text": "Calculated."},
                ],
                "weather": [
                    {"tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]},
                    {"text": "The weather tool is not available."},
                ],
            }
        }
    },
    "events": {"hook_timeline": True},
    "middleware": [
        {"path": "support.hooks:EveryHook", "options": {"label": "outer"}},
        {"path": "support.hooks:ModelFromBody"},
        {"path": "support.hooks:ActiveToolsFromBody"},
        {"path": "turnwire.middlewares:CheaperModelOnContinuation", "options": {"model": "scripted:cheap"}},
        {"path": "turnwire.middlewares:ToolPolicy", "options": {"deny": ["get_weather"]}},
        {"path": "turnwire.middlewares:HookLogger", "options": {"logger": "e2e.hooks"}},
    ],
}

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    """A conversation id unique within the shared sidecar."""
    return f"{prefix}-{next(_ids)}"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    """One server for the module, with ``tests/`` on its PYTHONPATH."""
    with running_sidecar(tmp_path_factory.mktemp("hooks-e2e"), CONFIG, pythonpath_env()) as process:
        yield process


def of_kind(result: TurnResult, kind: str) -> list[Any]:
    """The payloads of the events of ``kind``, in order."""
    return [getattr(e, kind) for e in result.events if e.WhichOneof("event") == kind]


def value(v: Any) -> Any:
    """A protobuf Value/Struct as plain JSON data."""
    return json_format.MessageToDict(v)


def response_models(result: TurnResult) -> list[str]:
    """``StepFinish.response_model`` of each step."""
    return [e.step_finish.response_model for e in result.events if e.WhichOneof("event") == "step_finish"]


async def test_a_hook_changes_the_model(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        plain = await collect(client.chat(new_id("model"), "hi"))
        switched = await collect(client.chat(new_id("model"), "hi", body={"use_model": "scripted:cheap"}))
    assert plain.ok and switched.ok, (plain.error, switched.error)
    assert (plain.text, response_models(plain)) == ("Answer from the main model.", ["scripted:main"])
    assert (switched.text, response_models(switched)) == ("Answer from the cheap model.", ["scripted:cheap"])


async def test_the_builtin_cheaper_model_on_continuation(sidecar: SidecarProcess) -> None:
    conversation = new_id("continue")
    async with TurnwireClient(sidecar.target) as client:
        first = await collect(client.chat(conversation, "hi"))
        continued = await collect(client.continue_last_turn(conversation))
        stored = await client.get_conversation(conversation)
    assert first.ok and continued.ok, (first.error, continued.error)
    assert first.text == "Answer from the main model."
    assert (continued.text, response_models(continued)) == (
        "Answer from the cheap model.",
        ["scripted:cheap"],
    )
    assert [m.role for m in stored.messages] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
        message_pb2.ROLE_ASSISTANT,
    ]


async def test_a_hook_restricts_the_tools(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        allowed = await collect(client.chat(new_id("tools"), "6*7?", model="scripted:calc"))
        restricted = await collect(
            client.chat(
                new_id("tools"),
                "6*7?",
                model="scripted:calc",
                body={"active_tools": ["get_current_time"]},
            )
        )
    assert allowed.ok and restricted.ok, (allowed.error, restricted.error)
    outputs = of_kind(allowed, "tool_output_available")
    assert [value(o.output) for o in outputs] == [{"expression": "6 * 7", "result": 42}]

    assert of_kind(restricted, "tool_output_available") == []
    errors = of_kind(restricted, "tool_input_error")
    assert len(errors) == 1
    error = errors[0]
    assert error.tool_name == "calculator"
    assert error.error_text == (
        "Model tried to call unavailable tool 'calculator'. Available tools: get_current_time."
    )
    [call] = restricted.tool_calls
    assert call.state == "output-error"
    assert restricted.text == "Calculated."  # the turn went on


async def test_the_tool_policy_blocks_a_call(sidecar: SidecarProcess) -> None:
    conversation = new_id("policy")
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "weather in Paris?", model="scripted:weather"))
        stored = await client.get_conversation(conversation)
    assert result.ok, result.error
    assert of_kind(result, "tool_output_error") == []
    [output] = of_kind(result, "tool_output_available")
    assert output.preliminary is False
    assert value(output.output) == DENIED
    assert result.text == "The weather tool is not available."

    reply = stored.messages[-1]
    [part] = [p.tool_call for p in reply.parts if p.WhichOneof("kind") == "tool_call"]
    assert (part.tool_name, part.state) == ("get_weather", message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE)
    assert value(part.output) == DENIED
    assert value(part.input) == {"city": "Paris"}
    assert result.status == event_pb2.TURN_STATUS_COMPLETED


async def test_the_builtin_hook_logger_logs_in_the_server_process(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(new_id("log"), "hi", request_id="req-logged"))
    assert result.ok, result.error
    lines = [line for line in sidecar.log_text().splitlines() if "request_id='req-logged'" in line]
    hooks = [
        hook
        for line in lines
        for hook in ("before_turn", "on_step_finish", "on_chat_response")
        if hook in line
    ]
    assert hooks == ["before_turn", "on_step_finish", "on_chat_response"], lines


async def test_the_hook_timeline_shows_the_configured_chain_in_onion_order(sidecar: SidecarProcess) -> None:
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(new_id("timeline"), "6*7?", model="scripted:calc"))
    assert result.ok, result.error
    timeline = json_format.MessageToDict(result.events[-1].turn_end.metadata)["hook_timeline"]
    calls = [(e["middleware"], e["hook"]) for e in timeline if e["hook"] != "on_chunk"]
    request_path = [
        "outer",
        "ModelFromBody",
        "ActiveToolsFromBody",
        "CheaperModelOnContinuation",
        "HookLogger",
    ]
    step = [("outer", "before_step"), ("HookLogger", "before_step")]
    step_finish = [("HookLogger", "on_step_finish"), ("outer", "on_step_finish")]
    assert calls == [
        *[(name, "before_turn") for name in request_path],
        *step,
        ("outer", "before_tool_call"),
        ("ToolPolicy", "before_tool_call"),
        ("HookLogger", "before_tool_call"),
        ("HookLogger", "after_tool_call"),
        ("outer", "after_tool_call"),
        *step_finish,
        *step,
        *step_finish,
        ("HookLogger", "on_chat_response"),
        ("outer", "on_chat_response"),
    ]
    chunk_calls = {e["middleware"]: e["calls"] for e in timeline if e["hook"] == "on_chunk"}
    assert set(chunk_calls) == {"outer", "HookLogger"}
    assert chunk_calls["outer"] == chunk_calls["HookLogger"] > 5
    assert not any(e["failed"] for e in timeline)
