"""Time to first token and CPU per turn through the real sidecar vs the bare SDK (issue 17).

One local upstream (``_upstream.py``, its own process) speaks the Anthropic Messages and OpenAI
Chat Completions streaming formats. Two sidecars (``python -m turnwire_server serve``, SQLite
store, ``openai`` and ``anthropic`` providers pointed at the upstream) run in their own processes,
one with no middleware and one with five (``_ttft_middlewares:EveryHookNoop``: every hook, a
no-op). This process is the client: a ``grpc.aio`` Chat caller for the sidecar, and the official
``openai.AsyncOpenAI`` / ``anthropic.AsyncAnthropic`` client calling the same upstream for the
bare SDK.

(a) **Time to first token** (call → first *text delta* received: ``text_delta`` event from the
    sidecar, the first non-empty content delta from the SDK), sequential turns with a 4-delta
    answer, for 0 and 5 middlewares and conversations with 0, 100 and 1,000 prior turns (seeded
    with ``AddMessages``, one call; the bare SDK sends the same history as dicts, growing it per
    turn as an application would). Sidecar and SDK requests alternate one by one (pairs),
    ``--rounds`` rounds of ``--pairs`` pairs; p50/p99 over all pairs; *added* = sidecar - SDK.
    **Server CPU per request** = the sidecar process's CPU (psutil, all threads) over a round /
    its requests (the sidecar is idle during the SDK's half of each pair).
(b) **Throughput** at 16 and 100 concurrent streams, 64-delta answers, burst (written at once)
    and paced (2 ms before each delta): the upstream's text deltas received per second in a
    window (for the sidecar, which merges deltas its writer is behind on, words of text: one
    per upstream delta), sidecar
    (no middleware, new conversation per turn) vs SDK, interleaved per round; **server CPU per
    chunk** = sidecar CPU in the window / deltas received.
(c) **Memory per open stream**: ``--hold`` streams whose upstream sends one delta and then
    nothing; each client reads its first token and then stops reading. RSS growth / streams.
    (Readers that never read or read slowly: ``slow_readers.py``.)

Targets (issue 17): added TTFT p50 ≤ 1.5 ms and p99 ≤ 3 ms with 5 middlewares; ≤ +0.2 ms of
added TTFT from 0 to 1,000 prior turns; server CPU ≤ 2 ms per request (4-delta answer);
throughput ≥ 0.9x the SDK at 16 streams; ≤ 60 µs server CPU per streamed chunk. Printed with
PASS/MISS, never asserted. On a 2-core machine the client, the upstream and the sidecar share
the cores: read CPU columns first.

    .venv/bin/python bench/ttft.py [--quick] [--rounds 3] [--pairs 30] [--json PATH]

``--budget`` runs issue 33's harness shape instead (``_ttft_budget.py``: interleaved pairs of
arms of ``--requests`` requests, medians of per-pair differences, the per-turn budget):

    .venv/bin/python bench/ttft.py --budget [--pairs 3] [--requests 200] [--window 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anthropic.types import MessageParam

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import _ttft_budget  # noqa: E402
from _common import (  # noqa: E402
    REPO,
    ServerProcess,
    Table,
    percentile,
    print_tables,
    verdict,
    wait_for_quiet,
    write_tables_json,
)
from _ttft_clients import (  # noqa: E402
    QUESTION,
    BareClient,
    SidecarClient,
    Upstream,
    new_conversation_id,
    sidecar,
    text_message,
)

from turnwire_client.v1 import chat_service_pb2, message_pb2  # noqa: E402

APIS = ("openai", "anthropic")
ADDED_P50_TARGET_MS = 1.5
ADDED_P99_TARGET_MS = 3.0
HISTORY_GROWTH_TARGET_MS = 0.2
CPU_PER_REQUEST_TARGET_MS = 2.0
THROUGHPUT_TARGET = 0.9
CPU_PER_CHUNK_TARGET_US = 60.0
STREAM_DELTAS = 64


@dataclass
class Options:
    """What to run; ``--quick`` shrinks everything to a smoke run (~40 s)."""

    rounds: int = 3
    pairs: int = 30
    histories: tuple[int, ...] = (0, 100, 1000)
    middlewares: tuple[int, ...] = (0, 5)
    levels: tuple[int, ...] = (16, 100)
    window: float = 3.0
    hold: int = 500
    skip_throughput: bool = False
    skip_memory: bool = False

    @classmethod
    def quick(cls) -> Options:
        return cls(rounds=2, pairs=8, histories=(0, 1000), window=1.0, hold=50)


# ----------------------------------------------------------------------------- (a) TTFT


@dataclass
class TtftRow:
    api: str
    middlewares: int
    history: int
    sidecar: list[float] = field(default_factory=list)
    bare: list[float] = field(default_factory=list)
    cpu_per_request: list[float] = field(default_factory=list)  # s, one per round
    sdk_cpu_per_request: list[float] = field(default_factory=list)  # s, this process, one per round


async def measure_ttft(
    opts: Options, servers: dict[int, ServerProcess], clients: dict[int, SidecarClient], upstream: str
) -> list[TtftRow]:
    rows: dict[tuple[str, int, int], TtftRow] = {}
    state: dict[tuple[str, int, int], tuple[str, list[MessageParam]]] = {}
    bare = {api: BareClient(api, upstream) for api in APIS}
    try:
        for api in APIS:
            for mw in opts.middlewares:
                for history in opts.histories:
                    key = (api, mw, history)
                    rows[key] = TtftRow(api, mw, history)
                    conversation = f"ttft-{api}-{mw}-{history}-{uuid.uuid4().hex[:8]}"
                    await clients[mw].seed(conversation, history)
                    state[key] = (conversation, BareClient.history(history))
                    # Warm-up: connections, the SDK's first-call costs, the sidecar's caches.
                    for _ in range(3):
                        await clients[mw].turn(
                            conversation if history else new_conversation_id(), f"{api}:burst-4"
                        )
                        await bare[api].turn(list(state[key][1]), "burst-4")
        for round_number in range(opts.rounds):
            await wait_for_quiet(max_wait=3.0)
            for key, row in rows.items():
                api, mw, history = key
                conversation, transcript = state[key]
                server = servers[mw]
                cpu0 = server.cpu_seconds()
                sdk_cpu = 0.0
                for _ in range(opts.pairs):
                    first, _ = await clients[mw].turn(
                        conversation if history else new_conversation_id(), f"{api}:burst-4"
                    )
                    row.sidecar.append(first)
                    # Turns are sequential: this process's CPU over the SDK's turn is the SDK's.
                    sdk0 = time.process_time()
                    first, _ = await bare[api].turn(transcript if history else [], "burst-4")
                    sdk_cpu += time.process_time() - sdk0
                    row.bare.append(first)
                row.cpu_per_request.append((server.cpu_seconds() - cpu0) / opts.pairs)
                row.sdk_cpu_per_request.append(sdk_cpu / opts.pairs)
            print(f"  [ttft round {round_number + 1}/{opts.rounds} done]", file=sys.stderr, flush=True)
    finally:
        for client in bare.values():
            await client.close()
    return list(rows.values())


def ttft_table(rows: list[TtftRow], opts: Options) -> Table:
    table = Table(
        "Time to first token, sidecar vs bare SDK (sequential turns, 4-delta answer)",
        [
            "API",
            "middlewares",
            "prior turns",
            "SDK p50/p99 ms",
            "sidecar p50/p99 ms",
            "added p50/p99 ms",
            "ratio p50",
            "added vs 0 turns ms",
            "srv CPU ms/request",
            "SDK CPU ms/request",
            "target",
        ],
    )
    base: dict[tuple[str, int], float] = {}
    for row in rows:
        s50, s99 = percentile(row.sidecar, 50) * 1e3, percentile(row.sidecar, 99) * 1e3
        b50, b99 = percentile(row.bare, 50) * 1e3, percentile(row.bare, 99) * 1e3
        added50, added99 = s50 - b50, s99 - b99
        if row.history == 0:
            base[(row.api, row.middlewares)] = added50
        growth = added50 - base.get((row.api, row.middlewares), added50)
        cpu = statistics.median(row.cpu_per_request) * 1e3
        checks = [cpu <= CPU_PER_REQUEST_TARGET_MS]
        if row.middlewares == 5:
            checks += [added50 <= ADDED_P50_TARGET_MS, added99 <= ADDED_P99_TARGET_MS]
        if row.history:
            checks.append(growth <= HISTORY_GROWTH_TARGET_MS)
        table.add(
            row.api,
            row.middlewares,
            f"{row.history:,}",
            f"{b50:.2f} / {b99:.2f}",
            f"{s50:.2f} / {s99:.2f}",
            f"{added50:+.2f} / {added99:+.2f}",
            f"{s50 / b50:.2f}x",
            f"{growth:+.2f}" if row.history else "",
            f"{cpu:.2f}",
            f"{statistics.median(row.sdk_cpu_per_request) * 1e3:.2f}",
            verdict(all(checks)),
        )
    table.notes += [
        f"{opts.rounds} rounds x {opts.pairs} pairs per row (a sidecar turn, then an SDK turn); "
        "p50/p99 over all "
        "pairs; time to first token = call to the first text delta received.",
        f"Targets: added p50 <= {ADDED_P50_TARGET_MS} ms and p99 <= {ADDED_P99_TARGET_MS} ms "
        "(5 middlewares); "
        f"added p50 grows <= {HISTORY_GROWTH_TARGET_MS} ms from 0 prior turns; server CPU <= "
        f"{CPU_PER_REQUEST_TARGET_MS} ms per request (median of rounds).",
        "Prior turns: a seeded conversation (user + assistant message per turn) that grows by one turn per "
        "request; the SDK sends the same growing history. 0 prior turns: a new conversation per request.",
        "SDK CPU: this process's CPU over the bare SDK's turn (building the request, HTTP, parsing every "
        "event into the SDK's types), for scale: the sidecar pays its own HTTP call and SSE parsing "
        "(raw events, not the SDK's types) inside its server CPU, besides gRPC, hooks and the store.",
    ]
    return table


# ----------------------------------------------------------------------------- (b) throughput


@dataclass
class Window:
    deltas: int
    seconds: float
    cpu: float  # CPU seconds in the window: the sidecar process's, or this process's for the SDK


async def _window(run_one: Callable[[], Awaitable[int]], streams: int, window: float) -> tuple[int, float]:
    """``streams`` tasks running turns back to back; deltas received by turns that end in the
    window (after a warm-up of a quarter window), and the window's length."""
    counted = 0
    start = time.perf_counter()
    begin = start + window / 4
    end = begin + window

    async def worker() -> None:
        nonlocal counted
        while time.perf_counter() < end:
            deltas = await run_one()
            if begin <= time.perf_counter() <= end:
                counted += deltas

    await asyncio.gather(*(worker() for _ in range(streams)))
    return counted, window


