"""The cost ledger of one turn (issue 33): where the time from a Chat's arrival to its first token
on the wire goes, and the server's CPU per request by phase.

The sidecar runs in a child process of this script (``--one``), in process through
``turnwire_server.app.start`` (SQLite in a temp dir, the ``openai`` and ``anthropic`` providers
on ``_upstream.py``, no middleware, demo tools off: ``ttft.py --budget``'s sidecar), and is
instrumented from outside: probes wrap the functions a turn passes through on its way to the
first token (bench-only patches; the server source is untouched) and each probe records a mark:
wall time (``perf_counter``), the event loop thread's CPU (``thread_time``) and the process's CPU
(``process_time``: all threads, the SQLite writer's and reader's included). A client process
(``--client``) runs sequential Chat turns, so one request is in flight at a time and the marks of
one request are one timeline: the interval from one mark to the next is a phase, named by the
mark that opens it (:data:`PHASES`). Marks, in the order a turn reaches them:

``arrive`` (the first interceptor sees the call) → ``chat>`` (the servicer's handler runs:
interceptors and request decoding done) → ``engine.start>`` (validated) → ``engine.start<``
(admitted: checks, queue place, the turn's task) → ``commit>`` / ``commit<`` (``Store.start_turn``:
the input's durable commit, taken in the turn lock) → ``history>`` / ``history<``
(``load_messages``) → ``find>`` … ``repair<`` (the open-calls search and ``repair_pending``) →
``before_turn>`` / ``<``, ``before_step>`` / ``<`` (the hook chain) → ``provider>`` (the
adapter's stream opens) → ``http>`` (the SDK sends the request) → ``http<`` (response headers
in) → ``sse:<event>`` and ``chunk:<type>`` (each SSE event parsed and each chunk the adapter
yields, up to the first text delta) → ``write:…>`` / ``<`` (each gRPC write up to the first
text delta's) → ``chat<`` (the call ends: the rest of the turn).

Per configuration (API x prior turns x observability off/on) the table gives, per phase, the
median wall time and the mean loop-thread and process CPU per request; the phases add up to
the time to the first token and to the CPU per request. "on": ``tracing.enabled`` exporting
every trace over OTLP/gRPC to ``_otlp_sink.py`` and ``metrics.enabled`` (its endpoint served).
``--profile DIR`` instead profiles each configuration with cProfile (a separate run: the
profiler's overhead would distort the ledger) and writes the top functions to DIR.

    .venv/bin/python bench/turn_ledger.py [--turns 200] [--histories 0,100] [--apis openai,anthropic]
        [--observability off,on] [--profile DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _common import PYTHON, Table, free_port, print_tables  # noqa: E402

WARM_TURNS = 20
PHASES: dict[str, str] = {
    "arrive": "interceptors (observer, auth, call gate), request decode",
    "chat>": "validation",
    "engine.start>": "admission, queue place, turn task",
    "engine.start<": "turn lock, record (to the commit)",
    "commit>": "durable commit (SQLite writer)",
    "commit<": "TurnStart, step loop entry",
    "history>": "history read",
    "history<": "(history → repair)",
    "find>": "transcript repair (open calls)",
    "find<": "transcript repair (open calls)",
    "repair>": "transcript repair (open calls)",
    "repair<": "view, compaction check",
    "before_turn>": "hooks: before_turn",
    "before_turn<": "turn setup (tools, timers)",
    "before_step>": "hooks: before_step",
    "before_step<": "step setup (model request)",
    "provider>": "request building (convert, JSON)",
    "http>": "upstream until first byte (headers)",
    "http<": "response start (SSE reader)",
    "sse>": "upstream events until the first text delta (read, decode)",
    "chat<": "",
}
LAST = "write:text_delta<"
REST = "rest of the turn (after the first token)"


# ----------------------------------------------------------------------------- probes (server side)


class Marks:
    """The marks of the request in flight (one at a time) and of those done."""

    def __init__(self) -> None:
        self.current: list[tuple[str, float, float, float]] | None = None
        self.done: list[list[tuple[str, float, float, float]]] = []
        self.first_written = False
        self.token_seen = False

    def mark(self, label: str) -> None:
        if self.current is not None:
            self.current.append((label, time.perf_counter(), time.thread_time(), time.process_time()))

    def begin(self) -> None:
        self.current = []
        self.first_written = False
        self.token_seen = False
        self.mark("arrive")

    def end(self) -> None:
        if self.current is not None:
            self.mark("chat<")
            self.done.append(self.current)
        self.current = None


def _coroutine(marks: Marks, owner: Any, name: str, label: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    async def probe(*args: Any, **kwargs: Any) -> Any:
        marks.mark(f"{label}>")
        try:
            return await original(*args, **kwargs)
        finally:
            marks.mark(f"{label}<")

    setattr(owner, name, probe)


def _function(marks: Marks, owner: Any, name: str, enter: str | None, leave: str | None) -> None:
    raw = vars(owner).get(name) if isinstance(owner, type) else None
    wrapped = raw.__func__ if isinstance(raw, classmethod) else getattr(owner, name)

    @functools.wraps(wrapped)
    def probe(*args: Any, **kwargs: Any) -> Any:
        if enter:
            marks.mark(enter)
        try:
            return wrapped(*args, **kwargs)
        finally:
            if leave:
                marks.mark(leave)

    if isinstance(raw, classmethod):
        setattr(owner, name, classmethod(probe))
    else:
        setattr(owner, name, probe)


def _items(marks: Marks, owner: Any, name: str, enter: str, prefix: str) -> None:
    """An async generator function: marks its first step and each item it yields up to the
    turn's first text delta (``<prefix>:<what>``, ``what`` from :func:`_what`)."""
    original = getattr(owner, name)

    @functools.wraps(original)
    async def probe(*args: Any, **kwargs: Any) -> Any:
        marks.mark(enter)
        async with contextlib.aclosing(original(*args, **kwargs)) as items:
            async for item in items:
                if not marks.first_written:
                    what = _what(item)
                    marks.mark(f"{prefix}:{what}")
                yield item

    setattr(owner, name, probe)


