"""Tool effects never repeated, with real server processes (issue 40; docs/semantics.md §8, "Tool
effects"; docs/tools.md, "Tool effects by tool home").

A sidecar is SIGKILLed while a step's tools run. After the restart (SQLite) or the takeover by a
surviving replica (PostgreSQL), the recovery never runs a call whose result is stored, gives the
non-idempotent call that was running the interrupted result (``interrupted`` in the stream and
the transcript) without running it again, and runs the idempotent one again with the same key.
Each tool's own log (a file that outlives the kill) proves how often it ran. The key and the
idempotent declaration reach a Python tool, a tool host on the TypeScript kit and an MCP server.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from support.hooks import pythonpath_env
from support.port_process import PortProcess
from support.sidecar import SidecarFactory, SidecarProcess, free_port
from support.stores import postgres_database
from support.waiting import wait_until

from turnwire.errors import INTERRUPTED_RUNNING_TOOL_ERROR
from turnwire_client import TurnwireClient, TurnwireError
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.ids import tool_idempotency_key

REPO = Path(__file__).resolve().parents[2]
MCP_SERVER = REPO / "tests" / "support" / "mcp_tools.py"
TS_HOST = REPO / "tests" / "support" / "effects_host.mjs"

SCRIPTS: dict[str, Any] = {
    # Step 0 runs `note` (its result stored), step 1 the two slow tools at once (the kill lands
    # there); the recovery's model step (attempt 2) plays `retry`.
    "effects": [
        {"tool_calls": [{"name": "note"}], "retry": {"text": "All done after the restart."}},
        {"text": "Paying and sending.", "tool_calls": [{"name": "send_slow"}, {"name": "charge_slow"}]},
    ],
    "remote": [
        {"tool_calls": [{"name": "charge_ts"}, {"name": "charge"}], "retry": {"text": "Charged."}},
    ],
}
PYTHON_TOOLS = [f"support.durable_tools:{name}" for name in ("note", "send_slow", "charge_slow")]


def python_tools(log: Path, **sections: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """A sidecar config with the scripts and the Python tools (more ``sections`` beside them), and
    the environment that has the tools log their runs to ``log``."""
    cfg = {
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "tools": {"python": PYTHON_TOOLS},
        "checkpoint": {"interval_ms": 20},
        **sections,
    }
    return cfg, {**pythonpath_env(), "TURNWIRE_TEST_EFFECTS_LOG": str(log)}


def runs(log: Path) -> list[dict[str, Any]]:
    """The tool runs logged so far (``support.durable_tools``)."""
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def calls_by_tool(message: message_pb2.Message) -> dict[str, message_pb2.ToolCallPart]:
    return {p.tool_call.tool_name: p.tool_call for p in message.parts if p.WhichOneof("kind") == "tool_call"}


async def chat_until_killed(
    sidecar: SidecarProcess, conversation: str, script: str, ready: Callable[[], bool], what: str
) -> None:
    """Chat on ``sidecar`` (request id ``r-<conversation>``) until the step's calls are announced
    and ``ready()`` holds, then SIGKILL it."""
    async with TurnwireClient(sidecar.target) as client:
        try:
            async for event in client.chat(
                conversation, "go", request_id=f"r-{conversation}", model=f"scripted:{script}"
            ):
                if event.HasField("tool_input_available"):
                    await wait_until(ready, timeout=20, what=what)
                    sidecar.kill()
        except TurnwireError:
            pass  # the stream broke with the process


def slow_tools_running(log: Path) -> Callable[[], bool]:
    return lambda: {"send_slow", "charge_slow"} <= {run["tool"] for run in runs(log)}


async def assert_effects_once(sidecar: SidecarProcess, log: Path, conversation: str) -> None:
    """The recovered turn ``r-<conversation>`` completed; from the tools' log and the stored reply:
    ``note`` ran once, ``send_slow`` once and got the interrupted result, ``charge_slow`` twice
    with one key, the second time as a re-run."""
    async with TurnwireClient(sidecar.target) as client:
        events = [event async for event in client.resume_turn(f"r-{conversation}")]
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED, events[-1]
        stored = await client.get_conversation(conversation)
    by_tool: dict[str, list[dict[str, Any]]] = {}
    for run in runs(log):
        by_tool.setdefault(run["tool"], []).append(run)
    assert [len(by_tool[name]) for name in ("note", "send_slow", "charge_slow")] == [1, 1, 2], by_tool
    charges = by_tool["charge_slow"]
    assert [run["rerun"] for run in charges] == [False, True]
    reply = events[-1].turn_end.message.id
    key = tool_idempotency_key(conversation, reply, charges[0]["call"])
    assert charges[0]["key"] == charges[1]["key"] == key
    assert not by_tool["send_slow"][0]["rerun"]

    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    calls = calls_by_tool(stored.messages[1])
    assert calls["note"].output_json == '"noted"', "stored before the crash, never run again"
    assert calls["charge_slow"].output_json == '"charged once"'
    send = calls["send_slow"]
    assert send.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR and send.interrupted and send.started
    assert send.error_text == INTERRUPTED_RUNNING_TOOL_ERROR
    interrupted = [
        e.tool_output_error
        for e in events
        if e.HasField("tool_output_error") and e.tool_output_error.interrupted
    ]
    assert [e.tool_call_id for e in interrupted] == [send.tool_call_id], "the client is told which"


async def test_sigkill_during_tools_interrupts_the_unsafe_call_and_reruns_the_idempotent_one(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    log = tmp_path / "tool-runs.jsonl"
    cfg, env = python_tools(log)
    first = await sidecar_factory(cfg, env=env).start()
    await chat_until_killed(first, "fx", "effects", slow_tools_running(log), "both slow tools run")

    second = await sidecar_factory(cfg, env=env).start()
    await assert_effects_once(second, log, "fx")
    with sqlite3.connect(Path(second.db_path)) as db:
        assert db.execute("SELECT state, recovery_count FROM turns WHERE request_id = 'r-fx'").fetchone() == (
            "completed",
            1,
        )
    assert await second.terminate() == 0, second.log_text()
    assert len(runs(log)) == 4, "nothing more ran"


async def test_a_takeover_by_a_surviving_replica_never_repeats_an_effect(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    log = tmp_path / "tool-runs.jsonl"
    cfg, env = python_tools(log, store={"pool_size": 3}, durability={"lease_seconds": 1.5})
    with postgres_database() as url:
        replicas = [
            sidecar_factory(cfg, env=env, workdir=tmp_path / f"replica-{n}", store_url=url) for n in range(2)
        ]
        for replica in replicas:  # one after the other: they migrate the new database
            await replica.start()
        await chat_until_killed(
            replicas[0], "fx-pg", "effects", slow_tools_running(log), "both slow tools run"
        )
        # The survivor claims the turn once the killed replica's lease lapses, and recovers it.
        await assert_effects_once(replicas[1], log, "fx-pg")
        assert await replicas[1].terminate() == 0, replicas[1].log_text()


class TsToolHost(PortProcess):
    """``node tests/support/effects_host.mjs`` on ``127.0.0.1:port``, logging to ``log``."""

    def __init__(self, port: int, log: Path, output: Path) -> None:
        super().__init__(port)
        self.log, self.output = log, output

    def _spawn(self) -> None:
        # Popen returns once the child is forked; it does not wait for it.
        node = shutil.which("node") or "node"
        command = [node, str(TS_HOST), "--listen", f"127.0.0.1:{self.port}", "--log", str(self.log)]
        with self.output.open("wb") as out:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=subprocess.STDOUT)

    async def start(self) -> TsToolHost:
        self._spawn()
        await wait_until(self.listening, timeout=20, what="the TypeScript tool host listening")
        return self

    def exit_details(self) -> str:
        return f"{super().exit_details()}\n{self.output.read_text(errors='replace')}"


@pytest.fixture
async def ts_host(tmp_path: Path) -> AsyncIterator[TsToolHost]:
    host = await TsToolHost(free_port(), tmp_path / "ts-runs.jsonl", tmp_path / "ts-host.log").start()
    yield host
    host.kill()


async def test_the_key_and_the_idempotent_declaration_reach_a_ts_kit_host_and_an_mcp_server(
    sidecar_factory: SidecarFactory, tmp_path: Path, ts_host: TsToolHost
) -> None:
    """``charge_ts`` (TypeScript kit, ``idempotent: true``) and the MCP server's ``charge``
    (``idempotentHint``) are running when the sidecar dies; the recovery runs both again with the
    keys of their first run (the TypeScript tool is told it is a re-run)."""
    record = tmp_path / "mcp-record.txt"
    cfg = {
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "tools": {
            "hosts": [{"name": "ts", "address": f"127.0.0.1:{ts_host.port}"}],
            "mcp": [
                {
                    "name": "tiny",
                    "command": sys.executable,
                    "args": [str(MCP_SERVER), str(record)],
                    # The recovery needs the tool listed to know it idempotent: a start slower than
                    # the default 10 s (a loaded CI machine) recovered its call as an unknown tool's.
                    "startup_timeout_seconds": 60,
                }
            ],
        },
        "checkpoint": {"interval_ms": 20},
    }

    def charges() -> list[str]:
        return [line.split(" ", 1)[1] for line in record.read_text().splitlines()] if record.exists() else []

    first = await sidecar_factory(cfg).start()
    # An MCP server whose first start failed joins later (docs/tools.md): its tool must be listed
    # before the model calls it.
    listed = re.compile(r"MCP server 'tiny': \d+ tool\(s\)")
    await wait_until(lambda: listed.search(first.log_text()), what="the MCP tools listed")
    await chat_until_killed(
        first,
        "remote",
        "remote",
        lambda: bool(runs(ts_host.log)) and bool(charges()),
        "both remote tools run",
    )

    second = await sidecar_factory(cfg).start()
    assert listed.search(second.log_text()), "listed before the recovery: " + second.log_text()[-2000:]
    async with TurnwireClient(second.target) as client:
        events = [event async for event in client.resume_turn("r-remote")]
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED, events[-1]
        reply = (await client.get_conversation("remote")).messages[1]
        calls = calls_by_tool(reply)
    ts_runs = runs(ts_host.log)
    ts_key = tool_idempotency_key("remote", reply.id, calls["charge_ts"].tool_call_id)
    assert [(run["key"], run["rerun"]) for run in ts_runs] == [(ts_key, False), (ts_key, True)]
    mcp_key = tool_idempotency_key("remote", reply.id, calls["charge"].tool_call_id)
    assert charges() == [mcp_key, mcp_key], "run again with the key of its first run"
    assert calls["charge_ts"].output_json == json.dumps(f"charged {ts_key}")
    assert json.loads(calls["charge"].output_json) == {"result": f"charged {mcp_key}"}
    assert await second.terminate() == 0, second.log_text()
