"""Tool effects never repeated, in the engine (docs/semantics.md §8, "Tool effects").

A step's calls are stored marked ``started`` before they run; a recovery never runs a call whose
result is stored, runs a call that never started, runs a started call again only when its tool is
idempotent (same key, ``rerun`` set), and gives any other started call the interrupted result,
with ``after_tool_call`` outcome ``interrupted``. The end-to-end versions (SIGKILL, a takeover,
each tool home) are ``tests/e2e/test_tool_effects_e2e.py``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import mcp_types
import pytest
from support.engine_harness import CONV, MODEL, EngineFactory, collect, end_of, of_kind, tool_parts
from support.store_turns import crashed_turn
from support.waiting import wait_until

from turnwire.errors import INTERRUPTED_RUNNING_TOOL_ERROR
from turnwire.hooks import Middleware, ToolCallContext, ToolCallDecision, ToolCallResultContext
from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import PythonTool, ToolExecution
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.ids import tool_idempotency_key
from turnwire_server.store.sqlite import SqliteStore
from turnwire_server.tools.mcp_server import mcp_tool_idempotent

OUTPUT = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
ERROR = message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR


class Recorder(Middleware):
    """Records what ``before_tool_call`` and ``after_tool_call`` saw, by call id."""

    def __init__(self) -> None:
        super().__init__()
        self.before: dict[str, ToolCallContext] = {}
        self.after: dict[str, ToolCallResultContext] = {}

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        self.before[ctx.tool_call_id] = ctx
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        self.after[ctx.tool_call_id] = ctx


def recording_tools(runs: list[ToolExecution]) -> list[PythonTool]:
    """``charge`` (idempotent) and ``send`` (not), each appending its execution to ``runs``."""

    async def run(input: dict[str, Any], execution: ToolExecution) -> dict[str, str]:
        runs.append(execution)
        return {"done": execution.tool_call_id}

    return [
        PythonTool("charge", "charge a card", run, input_schema={"type": "object"}, idempotent=True),
        PythonTool("send", "send an email", run, input_schema={"type": "object"}),
    ]


def call_part(
    message: message_pb2.Message, call_id: str, tool: str, *, started: bool, output: str | None = None
) -> None:
    call = message.parts.add().tool_call
    call.tool_call_id, call.tool_name, call.input_json = call_id, tool, "{}"
    call.started = started
    call.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    if output is not None:
        call.state, call.output_json = OUTPUT, output


async def crash_during_tools(path: Path, *, tool_starts: bool = True, call_keys: int = 2) -> None:
    """Leave in ``path``'s store what a process killed during a step's tool calls leaves: the
    turn running (with its recovery spec), its reply holding calls ``c-charge`` (started,
    idempotent tool), ``c-send`` (started, not idempotent), ``c-fresh`` (not started) and ``c-done``
    (started, its result stored). ``tool_starts`` false: the spec of a sidecar that did not mark
    starts."""
    store = SqliteStore(path)
    await store.open()
    # tool_starts false: the spec as a sidecar that did not mark starts wrote it.
    older = None if tool_starts else (lambda spec: spec.replace(',"tool_starts":true', ""))
    if call_keys == 1:  # the spec of a sidecar whose keys were of the conversation and call id
        older = lambda spec: spec.replace(',"call_keys":2', "")  # noqa: E731
    await crashed_turn(store, CONV, "r-crash", model=MODEL, text="pay and tell them", edit_spec=older)
    reply = message_pb2.Message(id="tw-a-r-crash", role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().step_start.SetInParent()
    reply.parts.add().text.text = "On it."
    call_part(reply, "c-charge", "charge", started=True)
    call_part(reply, "c-send", "send", started=True)
    call_part(reply, "c-fresh", "send", started=False)
    call_part(reply, "c-done", "send", started=True, output='{"done": "before the crash"}')
    await store.save_message(CONV, reply)
    await store.close()


async def recovered(make_engine: EngineFactory, runs: list[ToolExecution], recorder: Recorder) -> Any:
    """An engine on the crashed store that recovered its turn to its end."""
    h = await make_engine(
        scripts={"main": [ScriptStep(text="unused", retry=ScriptStep(text=" All done."))]},
        tools=recording_tools(runs),
        middlewares=[recorder],
    )
    assert await h.engine.recover() == 1
    await wait_until(lambda: h.engine.running == 0, what="the recovery ends")
    return h


async def test_a_recovery_runs_reruns_or_interrupts_each_call_by_its_start_and_tool(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    await crash_during_tools(tmp_path / "turnwire.db")
    runs: list[ToolExecution] = []
    recorder = Recorder()
    h = await recovered(make_engine, runs, recorder)

    ran = {run.tool_call_id: run for run in runs}
    assert sorted(ran) == ["c-charge", "c-fresh"], "c-send may have acted; c-done has its result"
    assert ran["c-charge"].rerun and not ran["c-fresh"].rerun
    assert ran["c-charge"].idempotency_key == tool_idempotency_key(CONV, "tw-a-r-crash", "c-charge")
    # Hooks see which: the re-run flagged, the interrupted one only in after_tool_call.
    assert sorted(recorder.before) == ["c-charge", "c-fresh"]
    assert recorder.before["c-charge"].rerun and not recorder.before["c-fresh"].rerun
    assert recorder.before["c-charge"].idempotency_key == ran["c-charge"].idempotency_key
    after = recorder.after
    assert (after["c-send"].outcome, after["c-send"].success) == ("interrupted", False)
    assert after["c-send"].error == INTERRUPTED_RUNNING_TOOL_ERROR
    assert (after["c-charge"].outcome, after["c-charge"].rerun) == ("executed", True)
    assert after["c-fresh"].outcome == "executed" and "c-done" not in after

    stored = await h.store.load_messages(CONV)
    assert [m.id for m in stored] == ["u-r-crash", "tw-a-r-crash"], "the same message continued"
    calls = {c.tool_call_id: c for c in tool_parts(stored[1])}
    assert calls["c-send"].state == ERROR and calls["c-send"].interrupted
    assert calls["c-send"].error_text == INTERRUPTED_RUNNING_TOOL_ERROR
    assert calls["c-charge"].state == OUTPUT and calls["c-charge"].output_json == '{"done":"c-charge"}'
    assert calls["c-fresh"].state == OUTPUT and calls["c-fresh"].started
    assert calls["c-done"].output_json == '{"done": "before the crash"}', "never run again"
    assert not any(c.interrupted for i, c in calls.items() if i != "c-send")
    # The client sees the interrupted outcome in the recovery's stream.
    events = [event async for batch in h.engine.replay("r-crash", 0) for event in batch]
    errors = of_kind(events, "tool_output_error")
    assert [(e.tool_call_id, e.interrupted) for e in errors] == [("c-send", True)]
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    # The model continued with every call's result.
    sent = h.provider.requests[-1].messages[-1]
    assert {c.tool_call_id: c.state for c in tool_parts(sent)} == {
        "c-charge": OUTPUT,
        "c-send": ERROR,
        "c-fresh": OUTPUT,
        "c-done": OUTPUT,
    }


async def test_a_turn_an_older_sidecar_stored_reruns_its_call_with_the_key_it_was_given(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """The key became the reply's too (docs/tools.md, "Idempotency keys"); a started call of a
    turn stored before (its spec without ``call_keys``) is run again with the key it had, so an
    upgrade between a crash and its recovery does not make a new charge of a repeat."""
    await crash_during_tools(tmp_path / "turnwire.db", call_keys=1)
    runs: list[ToolExecution] = []
    await recovered(make_engine, runs, Recorder())
    ran = {run.tool_call_id: run for run in runs}
    assert ran["c-charge"].rerun
    assert ran["c-charge"].idempotency_key == tool_idempotency_key(CONV, None, "c-charge")
    assert ran["c-fresh"].idempotency_key == tool_idempotency_key(CONV, None, "c-fresh")


async def test_a_turn_stored_without_start_marks_takes_every_open_call_as_started(
    make_engine: EngineFactory, tmp_path: Path
) -> None:
    """A sidecar that did not mark starts may have run c-fresh: the recovery does not run it."""
    await crash_during_tools(tmp_path / "turnwire.db", tool_starts=False)
    runs: list[ToolExecution] = []
    recorder = Recorder()
    h = await recovered(make_engine, runs, recorder)
    assert [run.tool_call_id for run in runs] == ["c-charge"]
    calls = {c.tool_call_id: c for c in tool_parts((await h.store.load_messages(CONV))[1])}
    assert calls["c-fresh"].interrupted and calls["c-send"].interrupted
    assert recorder.after["c-fresh"].outcome == "interrupted"


async def test_the_start_is_stored_before_the_tool_runs(make_engine: EngineFactory) -> None:
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(input: dict[str, Any], execution: ToolExecution) -> str:
        entered.set()
        await release.wait()
        return "sent"

    h = await make_engine(
        scripts={
            "main": [ScriptStep(tool_calls=[ScriptedToolCall(name="send", id="c1")]), ScriptStep(text="ok")]
        },
        tools=[PythonTool("send", "send", slow, input_schema={"type": "object"})],
        checkpoint_interval_ms=60_000,  # no timer checkpoint: only the start's own write
    )
    handle = await h.start("send it")
    await asyncio.wait_for(entered.wait(), 5)
    stored = await h.store.load_messages(CONV)
    (call,) = tool_parts(stored[-1])
    assert call.started and call.state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    release.set()
    events = [response.event async for response in handle]
    assert end_of(events).status == event_pb2.TURN_STATUS_COMPLETED
    (call,) = tool_parts((await h.store.load_messages(CONV))[-1])
    assert call.started and call.state == OUTPUT and not call.interrupted


async def test_a_call_whose_start_cannot_be_stored_is_not_run(
    make_engine: EngineFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs: list[ToolExecution] = []
    h = await make_engine(
        scripts={
            "main": [ScriptStep(tool_calls=[ScriptedToolCall(name="send", id="c1")]), ScriptStep(text="ok")]
        },
        tools=recording_tools(runs),
        checkpoint_interval_ms=60_000,
    )
    save = h.store.save_message

    async def failing(conversation_id: str, message: message_pb2.Message, **kwargs: Any) -> None:
        if any(p.tool_call.started for p in message.parts if p.WhichOneof("kind") == "tool_call"):
            raise OSError("disk gone")
        await save(conversation_id, message, **kwargs)

    monkeypatch.setattr(h.store, "save_message", failing)
    events = await h.run("send it")
    assert runs == [], "not run: a crash could not have told that it may have acted"
    (error,) = of_kind(events, "tool_output_error")
    assert "its start could not be stored" in error.error_text
    assert "disk gone" not in error.error_text


@pytest.mark.parametrize(
    ("annotations", "idempotent"),
    [
        (None, False),
        ({"idempotentHint": True}, True),
        ({"readOnlyHint": True}, True),
        ({"idempotentHint": False, "destructiveHint": True}, False),
        ({"title": "Charge"}, False),
    ],
)
def test_an_mcp_tool_is_idempotent_when_its_annotations_say_so(
    annotations: dict[str, Any] | None, idempotent: bool
) -> None:
    """docs/tools.md, "Tool effects by tool home": MCP's ``idempotentHint`` (no further effect
    when called again) or ``readOnlyHint`` (no effect at all)."""
    listed = mcp_types.Tool.model_validate(
        {"name": "charge", "inputSchema": {"type": "object"}, "annotations": annotations}
    )
    assert mcp_tool_idempotent(listed) is idempotent


async def test_a_retried_turn_gives_a_call_of_a_failed_attempts_id_that_calls_key(
    make_engine: EngineFactory,
) -> None:
    # docs/tools.md, "Idempotency keys", a retried turn: the retry's reply keeps its id, so the
    # scripted model's call_0_0 of the retry has the key of the aborted attempt's call_0_0; a new
    # request id is another reply, with other keys.
    runs: list[ToolExecution] = []
    first_run_waits = asyncio.Event()

    async def send(input: dict[str, Any], execution: ToolExecution) -> str:
        runs.append(execution)
        if len(runs) == 1:
            first_run_waits.set()
            await asyncio.Event().wait()  # until the turn is cancelled
        return "sent"

    h = await make_engine(
        scripts={"main": [ScriptStep(tool_calls=[ScriptedToolCall(name="send")]), ScriptStep(text="Sent.")]},
        tools=[PythonTool("send", "send an email", send, input_schema={"type": "object"})],
    )
    handle = await h.start("send it", request_id="r-retry", message_id="m-retry")
    collecting = asyncio.create_task(collect(handle))
    await asyncio.wait_for(first_run_waits.wait(), 10)
    handle.cancel()
    assert end_of(await collecting).status == event_pb2.TURN_STATUS_ABORTED

    retried = await h.run("send it", request_id="r-retry", message_id="m-retry")
    assert end_of(retried).status == event_pb2.TURN_STATUS_COMPLETED
    other = await h.run("send it again", request_id="r-other")
    assert end_of(other).status == event_pb2.TURN_STATUS_COMPLETED

    keys = [run.idempotency_key for run in runs]
    assert keys[0] == keys[1] == tool_idempotency_key(CONV, "tw-a-r-retry", "call_0_0")
    assert keys[2] not in keys[:2]