async def measure_throughput(
    opts: Options, server: ServerProcess, client: SidecarClient, upstream: str
) -> Table:
    table = Table(
        f"Throughput, {STREAM_DELTAS}-delta answers, sidecar (no middleware) vs bare SDK",
        [
            "API",
            "streams",
            "pacing",
            "SDK deltas/s",
            "sidecar deltas/s",
            "ratio",
            "srv CPU us/chunk",
            "SDK CPU us/chunk",
            "srv cores",
            "target",
        ],
    )
    bare = {api: BareClient(api, upstream) for api in APIS}
    results: dict[tuple[str, int, str], dict[str, list[Window]]] = {}
    try:
        for round_number in range(opts.rounds):
            for api in APIS:
                for streams in opts.levels:
                    for pacing in ("burst", "paced"):
                        model = f"{pacing}-{STREAM_DELTAS}"
                        entry = results.setdefault((api, streams, pacing), {"sdk": [], "sidecar": []})
                        await wait_for_quiet(max_wait=2.0)

                        async def sdk_turn(api: str = api, model: str = model) -> int:
                            return (await bare[api].turn([], model))[1]

                        sdk0, t0 = time.process_time(), time.perf_counter()
                        deltas, seconds = await _window(sdk_turn, streams, opts.window)
                        sdk_cpu = (time.process_time() - sdk0) * seconds / (time.perf_counter() - t0)
                        entry["sdk"].append(Window(deltas, seconds, sdk_cpu))

                        async def sidecar_turn(api: str = api, model: str = model) -> int:
                            return (await client.turn(new_conversation_id(), f"{api}:{model}"))[1]

                        cpu0 = server.cpu_seconds()
                        t0 = time.perf_counter()
                        # The window's CPU: measured over the whole run (warm-up included) and
                        # scaled to the counted window by wall time.
                        deltas, seconds = await _window(sidecar_turn, streams, opts.window)
                        wall = time.perf_counter() - t0
                        cpu = (server.cpu_seconds() - cpu0) * seconds / wall
                        entry["sidecar"].append(Window(deltas, seconds, cpu))
            print(f"  [throughput round {round_number + 1}/{opts.rounds} done]", file=sys.stderr, flush=True)
    finally:
        for bare_client in bare.values():
            await bare_client.close()
    for (api, streams, pacing), entry in results.items():
        sdk_rate = statistics.median(w.deltas / w.seconds for w in entry["sdk"])
        rate = statistics.median(w.deltas / w.seconds for w in entry["sidecar"])
        per_chunk = statistics.median(w.cpu / w.deltas * 1e6 for w in entry["sidecar"] if w.deltas)
        sdk_per_chunk = statistics.median(w.cpu / w.deltas * 1e6 for w in entry["sdk"] if w.deltas)
        cores = statistics.median(w.cpu / w.seconds for w in entry["sidecar"])
        ratio = rate / sdk_rate if sdk_rate else float("nan")
        checks = [per_chunk <= CPU_PER_CHUNK_TARGET_US]
        if streams == 16:
            checks.append(ratio >= THROUGHPUT_TARGET)
        table.add(
            api,
            streams,
            pacing,
            f"{sdk_rate:,.0f}",
            f"{rate:,.0f}",
            f"{ratio:.2f}x",
            f"{per_chunk:.1f}",
            f"{sdk_per_chunk:.1f}",
            f"{cores:.2f}",
            verdict(all(checks)),
        )
    table.notes += [
        f"{opts.rounds} rounds of a {opts.window:g} s window per row (SDK, then sidecar); medians. A new "
        "conversation per sidecar turn. Paced: 2 ms before each delta at the upstream.",
        f"Targets: ratio >= {THROUGHPUT_TARGET} at 16 streams; "
        f"<= {CPU_PER_CHUNK_TARGET_US:g} us server CPU per "
        "chunk (the whole turn's server CPU / deltas, so per-turn costs are included). SDK CPU: this "
        "process's CPU in the SDK's window / deltas (the bare SDK's whole cost per chunk, for scale).",
        "The client, the upstream and the sidecar share 2 cores: at 100 streams the client bounds both "
        "sides.",
    ]
    return table


