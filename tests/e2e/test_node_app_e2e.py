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
import itertools
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

from turnwire_client import TurnResult, TurnStream, TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2
from turnwire_server.engine.ids import tool_idempotency_key

DEADLINE_SECONDS = 5.0
"""Each hook call's deadline: what a hanging hook costs a test. It was 2 s, and this module flaked
twice under a loaded CI (4 xdist workers, Node, Go and the conformance suite on 2 cores): in open mode
a hook answered after its deadline silently changes the turn, so the deadline leaves room for a
starved Node process (the module takes ~32 s alone at 5 s)."""

DEFAULT_SYSTEM = "You are a helpful assistant."

ORDER = {"order_id": "A-17"}

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "weather": [  # a demo tool of the sidecar: the hooks alone are under test
        {"text": "Let me check.", "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}]},
        {"text": "It is windy."},
    ],
    "lookup": [
        {"text": "Let me check.", "tool_calls": [{"name": "lookup_order", "input": {"order_id": "A-17"}}]},
        {"text": "It has shipped."},
    ],
    "decisions": [  # one call per policy decision (with the right body)
        {
            "tool_calls": [
                {"name": "lookup_order", "input": {"order_id": " a-17"}},
                {"name": "refund_order", "input": {"order_id": "A-17"}},
                {"name": "pack_order", "input": {"order_id": "A-17", "items": 2, "delay_ms": 0}},
            ]
        },
        {"text": "Done."},
    ],
    "pack_slowly": [  # runs until stopped: 1000 items, 50 ms each
        {
            "tool_calls": [
                {"name": "pack_order", "input": {"order_id": "A-17", "items": 1000, "delay_ms": 50}}
            ]
        },
        {"text": "Packed."},
    ],
    "nested": [
        {"tool_calls": [{"name": "nested_chat", "input": {}}]},
        {"text": "Done."},
    ],
}


def sidecar_config(app_address: str, failure_mode: str) -> dict[str, Any]:
    return {
        "default_model": "scripted:weather",
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "tools": {"demo": True, "hosts": [{"name": "node", "address": app_address}]},
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
    system: System = request.getfixturevalue(f"{request.param}_system")
    return system


def outputs(result: TurnResult) -> list[Any]:
    """The stored tool results (JSON values; an error's text for a failed call)."""
    return [
        call.output if call.state == "output-available" else call.error_text for call in result.tool_calls
    ]


def blocked(tool: str, what: str = "was unavailable") -> str:
    return f'Tool "{tool}" was blocked: its policy hook (node) {what}.'


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


# --- the policy's decisions ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "decisions", "outputs_by_tool"),
    [
        pytest.param(
            {},
            {"lookup_order": "allowWithInput", "refund_order": "block", "pack_order": "allow"},
            {
                # The host got the normalized id, though the stored call keeps the model's " a-17".
                "lookup_order": {"order_id": "A-17", "status": "shipped", "carrier": "DHL"},
                "refund_order": "Refunds need an admin: tell the user to contact support.",
                "pack_order": {"order_id": "A-17", "packed": 2, "done": True},
            },
            id="allow-with-input,block,allow",
        ),
        pytest.param(
            {"role": "admin", "dry_run": True},
            {"lookup_order": "allowWithInput", "refund_order": "substitute", "pack_order": "substitute"},
            {
                "lookup_order": {"order_id": "A-17", "status": "shipped", "carrier": "DHL"},
                "refund_order": {
                    "dry_run": True,
                    "would_call": "refund_order",
                    "input": {"order_id": "A-17"},
                },
                "pack_order": {
                    "dry_run": True,
                    "would_call": "pack_order",
                    "input": {"order_id": "A-17", "items": 2, "delay_ms": 0},
                },
            },
            id="substitute",
        ),
    ],
)
async def test_each_before_tool_call_decision_of_the_node_policy(
    open_system: System, body: dict[str, Any], decisions: dict[str, str], outputs_by_tool: dict[str, Any]
) -> None:
    request_id = f"decisions-{len(body)}"
    result = await open_system.turn(request_id, body=body, model="scripted:decisions")
    assert result.ok, result.error
    assert {call.tool_name: call.output for call in result.tool_calls} == outputs_by_tool
    assert result.tool_calls[0].input == {"order_id": " a-17"}
    journal = open_system.app.journal(request_id)
    assert {e["toolName"]: e["decision"] for e in journal if e["rpc"] == "BeforeToolCall"} == decisions
    executed = {e["toolName"]: json.loads(e["input"]) for e in journal if e["rpc"] == "ExecuteTool"}
    expected = {name for name, decision in decisions.items() if decision.startswith("allow")}
    assert set(executed) == expected  # blocked and substituted calls never reach the host
    assert executed["lookup_order"] == {"order_id": "A-17"}
    for entry in (e for e in journal if e["rpc"] == "ExecuteTool"):  # each call's own stable key
        assert result.message is not None
        key = tool_idempotency_key(entry["conversationId"], result.message.id, entry["toolCallId"])
        assert entry["idempotencyKey"] == key
    for name in expected:  # before_tool_call → execute → after_tool_call, per call
        of_call = [e["rpc"] for e in journal if e.get("toolName") == name]
        assert of_call == ["BeforeToolCall", "ExecuteTool", "AfterToolCall"], of_call
    outcomes = {e["toolName"]: e["outcome"] for e in journal if e["rpc"] == "AfterToolCall"}
    assert outcomes == {
        name: {"block": "TOOL_CALL_OUTCOME_BLOCKED", "substitute": "TOOL_CALL_OUTCOME_SUBSTITUTED"}.get(
            decision, "TOOL_CALL_OUTCOME_EXECUTED"
        )
        for name, decision in decisions.items()
    }


