"""The Node.js example app (clients/node-example) as hook server and tool host, end to end.

Three real processes: a ``turnwire serve``, the Node app (``tests/support/node_app.mjs``: the
example's hooks and tools plus test-only faults, see :mod:`support.node_app`) and this test as
the client. The Node app journals every call it answers, so the assertions read what reached it.
One app and one sidecar per failure mode (``open``, ``closed``), shared by the module.

What the Python hook server already covers (tests/e2e/test_remote_hooks_e2e.py: the nesting rule
for every blocking entry path, the breaker opening and closing) is not repeated here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.node_app import NodeApp
from support.sidecar import SidecarProcess, free_port
from support.waiting import wait_until

from turnwire_client import TurnResult, TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2

DEADLINE_SECONDS = 2.0
"""Each hook call's deadline: what a hanging hook costs a test."""

DEFAULT_SYSTEM = "You are a helpful assistant."

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "weather": [
        {"text": "Let me check.", "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]},
        {"text": "It is windy."},
    ],
}


def sidecar_config(app_address: str, failure_mode: str) -> dict[str, Any]:
    return {
        "default_model": "scripted:weather",
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "middleware": [
            {
                "remote": {
                    "address": app_address,
                    "name": "node",
                    "deadline_seconds": DEADLINE_SECONDS,
                    "failure_mode": failure_mode,
                    # Faults here are on purpose; the breaker (tested in Python) must not open.
                    "breaker": {"failure_threshold": 1000},
                }
            }
        ],
    }


@dataclass
class System:
    """The Node app and the sidecar that calls it."""

    app: NodeApp
    sidecar: SidecarProcess
    failure_mode: str

    async def turn(self, request_id: str, body: dict[str, Any] | None = None, **kwargs: Any) -> TurnResult:
        async with TurnwireClient(self.sidecar.target) as client:
            return await collect(
                client.chat(f"conv-{request_id}", "hello", request_id=request_id, body=body, **kwargs)
            )


@contextlib.contextmanager
def running_system(workdir: Path, failure_mode: str) -> Iterator[System]:
    port = free_port()
    sidecar = SidecarProcess(workdir, sidecar_config(f"127.0.0.1:{port}", failure_mode))
    # The app first: the sidecar asks it for its subscriptions at start-up.
    app = NodeApp(workdir, port, sidecar.target)
    try:
        app.start_blocking()
        sidecar.start_blocking()
        yield System(app, sidecar, failure_mode)
    finally:
        sidecar.kill()
        app.kill()


@pytest.fixture(scope="module")
def open_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running_system(tmp_path_factory.mktemp("node-open"), "open") as system:
        yield system


@pytest.fixture(scope="module")
def closed_system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[System]:
    with running_system(tmp_path_factory.mktemp("node-closed"), "closed") as system:
        yield system


@pytest.fixture(params=["open", "closed"])
def system(request: pytest.FixtureRequest) -> System:
    """Each failure mode's system in turn."""
    return request.getfixturevalue(f"{request.param}_system")


def outputs(result: TurnResult) -> list[Any]:
    """The stored tool results (JSON values; an error's text for a failed call)."""
    return [json.loads(p.output_json) if p.output_json else p.error_text for p in result.tool_calls]


def blocked(tool: str) -> str:
    return f'Tool "{tool}" was blocked: its policy hook (node) was unavailable.'


# --- the order of the calls -----------------------------------------------------------------


async def test_a_two_step_turn_calls_the_hooks_in_the_order_of_the_diagram(open_system: System) -> None:
    result = await open_system.turn("order", body={"user": "ada"})
    assert result.ok, result.error
    # Read at once: TurnEnd comes after OnChatResponse was answered, so everything is journaled.
    entries = open_system.app.journal("order")
    steps = [(e["rpc"], e.get("stepNumber")) for e in entries if e["rpc"] != "OnChunks"]
    # docs/semantics.md §4: before_turn; per step before_step, (before_tool_call → execute →
    # after_tool_call), on_step_finish; then on_chat_response.
    assert steps == [
        ("BeforeTurn", None),
        ("BeforeStep", 0),
        ("BeforeToolCall", 0),
        ("AfterToolCall", 0),
        ("OnStepFinish", 0),
        ("BeforeStep", 1),
        ("OnStepFinish", 1),
        ("OnChatResponse", None),
    ]
    # The chunk batches (one OnChunks call per turn) closed before OnChatResponse.
    rpcs = [e["rpc"] for e in entries]
    assert rpcs.index("OnChunks") < rpcs.index("OnChatResponse")
    chunks = next(e for e in entries if e["rpc"] == "OnChunks")["counts"]
    assert chunks["stepStart"] == 2 and chunks["toolOutputAvailable"] == 1
    # BeforeTurn put the body into the system prompt every step was sent.
    for step in (e for e in entries if e["rpc"] == "BeforeStep"):
        assert step["system"] == f'{DEFAULT_SYSTEM}\n\nAbout this request: {{"user":"ada"}}'
    # OnChatResponse recorded the turn.
    [response] = [e for e in entries if e["rpc"] == "OnChatResponse"]
    assert response["outcome"] == "TURN_OUTCOME_COMPLETED"
    assert response["text"] == "Let me check. It is windy."
    assert response["tools"] == ["get_weather"]