# ----------------------------------------------------------------------------- (c) memory


async def measure_memory(opts: Options, workdir: Path, upstream: str) -> Table:
    """A fresh sidecar; ``opts.hold`` streams held open after their first token, unread."""
    home = workdir / "memory"
    home.mkdir()
    fresh = sidecar(home, upstream, middlewares=0)
    await fresh.start()
    client = SidecarClient(fresh.target)
    table = Table(
        "Memory per open stream (sidecar, no middleware)",
        ["streams", "RSS before MB", "RSS open MB", "KB/stream", "RSS after close MB"],
    )
    try:
        for _ in range(20):
            await client.turn(new_conversation_id(), "openai:burst-4")
        await fresh.settle()
        before = fresh.rss()
        calls = []
        firsts = []
        for _ in range(opts.hold):
            request = chat_service_pb2.ChatRequest(
                conversation_id=new_conversation_id(),
                message=text_message(message_pb2.ROLE_USER, QUESTION),
                model="openai:hold",
            )
            call = client.stub.Chat(request)
            calls.append(call)
            firsts.append(asyncio.ensure_future(_first_token(call)))
        await asyncio.gather(*firsts)
        await fresh.settle()
        opened = fresh.rss()
        for call in calls:
            call.cancel()
        await fresh.settle(max_wait=10.0)
        after = fresh.rss()
        table.add(
            opts.hold,
            f"{before / 2**20:.1f}",
            f"{opened / 2**20:.1f}",
            f"{(opened - before) / opts.hold / 1024:.1f}",
            f"{after / 2**20:.1f}",
        )
        table.notes.append(
            "Each stream: a turn admitted and stored, its model call open on an upstream connection that "
            "sent one delta; the client read up to that delta and stopped reading. Stuck and slow readers: "
            "slow_readers.py."
        )
    finally:
        await client.close()
        fresh.stop()
    return table