# --- hooks that fail ------------------------------------------------------------------------


async def faulted_turn(system: System, rpc: str, fault: str) -> tuple[TurnResult, list[dict[str, Any]]]:
    """A turn whose hook ``rpc`` the Node app answers with ``fault``; its result and journal."""
    request_id = f"{rpc}-{fault}-{system.failure_mode}"
    result = await system.turn(request_id, body={"fault": {rpc: fault}})
    journal = system.app.journal(request_id)
    assert {"rpc": rpc, "fault": fault} in [{"rpc": e["rpc"], "fault": e.get("fault")} for e in journal]
    return result, journal


@pytest.mark.parametrize("fault", ["hang", "garbage"])
async def test_a_before_tool_call_that_fails_blocks_when_closed_and_runs_the_tool_when_open(
    system: System, fault: str
) -> None:
    result, _ = await faulted_turn(system, "BeforeToolCall", fault)
    assert result.ok, result.error
    if system.failure_mode == "closed":  # garbage is an answer: the hook failed
        assert outputs(result) == [
            blocked("get_weather", "failed" if fault == "garbage" else "was unavailable")
        ]
    else:
        assert outputs(result)[0]["city"] == "Paris"


@pytest.mark.parametrize("fault", ["hang", "garbage"])
async def test_a_before_turn_that_fails_fails_the_turn_when_closed_and_changes_nothing_when_open(
    system: System, fault: str
) -> None:
    result, journal = await faulted_turn(system, "BeforeTurn", fault)
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

    await app_answers_again(system)


_BACK = itertools.count()
"""Request ids of :func:`app_answers_again`'s turns, unique in the module."""


async def app_answers_again(system: System) -> None:
    """Wait until the restarted Node app answers the sidecar again as the hook server and as the
    tool host: the sidecar reconnects each of its two channels on its own backoff (hooks at most
    every second, tools up to 5 s), and in open mode a hook the channel cannot reach yet is
    skipped, so a test that runs before both are back sees a turn without its hooks."""
    app = system.app

    async def hooks_answered() -> bool:
        request_id = f"hooks-back-{next(_BACK)}"
        result = await system.turn(request_id, body={"user": "ada"})
        return result.ok and app.rpcs(request_id)[:3] == ["BeforeTurn", "BeforeStep", "BeforeToolCall"]

    async def tool_ran() -> bool:
        result = await system.turn(f"tools-back-{next(_BACK)}", model="scripted:lookup")
        return result.ok and outputs(result) == [{"order_id": "A-17", "status": "shipped", "carrier": "DHL"}]

    await wait_until(hooks_answered, timeout=30, interval=0.2, what="hooks the restarted app answered")
    await wait_until(tool_ran, timeout=30, interval=0.2, what="a call the restarted host answered")