def _what(item: Any) -> str:
    """A chunk's type, or an SSE event's name (its ``type`` field for OpenAI's unnamed events)."""
    if isinstance(item, tuple):
        event = item[0]
        return (event or b"data").decode()
    return type(item).__name__


def instrument(marks: Marks) -> None:
    """Every probe of the module docstring but the store's, patched into this process's server
    code before it starts (gRPC keeps the servicer's bound methods it was given)."""
    import httpx2

    from turnwire_server.api import admission as gate_module
    from turnwire_server.api import chat_service
    from turnwire_server.api.rpc_observer import RpcObserver
    from turnwire_server.engine import step_loop
    from turnwire_server.engine.engine import TurnEngine
    from turnwire_server.engine.pending_calls import OpenCalls
    from turnwire_server.hooks.chain import TurnHooks
    from turnwire_server.providers import streaming

    intercept = RpcObserver.intercept_service

    async def arriving(self: Any, continuation: Any, details: Any) -> Any:
        if details.method.endswith("/Chat"):
            marks.begin()
        return await intercept(self, continuation, details)

    RpcObserver.intercept_service = arriving  # type: ignore[assignment,method-assign]

    chat = chat_service.ChatService.Chat

    async def chatting(self: Any, request: Any, context: Any) -> Any:
        marks.mark("chat>")
        try:
            async for response in chat(self, request, context):
                yield response
        finally:
            marks.end()

    chat_service.ChatService.Chat = chatting  # type: ignore[method-assign]

    async def respond(behavior: Any, request: Any, context: Any) -> None:
        # admission._respond, with a mark around each write up to the first text delta's.
        async with contextlib.aclosing(behavior(request, context)) as responses:
            async for response in responses:
                if marks.first_written:
                    await context.write(response)
                    continue
                kind = response.event.WhichOneof("event")
                marks.mark(f"write:{kind}>")
                await context.write(response)
                marks.mark(f"write:{kind}<")
                marks.first_written = kind == "text_delta"  # the turn's other marks stop here

    gate_module._respond = respond

    _coroutine(marks, TurnEngine, "start", "engine.start")
    _function(marks, OpenCalls, "find", "find>", "find<")
    _function(marks, step_loop, "repair_pending", "repair>", "repair<")
    _coroutine(marks, TurnHooks, "before_turn", "before_turn")
    _coroutine(marks, TurnHooks, "before_step", "before_step")
    _items(marks, streaming.SdkProvider, "stream", "provider>", "chunk")
    _items(marks, streaming, "iter_sse", "sse>", "sse")
    _coroutine(marks, httpx2.AsyncClient, "send", "http")