async def _first_token(call: Any) -> None:
    async for response in call:
        if response.event.WhichOneof("event") == "text_delta":
            return


# ----------------------------------------------------------------------------- main


async def run(opts: Options) -> list[Table]:
    """Every measurement; the tables."""
    # The sidecars import the middleware module from here.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")]))
    upstream = Upstream()
    tables: list[Table] = []
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-ttft-") as tmp:
        workdir = Path(tmp)
        servers = {mw: sidecar(workdir, upstream.url, mw) for mw in opts.middlewares}
        clients: dict[int, SidecarClient] = {}
        try:
            for server in servers.values():
                await server.start()
            clients = {mw: SidecarClient(server.target) for mw, server in servers.items()}
            rows = await measure_ttft(opts, servers, clients, upstream.url)
            tables.append(ttft_table(rows, opts))
            if not opts.skip_throughput:
                tables.append(
                    await measure_throughput(
                        opts, servers[opts.middlewares[0]], clients[opts.middlewares[0]], upstream.url
                    )
                )
        finally:
            for client in clients.values():
                await client.close()
            for server in servers.values():
                server.stop()
        if not opts.skip_memory:
            tables.append(await measure_memory(opts, workdir, upstream.url))
    upstream.close()
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (~40 s)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--pairs", type=int)
    parser.add_argument("--histories", help="prior turns, comma-separated (default 0,100,1000)")
    parser.add_argument("--window", type=float, help="throughput window, seconds")
    parser.add_argument("--hold", type=int, help="streams held open for the memory row")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--budget", action="store_true", help="issue 33's harness and per-turn budget")
    parser.add_argument("--requests", type=int, help="--budget: requests per arm (default 200)")
    parser.add_argument("--json", type=Path, help="write the tables as JSON here instead of printing them")
    args = parser.parse_args()
    if args.budget:
        budget = _ttft_budget.BudgetOptions()
        for name, value in (("pairs", args.pairs), ("requests", args.requests), ("window", args.window)):
            if value is not None:
                setattr(budget, name, value)
        tables = asyncio.run(_ttft_budget.run_budget(budget))
        if args.json:
            write_tables_json(args.json, tables)
        else:
            print_tables(tables)
        return
    opts = Options.quick() if args.quick else Options()
    for name in ("rounds", "pairs", "window", "hold"):
        if getattr(args, name) is not None:
            setattr(opts, name, getattr(args, name))
    if args.histories:
        opts.histories = tuple(int(x) for x in args.histories.split(","))
    opts.skip_throughput, opts.skip_memory = args.skip_throughput, args.skip_memory
    tables = asyncio.run(run(opts))
    if args.json:
        write_tables_json(args.json, tables)
    else:
        print_tables(tables)


if __name__ == "__main__":
    os.chdir(REPO)
    main()