# --- the tool host --------------------------------------------------------------------------


async def start_packing(client: TurnwireClient, request_id: str) -> TurnStream:
    """A turn whose pack_order call runs until stopped; returns once its first progress arrived."""
    stream = client.chat(f"conv-{request_id}", "pack", request_id=request_id, model="scripted:pack_slowly")
    seen = []
    # anext, not `async for`: leaving such a loop (the return) would cancel the turn.
    while (event := await anext(stream, None)) is not None:
        if event.WhichOneof("event") == "tool_output_available":
            assert event.tool_output_available.preliminary
            return stream
        seen.append(event)
    raise AssertionError(f"the turn ended before the tool reported progress: {seen}")


async def test_a_tool_host_that_dies_mid_call_fails_the_call_the_turn_goes_on_and_it_comes_back(
    open_system: System,
) -> None:
    app = open_system.app
    async with TurnwireClient(open_system.sidecar.target) as client:
        stream = await start_packing(client, "host-dies")
        try:
            app.kill()
            result = await collect(stream)
        finally:
            if not app.running:
                await app.start()
    assert result.ok, result.error
    [call] = result.tool_calls
    assert call.state == "output-error"
    assert "tool host 'node' is unavailable" in call.error_text
    assert result.text.endswith("Packed.")  # the model was called again after the failed call

    # Back: the sidecar lists the restarted host's tools again, its calls run and its hooks answer.
    await wait_until(lambda: "ListTools" in [e["rpc"] for e in app.journal()[-50:]], timeout=20)
    await app_answers_again(open_system)


async def test_cancelling_the_turn_cancels_the_call_in_the_node_host(open_system: System) -> None:
    async with TurnwireClient(open_system.sidecar.target) as client:
        stream = await start_packing(client, "cancel-tool")
        stream.cancel()  # the client cancels its call: the turn is cancelled (disconnect policy CANCEL)

    def cancelled() -> list[dict[str, Any]]:
        return [e for e in open_system.app.journal("cancel-tool") if e["rpc"] == "ExecuteTool:cancelled"]

    [entry] = await wait_until(cancelled, what="the Node host seeing its call cancelled")
    assert entry["toolName"] == "pack_order"


async def test_a_remote_tool_calling_chat_on_its_own_conversation_gets_failed_precondition(
    open_system: System,
) -> None:
    result = await open_system.turn("nested", model="scripted:nested")
    assert result.ok, result.error
    [output] = outputs(result)
    assert output["parent"] == "nested"  # the host got the turn's request id in the metadata
    assert output["code"] == "FAILED_PRECONDITION", output


# --- calling back into the sidecar -----------------------------------------------------------


async def test_on_chat_response_starts_a_follow_up_turn_with_save_messages(open_system: System) -> None:
    result = await open_system.turn("first", body={"follow_up": "And tomorrow?"})
    assert result.ok, result.error
    app = open_system.app

    def follow_up() -> list[dict[str, Any]]:
        return [e for e in app.journal("first") if e["rpc"] == "follow_up"]

    # A whole second turn through the Node hooks: under a loaded CI it once took over 30 s.
    [done] = await wait_until(follow_up, timeout=90, what="the follow-up turn's end in the journal")
    # Admitted as the next turn of the same conversation (the lock was released), no deadlock.
    assert done["status"] == "TURN_STATUS_COMPLETED"
    async with TurnwireClient(open_system.sidecar.target) as client:
        stored = await client.get_conversation("conv-first")
    texts = [" ".join(p.text.text for p in m.parts if p.HasField("text")) for m in stored.messages]
    assert texts == ["hello", "Let me check. It is windy.", "And tomorrow?", "Let me check. It is windy."]
    turns = [e for e in app.journal() if e["rpc"] == "OnChatResponse" and e["conversationId"] == "conv-first"]
    assert [t["outcome"] for t in turns] == ["TURN_OUTCOME_COMPLETED"] * 2