def phases_of(timeline: list[tuple[str, float, float, float]]) -> dict[str, tuple[float, float, float]]:
    """Phase → (wall s, loop CPU s, process CPU s) of one request; "to first token" and "whole
    turn" totals; the rest of the turn after the first token as its own phase."""
    out: dict[str, list[float]] = {}
    first_token = next(i for i, m in enumerate(timeline) if m[0] == LAST)
    # The first token's write starts (``write:text_delta>``); the turn's own marks may follow it
    # before the write's end.
    sending = max(i for i, m in enumerate(timeline[:first_token]) if m[0] == "write:text_delta>")
    current = "arrive"  # the turn's own progress: a write's end hands the loop back to it
    for index, (label, wall, thread, process) in enumerate(timeline[:-1]):
        following = timeline[index + 1]
        if index == sending:
            name = "gRPC write of the first token (its start)"
        elif index > sending:
            name = REST
        elif label.startswith("write:") and label.endswith(">"):
            name = "gRPC writes of the events before it"
        else:
            if not label.startswith("write:"):
                current = label
            if current.startswith("sse:") or (current.startswith("chunk:") and current != "chunk:TextDelta"):
                name = "upstream events until the first text delta (read, decode)"
            elif current == "chunk:TextDelta":
                name = "first text delta to the RPC's write"
            else:
                name = PHASES.get(current, current)
        entry = out.setdefault(name, [0.0, 0.0, 0.0])
        entry[0] += following[1] - wall
        entry[1] += following[2] - thread
        entry[2] += following[3] - process
    start, stop, last = timeline[0], timeline[sending], timeline[-1]
    # CPU to the first token: every phase but the rest of the turn (work of the turn that runs while
    # the first token's write is in flight is the rest's); wall: arrival to the write's start (gRPC
    # sends it from its own thread; the loop learns that the write completed only when it is free).
    before = [v for k, v in out.items() if k != REST]
    out["= to first token"] = [stop[1] - start[1], sum(v[1] for v in before), sum(v[2] for v in before)]
    out["= whole call"] = [last[1] - start[1], last[2] - start[2], last[3] - start[3]]
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


