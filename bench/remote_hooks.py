"""What a remote hook server and a remote tool host add to a turn, on loopback.

The Node.js example app (clients/node-example: TurnHooksService + ToolExecutorService in one
process) against the same hooks and tool in process (``_node_equivalents.py``). Each
configuration is its own ``turnwire serve`` (SQLite, the scripted model with no delay); all of
them and the one Node app run at once, and the configurations take turns round by round, so
drift hits each alike. A turn is two steps: step 0 calls ``lookup_order``, step 1 answers.

Measured per turn, one turn at a time, each on a new conversation:

* the turn: from sending ``Chat`` to receiving ``TurnEnd``, at the client. With one tool call
  per turn, the remote tool host's row minus the in-process row is its added latency per tool
  call, and the remote hooks' row minus it is the hook server's added latency per turn;
* the hooks' own time, from the sidecar's hook timeline (``events.hook_timeline``): every hook
  call of the turn, and those around the tool call (``before_tool_call`` + ``after_tool_call``).

The hooks are the example's: BeforeTurn, BeforeStep, BeforeToolCall, AfterToolCall,
OnStepFinish, OnChunks (batched) and OnChatResponse, so a remote turn makes 8 hook calls plus
its chunk batches: on the ``HookSession`` stream (the Node kit sets ``hook_session_chunks``; the
example observes BeforeStep and OnChatResponse, so on the stream a turn waits for neither), or
as 8 unary RPCs and an ``OnChunks`` call (the unary configuration, which awaits every call).

    python bench/remote_hooks.py [--rounds 8] [--turns 25] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BENCH_DIR,
    PYTHON,
    REPO,
    ServerProcess,
    Table,
    cpu_seconds_of,
    free_port,
    percentile,
    print_tables,
    write_tables_json,
)
from google.protobuf import json_format

from turnwire_client import TurnwireClient, collect

NODE_APP = REPO / "clients" / "node-example" / "app.mjs"
SCRIPT = [
    {"text": "Looking.", "tool_calls": [{"name": "lookup_order", "input": {"order_id": "A-17"}}]},
    {"text": "It has shipped."},
]
IN_PROCESS_HOOKS = {"path": "_node_equivalents:NodeExampleHooks"}
IN_PROCESS_TOOL = ["_node_equivalents:TOOLS"]


@dataclass
class Config:
    """One sidecar configuration and what it measured."""

    name: str
    remote_hooks: bool
    remote_tool: bool
    hooks: bool = True
    hook_session: bool = True
    turn_seconds: list[float] = field(default_factory=list)
    hook_seconds: list[float] = field(default_factory=list)
    tool_hook_seconds: list[float] = field(default_factory=list)
    rpc_hook_seconds: list[float] = field(default_factory=list)
    sidecar_cpu: float = 0.0
    node_cpu: float = 0.0
    measured_turns: int = 0
    server: ServerProcess | None = None

    def sidecar_config(self, port: int, node: str, workdir: Path) -> dict[str, Any]:
        tools: dict[str, Any] = {"demo": False}
        if self.remote_tool:
            tools["hosts"] = [{"name": "node", "address": node}]
        else:
            tools["python"] = IN_PROCESS_TOOL
        middleware: list[dict[str, Any]] = []
        if self.hooks:
            remote = {"address": node, "hook_session": self.hook_session}
            middleware.append({"remote": remote} if self.remote_hooks else IN_PROCESS_HOOKS)
        return {
            "listen": f"127.0.0.1:{port}",
            "logging": {"level": "warning"},
            "default_model": "scripted:bench",
            "store": {"url": f"sqlite:///{workdir / f'{self.name}.db'}"},
            "providers": {"scripted": {"scripts": {"bench": SCRIPT}}},
            "tools": tools,
            "middleware": middleware,
            "events": {"hook_timeline": True},
        }


CONFIGS = (
    Config("no hooks, tool in process", remote_hooks=False, remote_tool=False, hooks=False),
    Config("hooks and tool in process", remote_hooks=False, remote_tool=False),
    Config("remote hooks (Node), tool in process", remote_hooks=True, remote_tool=False),
    Config(
        "remote hooks (Node, unary RPCs), tool in process",
        remote_hooks=True,
        remote_tool=False,
        hook_session=False,
    ),
    Config("hooks in process, remote tool (Node)", remote_hooks=False, remote_tool=True),
    Config("remote hooks and remote tool (Node)", remote_hooks=True, remote_tool=True),
)
BASELINE = CONFIGS[1]
REMOTE_HOOKS = CONFIGS[2]
UNARY_HOOKS = CONFIGS[3]
RPC_HOOKS = frozenset(
    (
        "before_turn",
        "before_step",
        "before_tool_call",
        "after_tool_call",
        "on_step_finish",
        "on_chat_response",
    )
)
"""The hooks the example subscribes to that are calls of their own (``on_chunk``'s batches ride the
turn's ``HookSession``, the last one answered inside ``on_chat_response``'s entry; on the unary
path one ``OnChunks`` call per turn, closed there)."""
HOOK_CALLS_PER_TURN = 8
TARGET_MS = 0.3
"""Issue 33: one remote hook call costs at most this on loopback."""


async def one_turn(client: TurnwireClient, config: Config, index: int) -> None:
    started = time.perf_counter()
    result = await collect(client.chat(f"c-{index}", "Where is A-17?", body={"user": "ada"}))
    config.turn_seconds.append(time.perf_counter() - started)
    if not result.ok or len(result.tool_calls) != 1 or result.tool_calls[0].error_text:
        raise RuntimeError(f"{config.name}: {result}")
    metadata = json_format.MessageToDict(result.events[-1].turn_end.metadata)
    timeline = metadata.get("hook_timeline", [])
    # The in-process turn-info keepers of a remote entry (no RPC) are in the timeline too: 0 ms.
    config.hook_seconds.append(sum(entry["duration_ms"] for entry in timeline) / 1000)
    around_tool = [e for e in timeline if e["hook"] in ("before_tool_call", "after_tool_call")]
    config.tool_hook_seconds.append(sum(entry["duration_ms"] for entry in around_tool) / 1000)
    # One entry per hook RPC of the remote entry (the chain's own in-process entries have no RPC).
    config.rpc_hook_seconds.extend(e["duration_ms"] / 1000 for e in timeline if e["hook"] in RPC_HOOKS)


async def measure(args: argparse.Namespace, workdir: Path, node_address: str, node: int) -> list[Table]:
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH_DIR), os.environ.get("PYTHONPATH")]))
    try:
        for config in CONFIGS:
            port = free_port()
            path = workdir / f"{port}.yaml"
            path.write_text(yaml.safe_dump(config.sidecar_config(port, node_address, workdir)))
            argv = [PYTHON, "-m", "turnwire_server", "serve", "--config", str(path)]
            config.server = ServerProcess(argv, port, workdir, f"sidecar-{port}")
            await config.server.start(startup_seconds=120)  # a loaded machine starts 6 sidecars slowly
        clients = {config.name: TurnwireClient(config.server.target) for config in CONFIGS if config.server}
        index = 0
        for round_number in range(args.warmup_rounds + args.rounds):
            for config in CONFIGS:
                if round_number == args.warmup_rounds:
                    config.turn_seconds.clear()
                    config.hook_seconds.clear()
                    config.tool_hook_seconds.clear()
                    config.rpc_hook_seconds.clear()
                assert config.server is not None
                assert config.server.popen is not None
                sidecar_pid = config.server.popen.pid
                sidecar_before, node_before = cpu_seconds_of(sidecar_pid), cpu_seconds_of(node)
                for _ in range(args.turns):
                    index += 1
                    await one_turn(clients[config.name], config, index)
                if round_number >= args.warmup_rounds:
                    # The Node app answers only this configuration's sidecar meanwhile.
                    config.sidecar_cpu += cpu_seconds_of(sidecar_pid) - sidecar_before
                    config.node_cpu += cpu_seconds_of(node) - node_before
                    config.measured_turns += args.turns
        for client in clients.values():
            await client.close()
    finally:
        for config in CONFIGS:
            if config.server is not None:
                config.server.stop()
    return [table(args), per_call_table(args)]


def per_call_table(args: argparse.Namespace) -> Table:
    """One hook call's cost, on a ``HookSession`` and as unary RPCs: wall (the hook timeline's
    call entries), and CPU on both sides (the sidecar's CPU per turn over the in-process hooks'
    sidecar, plus the Node app's, over the 8 calls)."""
    local = BASELINE
    result = Table(
        "One remote hook call on loopback (Node.js example app), against the in-process hooks",
        ["measure", "HookSession", "unary RPCs", f"target ≤ {TARGET_MS} ms per call (HookSession)"],
    )
    rows: dict[str, list[float]] = {}
    for config in (REMOTE_HOOKS, UNARY_HOOKS):
        sidecar_ms = (
            config.sidecar_cpu / config.measured_turns - local.sidecar_cpu / local.measured_turns
        ) * 1000
        node_ms = config.node_cpu / config.measured_turns * 1000
        added = (percentile(config.turn_seconds, 50) - percentile(local.turn_seconds, 50)) * 1000
        values = {
            "hook call wall p50 ms": percentile(config.rpc_hook_seconds, 50) * 1000,
            "hook call wall p99 ms": percentile(config.rpc_hook_seconds, 99) * 1000,
            "hook call CPU ms (sidecar + hook server)": (sidecar_ms + node_ms) / HOOK_CALLS_PER_TURN,
            "  sidecar CPU per turn added by remote hooks, ms": sidecar_ms,
            "  hook server (Node) CPU per turn, ms": node_ms,
            f"turn p50 added by {HOOK_CALLS_PER_TURN} hook calls, ms": added,
            "  the same per hook call, ms": added / HOOK_CALLS_PER_TURN,
        }
        for name, value in values.items():
            rows.setdefault(name, []).append(value)
    judged = {
        "hook call wall p50 ms",
        "hook call CPU ms (sidecar + hook server)",
        "  the same per hook call, ms",
    }
    for name, (session, unary) in rows.items():
        result.add(name, f"{session:.3f}", f"{unary:.3f}", _verdict(session) if name in judged else "")
    result.notes = [
        f"'{REMOTE_HOOKS.name}' and '{UNARY_HOOKS.name}' against '{local.name}',"
        f" {REMOTE_HOOKS.measured_turns} turns each; {HOOK_CALLS_PER_TURN} hook calls per turn plus the"
        " chunk batches (their end is inside on_chat_response's entry); wall: each hook call's entry"
        " in the sidecar's hook timeline (a posted AfterToolCall / OnStepFinish: the time to queue it)",
        "CPU: the processes' threads' time on a CPU (/proc schedstat, in ns: whole 10 ms ticks"
        " were too coarse for a block); the Node app's includes its journal of each call (the"
        " example's own work)",
    ]
    return result


def _verdict(ms_value: float) -> str:
    return "PASS" if ms_value <= TARGET_MS else "MISS"


def table(args: argparse.Namespace) -> Table:
    base = percentile(BASELINE.turn_seconds, 50)
    result = Table(
        "Remote hooks and tool host on loopback (Node.js example app) vs in process",
        [
            "configuration",
            "turn p50 ms",
            "turn p99 ms",
            "p50 ratio",
            "p50 added ms",
            "hooks p50 ms",
            "hooks p99 ms",
            "tool-call hooks p50 ms",
            "tool-call hooks p99 ms",
        ],
    )
    for config in CONFIGS:
        p50 = percentile(config.turn_seconds, 50)
        result.add(
            config.name,
            *(ms(percentile(config.turn_seconds, p)) for p in (50, 99)),
            f"{p50 / base:.2f}x",
            f"{(p50 - base) * 1000:+.2f}",
            *(
                ms(percentile(samples, p))
                for samples in (config.hook_seconds, config.tool_hook_seconds)
                for p in (50, 99)
            ),
        )
    result.notes = [
        f"{args.rounds} rounds x {args.turns} turns per configuration (after {args.warmup_rounds} warm-up"
        " round(s)), configurations interleaved, one turn at a time, each a Chat on a new conversation;"
        f" ratio and added ms against '{BASELINE.name}'",
        "a turn: 2 steps, 1 tool call (lookup_order); remote hooks: 8 hook calls + the chunk batches per"
        " turn (BeforeTurn, 2 BeforeStep, BeforeToolCall, AfterToolCall, 2 OnStepFinish, OnChatResponse):"
        " on one HookSession, or unary RPCs + 1 OnChunks call",
        "hooks: the sum of the turn's hook durations in the sidecar's hook timeline;"
        " tool-call hooks: before_tool_call + after_tool_call of the one call",
    ]
    return result


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=8, help="measured rounds (default 8)")
    parser.add_argument(
        "--turns", type=int, default=25, help="turns per configuration per round (default 25)"
    )
    parser.add_argument("--warmup-rounds", type=int, default=1, help="rounds not measured (default 1)")
    parser.add_argument("--json", type=Path, help="write the table as JSON here (for bench/run.py)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-remote-") as tmp:
        workdir = Path(tmp)
        node_address = f"127.0.0.1:{free_port()}"
        with (workdir / "node-app.log").open("wb") as log:
            # One Node app for every configuration: the sidecars wait for it at their start.
            node = subprocess.Popen(
                [shutil.which("node") or "node", str(NODE_APP), "serve", "--listen", node_address],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                result = asyncio.run(measure(args, workdir, node_address, node.pid))
            finally:
                node.terminate()
                node.wait()
    if args.json:
        write_tables_json(args.json, result)
    else:
        print_tables(result)


if __name__ == "__main__":
    main()