# --- hooks that fail ------------------------------------------------------------------------


@pytest.mark.parametrize("fault", ["hang", "garbage"])
async def test_a_before_tool_call_that_fails_blocks_when_closed_and_runs_the_tool_when_open(
    system: System, fault: str
) -> None:
    request_id = f"btc-{fault}-{system.failure_mode}"
    result = await system.turn(request_id, body={"fault": {"BeforeToolCall": fault}})
    assert result.ok, result.error
    assert {"rpc": "BeforeToolCall", "fault": fault}.items() <= system.app.journal(request_id)[2].items()
    if system.failure_mode == "closed":
        assert outputs(result) == [blocked("get_weather")]
    else:
        assert outputs(result)[0]["city"] == "Paris"


@pytest.mark.parametrize("fault", ["hang", "garbage"])
async def test_a_before_turn_that_fails_fails_the_turn_when_closed_and_changes_nothing_when_open(
    system: System, fault: str
) -> None:
    request_id = f"bt-{fault}-{system.failure_mode}"
    result = await system.turn(request_id, body={"fault": {"BeforeTurn": fault}})
    journal = system.app.journal(request_id)
    assert {"rpc": "BeforeTurn", "fault": fault}.items() <= journal[0].items()
    if system.failure_mode == "closed":
        assert result.status == event_pb2.TURN_STATUS_ERROR
        error = TurnwireError.from_status(result.error)
        assert (error.code, error.reason) == (grpc.StatusCode.INTERNAL, "HOOK_FAILED")
        assert "BeforeStep" not in [e["rpc"] for e in journal]  # the model was never called
    else:
        assert result.ok, result.error
        # The body did not reach the system prompt: the failed BeforeTurn counted as no answer.
        assert {e["system"] for e in journal if e["rpc"] == "BeforeStep"} == {DEFAULT_SYSTEM}


async def test_a_hook_server_killed_mid_call_gets_the_failure_mode_and_is_called_again_once_back(
    system: System,
) -> None:
    app = system.app
    name = f"crash-{system.failure_mode}"
    async with TurnwireClient(system.sidecar.target) as client:
        body = {"fault": {"BeforeToolCall": "hang"}}
        stream = client.chat(f"conv-{name}", "hello", request_id=name, body=body)
        turn = asyncio.ensure_future(collect(stream))
        try:
            await wait_until(lambda: "BeforeToolCall" in app.rpcs(name), what="BeforeToolCall in flight")
            app.kill()
            result = await turn
        finally:
            if not app.running:
                await app.start()  # back on the same port, for the rest of this test and the next ones
    if system.failure_mode == "closed":
        # The call is blocked; then step 1's BeforeStep finds the server gone and, closed too,
        # fails the turn (its partial reply stored).
        assert outputs(result) == [blocked("get_weather")]
        assert TurnwireError.from_status(result.error).reason == "HOOK_FAILED"
    else:
        assert result.ok, result.error
        assert outputs(result)[0]["city"] == "Paris"

    # Back: the sidecar reconnects (at most every second) and the hooks answer again.
    attempts = iter(range(1000))

    async def answered() -> bool:
        request_id = f"{name}-after-{next(attempts)}"
        result = await system.turn(request_id, body={"user": "ada"})
        return result.ok and app.rpcs(request_id)[:3] == ["BeforeTurn", "BeforeStep", "BeforeToolCall"]

    await wait_until(answered, timeout=20, interval=0.2, what="a turn whose hooks the restarted app answered")


# --- calling back into the sidecar -----------------------------------------------------------


async def test_on_chat_response_starts_a_follow_up_turn_with_save_messages(open_system: System) -> None:
    result = await open_system.turn("first", body={"follow_up": "And tomorrow?"})
    assert result.ok, result.error
    app = open_system.app

    def follow_up() -> list[dict[str, Any]]:
        return [e for e in app.journal("first") if e["rpc"] == "follow_up"]

    [done] = await wait_until(follow_up, what="the follow-up turn's end in the journal")
    # Admitted as the next turn of the same conversation (the lock was released), no deadlock.
    assert done["status"] == "TURN_STATUS_COMPLETED"
    async with TurnwireClient(open_system.sidecar.target) as client:
        stored = await client.get_conversation("conv-first")
    texts = [" ".join(p.text.text for p in m.parts if p.HasField("text")) for m in stored.messages]
    assert texts == ["hello", "Let me check. It is windy.", "And tomorrow?", "Let me check. It is windy."]
    turns = [e for e in app.journal() if e["rpc"] == "OnChatResponse" and e["conversationId"] == "conv-first"]
    assert [t["outcome"] for t in turns] == ["TURN_OUTCOME_COMPLETED"] * 2