async def serve_one(args: argparse.Namespace) -> dict[str, Any]:
    """This child's configuration: start, instrument, drive the client, return the ledger."""
    from _ttft_clients import Upstream

    from turnwire_server.app import start
    from turnwire_server.collector import tune_collector
    from turnwire_server.config import Settings

    upstream = Upstream()
    sink: subprocess.Popen[bytes] | None = None
    try:
        with tempfile.TemporaryDirectory(prefix="turnwire-ledger-") as tmp:
            port = free_port()
            extra: dict[str, Any] = {}
            if args.observability == "on":
                sink_port = free_port()
                sink = subprocess.Popen(  # noqa: ASYNC220  (before the measurement)
                    [
                        PYTHON,
                        str(BENCH / "_otlp_sink.py"),
                        "--port",
                        str(sink_port),
                        "--count",
                        str(Path(tmp) / "spans"),
                    ]
                )
                extra["tracing"] = {"enabled": True, "endpoint": f"http://127.0.0.1:{sink_port}"}
                extra["metrics"] = {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}
            settings = Settings(
                listen=f"127.0.0.1:{port}",
                default_model="openai:burst-4",
                logging={"level": "warning"},
                store={"url": f"sqlite:///{Path(tmp) / 'turnwire.db'}"},
                providers={
                    "openai": {
                        "type": "openai",
                        "base_url": f"{upstream.url}/v1",
                        "api_key_env": None,
                        "max_retries": 0,
                    },
                    "anthropic": {
                        "type": "anthropic",
                        "base_url": upstream.url,
                        "api_key_env": None,
                        "max_retries": 0,
                    },
                },
                tools={"demo": False},
                limits={"shutdown_grace_seconds": 1},
                **extra,
            )
            marks = Marks()
            if not args.profile_out:
                instrument(marks)
            sidecar = await start(settings)
            tune_collector()  # as `turnwire serve` runs: its collector settings (bench/turn_ledger.md)
            if not args.profile_out:
                _coroutine(marks, sidecar.store, "start_turn", "commit")
                _coroutine(marks, sidecar.store, "load_messages", "history")
            # The event loop thread's CPU time as the clock: waits for the GIL or for a core on a
            # loaded machine are not charged to whatever function was running.
            profiler = cProfile.Profile(time.thread_time) if args.profile_out else None
            try:
                client = await asyncio.create_subprocess_exec(
                    PYTHON,
                    str(Path(__file__)),
                    "--client",
                    f"127.0.0.1:{port}",
                    "--api",
                    args.api,
                    "--history",
                    str(args.history),
                    "--turns",
                    str(args.turns),
                    stdout=asyncio.subprocess.PIPE,
                )
                assert client.stdout is not None
                await client.stdout.readline()  # "warm": the warm-up turns are done
                marks.done.clear()
                if profiler is not None:
                    profiler.enable()
                if await client.wait():
                    raise RuntimeError("the ledger's client failed")
                if profiler is not None:
                    profiler.disable()
            finally:
                await sidecar.stop()
            if profiler is not None:
                text = io.StringIO()
                stats = pstats.Stats(profiler, stream=text)
                stats.sort_stats("tottime").print_stats(25)
                stats.sort_stats("cumulative").print_stats(40)
                Path(args.profile_out).write_text(  # noqa: ASYNC240  (after the measurement)
                    _trimmed(text.getvalue(), args.turns)
                )
            timelines = [t for t in marks.done if any(m[0] == LAST for m in t)]
            if os.environ.get("TURNWIRE_LEDGER_DUMP"):  # one request's marks, to read the timeline
                t0 = timelines[-1][0]
                for label, wall, thread, _ in timelines[-1]:
                    print(
                        f"{label:24} {(wall - t0[1]) * 1e6:9.0f} {(thread - t0[2]) * 1e6:9.0f}",
                        file=sys.stderr,
                    )
            return {"ledgers": [phases_of(t) for t in timelines] if not args.profile_out else []}
    finally:
        if sink is not None:
            sink.terminate()
            sink.wait()
        upstream.close()


def _trimmed(report: str, turns: int) -> str:
    """pstats' text, paths shortened to the package, for a committed summary."""
    lines = [
        f"cProfile of the sidecar's event loop thread over {turns} sequential turns, its CPU time as the "
        "clock (bench/turn_ledger.py --profile)",
        "",
    ]
    for line in report.splitlines():
        for marker in ("site-packages/", "/server/", "/middleware/", "/lib/python3"):
            if marker in line:
                head, _, tail = line.partition(marker)
                line = head[: head.rfind(" ") + 1] + tail if " " in head else tail  # noqa: PLW2901
        lines.append(line.rstrip())
    return "\n".join(lines).strip() + "\n"


# ----------------------------------------------------------------------------- the client (its own process)


async def drive(target: str, api: str, history: int, turns: int) -> None:
    """Warm-up turns, "warm" on stdout, then ``turns`` sequential turns: on a conversation seeded
    with ``history`` prior turns (growing by one per turn), or a new conversation per turn."""
    from _ttft_clients import SidecarClient, new_conversation_id

    client = SidecarClient(target)
    conversation = new_conversation_id()
    await client.seed(conversation, history)
    model = f"{api}:burst-4"
    for _ in range(WARM_TURNS):
        await client.turn(conversation if history else new_conversation_id(), model)
    print("warm", flush=True)
    for _ in range(turns):
        await client.turn(conversation if history else new_conversation_id(), model)
    await client.close()


# ----------------------------------------------------------------------------- the table (parent)


def ledger_table(
    api: str, history: int, runs: dict[str, list[dict[str, tuple[float, float, float]]]]
) -> Table:
    """One configuration's phases: observability off and on side by side."""
    variants = list(runs)
    columns = ["phase"]
    for variant in variants:
        columns += [f"{variant}: wall p50 µs", f"{variant}: loop CPU µs", f"{variant}: process CPU µs"]
    table = Table(
        f"Ledger of one turn: {api}, {history} prior turns, observability {' / '.join(variants)}", columns
    )
    names: list[str] = []
    for ledgers in runs.values():
        for ledger in ledgers:
            names += [n for n in ledger if n not in names]
    names = [n for n in names if not n.startswith("=")] + [n for n in names if n.startswith("=")]
    for name in names:
        cells = [name]
        for variant in variants:
            values = [ledger.get(name, (0.0, 0.0, 0.0)) for ledger in runs[variant]]
            cells += [
                f"{statistics.median(v[0] for v in values) * 1e6:,.0f}",
                f"{statistics.fmean(v[1] for v in values) * 1e6:,.0f}",
                f"{statistics.fmean(v[2] for v in values) * 1e6:,.0f}",
            ]
        table.add(*cells)
    count = min(len(v) for v in runs.values())
    table.notes += [
        f"{count} sequential Chat turns per column set (after {WARM_TURNS} warm-up turns), 4-delta answers, "
        "SQLite, no middleware, demo tools off; the server in process with probes (module docstring).",
        "wall: median per phase (the medians need not add up); CPU: mean per phase (they add up to the "
        "totals). loop CPU: the event loop's thread; process CPU: every thread (SQLite writer and reader, "
        "gRPC's, the exporter's).",
    ]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--histories", default="0,100")
    parser.add_argument("--apis", default="openai,anthropic")
    parser.add_argument("--observability", default="off,on")
    parser.add_argument("--profile", type=Path, help="write cProfile summaries here instead of the ledger")
    parser.add_argument("--json", type=Path, help="write the tables as JSON here instead of printing them")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--api", help=argparse.SUPPRESS)
    parser.add_argument("--history", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--profile-out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        asyncio.run(drive(args.client, args.api, args.history, args.turns))
        return
    if args.one:
        print(json.dumps(asyncio.run(serve_one(args))))
        return
    tables = []
    for api in args.apis.split(","):
        for history in (int(h) for h in args.histories.split(",")):
            runs: dict[str, Any] = {}
            for variant in args.observability.split(","):
                argv = [PYTHON, __file__, "--one", "--api", api, "--history", str(history)]
                argv += ["--turns", str(args.turns), "--observability", variant]
                if args.profile:
                    args.profile.mkdir(parents=True, exist_ok=True)
                    argv += ["--profile-out", str(args.profile / f"profile-{api}-{history}-{variant}.txt")]
                print(f"  [ledger {api} {history} {variant}]", file=sys.stderr, flush=True)
                out = subprocess.run(argv, check=True, stdout=subprocess.PIPE, text=True).stdout
                runs[variant] = json.loads(out.strip().splitlines()[-1])["ledgers"]
            if not args.profile:
                tables.append(ledger_table(api, history, runs))
    if args.json:
        from _common import write_tables_json

        write_tables_json(args.json, tables)
    elif tables:
        print_tables(tables)


if __name__ == "__main__":
    os.chdir(BENCH.parent)
    main()
