"""Streaming overhead of Turnwire over a bare grpc.aio floor, measured in the same run.

Workload: the scripted provider streams one text block of N deltas (default
200 deltas of 4 characters, no delay), so a turn is N + 6 events: TurnStart,
StepStart, TextStart, N x TextDelta, TextEnd, StepFinish, TurnEnd (with the
stored message). The floor (``bench/floor_server.py``) streams the same N + 6
pre-built ``ChatResponse`` messages, of the same shapes and sizes, from a
bare grpc.aio server.

Every server runs in its own process (Turnwire as ``python -m server serve
--config ...`` with SQLite in a temp dir); this process is the client. The
servers under test are started together and measured in turn, interleaved
round by round (floor, Turnwire, Turnwire+coalescing, floor, ...), so drift
and other load on the machine hit them alike; while one is measured the
others are idle. The client does not deserialize responses in the timing
runs (raw bytes; the same client for the floor and Turnwire); the
correctness runs parse every event and check the reconstructed text.

Measured:
  (a) time to first event (call start -> first message), sequential turns, a
      new conversation per turn; p50/p99 floor vs Turnwire and the difference;
  (b) events/s with 1, 10 and C concurrent streams (each stream runs turns
      back to back, each turn on its own new conversation), with the server's
      CPU time per event (psutil), the client's and the rest of the machine's
      CPU use, and the time to first event under that load;
  (c) server RSS per open stream: S concurrent Chat calls held open by a
      script with a one-hour delay_ms, measured on a fresh server process;
      the floor holding S calls gives gRPC's own share; the streams are then
      closed and opened again (a leak would show as growth);
  (d) the throughput rows with ``events.text_coalesce_ms: 2``, and the
      reconstructed text checked against the script's text, also with a paced
      script (0.5 ms between deltas) where only some deltas merge.

Run alone (``python bench/stream_overhead.py [--quick] [--streams N]``) or via
``bench/run.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BENCH_DIR,
    CHAT_METHOD,
    CLIENT_OPTIONS,
    HOLD_MODEL,
    PACED_DELAY_MS,
    PACED_MODEL,
    STREAM_MODEL,
    QuietGate,
    ServerProcess,
    Table,
    chat_request,
    events_per_turn,
    fmt_ms,
    machine_busy_seconds,
    machine_summary,
    percentile,
    print_tables,
    stream_text,
    verdict,
    write_markdown,
)
from _load import load

from turnwire.v1 import chat_service_pb2, event_pb2

TARGET_TTFE_P50_MS = 1.0
TARGET_TTFE_P99_MS = 3.0
TARGET_THROUGHPUT_RATIO = 0.70
TARGET_KB_PER_STREAM = 64.0

FLOOR = "floor"
TURNWIRE = "turnwire"
PROTOTYPE = "turnwire + proposed fixes (prototype)"


@dataclass
class Options:
    deltas: int = 200
    chunk_size: int = 4
    ttfe_turns: int = 200
    warmup_turns: int = 30
    rounds: int = 2  # interleaved rounds; TTFE turns are split across them
    window: float = 3.0  # seconds measured per throughput row and round
    warm: float = 1.0  # seconds run before the window opens
    levels: tuple[int, ...] = (1, 10, 100)  # concurrent streams
    streams: int = 5000
    coalesce_ms: float = 2.0
    verify_turns: int = 300
    skip_memory: bool = False
    quiet_budget: float = 30.0  # seconds, in total, to wait for other load on the machine to stop
    with_prototype: bool = False  # also measure bench/proto_server.py (the store fixes patched in)

    @classmethod
    def quick(cls) -> Options:
        return cls(
            ttfe_turns=60,
            warmup_turns=10,
            rounds=1,
            window=1.0,
            warm=0.5,
            levels=(1, 100),
            streams=1000,
            verify_turns=60,
            quiet_budget=2.0,
        )

    @property
    def concurrency(self) -> int:
        return max(self.levels)

    def describe(self) -> str:
        return (
            f"deltas={self.deltas} chunk_size={self.chunk_size} ttfe_turns={self.ttfe_turns} "
            f"rounds={self.rounds} window={self.window:g}s warm={self.warm:g}s "
            f"levels={','.join(map(str, self.levels))} streams={self.streams} "
            f"coalesce_ms={self.coalesce_ms:g} verify_turns={self.verify_turns}"
            + (" with_prototype" if self.with_prototype else "")
        )


def _multi(channel: grpc.aio.Channel, *, parse: bool) -> Any:
    return channel.unary_stream(
        CHAT_METHOD,
        request_serializer=chat_service_pb2.ChatRequest.SerializeToString,
        response_deserializer=chat_service_pb2.ChatResponse.FromString if parse else None,
    )


# ----------------------------------------------------------------------------- (a) first event


async def time_to_first_event(target: str, turns: int, warmup: int, tag: str) -> list[float]:
    """Client-observed time from starting the call to its first message, per sequential turn."""
    samples: list[float] = []
    async with grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS) as channel:
        chat = _multi(channel, parse=False)
        for i in range(warmup + turns):
            request = chat_request(f"{tag}-ttfe-{i}")
            start = time.perf_counter()
            call = chat(request)
            first = await call.read()
            elapsed = time.perf_counter() - start
            if first is grpc.aio.EOF:
                raise RuntimeError(f"{target}: empty stream: {await call.code()}")
            while await call.read() is not grpc.aio.EOF:
                pass
            if i >= warmup:
                samples.append(elapsed)
    return samples


# ----------------------------------------------------------------------------- (b) throughput


@dataclass
class Throughput:
    streams: int
    events_per_s: float
    turns_per_s: float  # turns completed in the window (coarse: turns end in bursts)
    turn_equiv_per_s: float  # events/s / events per turn, or text/s / text per turn (coalesced)
    server_cpu_us_per_event: float
    server_cpu_util: float  # cores
    client_cpu_util: float  # cores
    other_cpu_util: float  # cores used by everything else on the machine
    ttfe_p50_ms: float  # first event of the turns started in the window
    ttfe_p99_ms: float


async def throughput(
    server: ServerProcess, streams: int, opts: Options, tag: str, *, coalesced: bool = False
) -> Throughput:
    """Each of ``streams`` workers runs turns back to back; count events in a steady window.

    ``coalesced``: events differ in size, so the client parses them and counts text; turn
    equivalents are then text per second over the text of one turn.
    """
    edges: dict[str, tuple[float, float]] = {}

    def on_window(edge: str) -> None:
        edges[edge] = (server.cpu_seconds(), machine_busy_seconds())

    result = await load(
        server.target, streams, opts.warm, opts.window, tag, on_window=on_window, count_text=coalesced
    )
    if coalesced:
        turn_equiv = result["text_chars_per_s"] / (opts.deltas * opts.chunk_size)
    else:
        turn_equiv = result["events_per_s"] / events_per_turn(opts.deltas)
    elapsed = result["window_end"] - result["window_start"]
    server_cpu = edges["end"][0] - edges["start"][0]
    machine_cpu = edges["end"][1] - edges["start"][1]
    client_cores = result["client_cores"]
    return Throughput(
        streams=streams,
        events_per_s=result["events_per_s"],
        turns_per_s=result["turns_per_s"],
        turn_equiv_per_s=turn_equiv,
        server_cpu_us_per_event=server_cpu / max(result["events"], 1) * 1e6,
        server_cpu_util=server_cpu / elapsed,
        client_cpu_util=client_cores,
        other_cpu_util=max(0.0, machine_cpu / elapsed - server_cpu / elapsed - client_cores),
        ttfe_p50_ms=result["ttfe_p50_ms"],
        ttfe_p99_ms=result["ttfe_p99_ms"],
    )


# ----------------------------------------------------------------------------- correctness


@dataclass
class Check:
    turns: int
    bad: int
    events_per_turn: float
    bytes_per_turn: float
    first_problem: str


async def check_streams(
    target: str, expected: str, *, turns: int, concurrency: int, tag: str, model: str = STREAM_MODEL
) -> Check:
    """Parse every event of ``turns`` turns (``concurrency`` at a time) and check each turn:
    sequence numbers 1..n, TurnStart first, one TurnEnd (COMPLETED) last, and the text
    rebuilt from the deltas equal to the script's text and to the stored message's text."""
    problems: list[str] = []
    events_total = 0
    bytes_total = 0
    async with grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS) as channel:
        chat = _multi(channel, parse=True)
        semaphore = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            nonlocal events_total, bytes_total
            async with semaphore:
                events: list[event_pb2.TurnEvent] = []
                async for response in chat(chat_request(f"{tag}-check-{i}", model)):
                    events.append(response.event)
                    bytes_total += response.ByteSize()
            events_total += len(events)
            problem = _turn_problem(events, expected)
            if problem:
                problems.append(f"turn {i}: {problem}")

        await asyncio.gather(*(one(i) for i in range(turns)))
    return Check(
        turns=turns,
        bad=len(problems),
        events_per_turn=events_total / turns,
        bytes_per_turn=bytes_total / turns,
        first_problem=problems[0] if problems else "",
    )


def _turn_problem(events: list[event_pb2.TurnEvent], expected: str) -> str:
    if not events:
        return "no events"
    if [e.sequence_number for e in events] != list(range(1, len(events) + 1)):
        return "sequence numbers are not 1..n"
    kinds = [e.WhichOneof("event") for e in events]
    if kinds[0] != "turn_start" or kinds[-1] != "turn_end" or kinds.count("turn_end") != 1:
        return f"bad framing {kinds[:3]}...{kinds[-2:]}"
    end = events[-1].turn_end
    if end.status != event_pb2.TURN_STATUS_COMPLETED:
        return f"status {event_pb2.TurnStatus.Name(end.status)}"
    text = "".join(e.text_delta.delta for e in events if e.WhichOneof("event") == "text_delta")
    if text != expected:
        return f"rebuilt text differs ({len(text)} vs {len(expected)} chars)"
    stored = "".join(p.text.text for p in end.message.parts if p.WhichOneof("kind") == "text")
    if stored != expected:
        return "stored message text differs"
    return ""


# ----------------------------------------------------------------------------- (c) memory


@dataclass
class Memory:
    name: str
    streams: int
    rss_before: int
    rss_open: int
    rss_closed: int
    rss_reopen: int
    milestones: list[tuple[int, int]]  # (open streams, rss) while opening the first time
    open_seconds: float

    @property
    def kb_per_stream(self) -> float:
        return (self.rss_open - self.rss_before) / self.streams / 1024

    @property
    def marginal_kb_per_stream(self) -> float:
        (n0, r0), (n1, r1) = self.milestones[0], self.milestones[-1]
        return (r1 - r0) / max(n1 - n0, 1) / 1024


async def memory_per_stream(server: ServerProcess, streams: int, name: str) -> Memory:
    """Open ``streams`` Chat calls that stay open (HOLD_MODEL) and read the server's RSS
    before, while open, after closing them all, and with as many open again."""
    batch = 250
    async with grpc.aio.insecure_channel(server.target, options=CLIENT_OPTIONS) as channel:
        chat = _multi(channel, parse=False)
        calls: list[Any] = []

        async def open_one(key: str) -> None:
            call = chat(chat_request(key, HOLD_MODEL))
            calls.append(call)
            # TurnStart, then StepStart: the turn has been stored and sleeps in the provider.
            for _ in range(2):
                if await call.read() is grpc.aio.EOF:
                    raise RuntimeError(f"{name}: stream {key} ended early: {await call.code()}")

        async def open_all(prefix: str, milestones: list[tuple[int, int]] | None) -> None:
            step = max(streams // 5, batch)
            for first in range(0, streams, batch):
                count = min(batch, streams - first)
                await asyncio.gather(*(open_one(f"{prefix}-{first + i}") for i in range(count)))
                done = first + count
                if milestones is not None and (done % step == 0 or done == streams):
                    milestones.append((done, server.rss()))

        async def close_all() -> None:
            for call in calls:
                call.cancel()
            calls.clear()
            await asyncio.sleep(0.2)
            await server.settle()  # the server aborts and stores the turns

        # Warm up: code paths, the store and the allocator see some held calls first.
        await asyncio.gather(*(open_one(f"warm-{i}") for i in range(100)))
        await close_all()
        rss_before = server.rss()
        milestones: list[tuple[int, int]] = []
        start = time.perf_counter()
        await open_all("hold", milestones)
        open_seconds = time.perf_counter() - start
        await server.settle()
        rss_open = server.rss()
        milestones[-1] = (streams, rss_open)
        await close_all()
        rss_closed = server.rss()
        await open_all("again", None)
        await server.settle()
        rss_reopen = server.rss()
        await close_all()
    return Memory(name, streams, rss_before, rss_open, rss_closed, rss_reopen, milestones, open_seconds)


# ----------------------------------------------------------------------------- the run


@dataclass
class Results:
    opts: Options
    ttfe: dict[str, list[float]] = field(default_factory=dict)
    tput: dict[tuple[str, int], list[Throughput]] = field(default_factory=dict)
    checks: dict[str, Check] = field(default_factory=dict)
    mem: dict[str, Memory] = field(default_factory=dict)
    seconds: float = 0.0
    quiet_waited: float = 0.0
    noisy: int = 0
    measurements: int = 0


async def run(opts: Options) -> list[Table]:
    """Run every measurement; return the result tables."""
    started = time.perf_counter()
    res = Results(opts)
    expected = stream_text(opts.deltas, opts.chunk_size)
    coalesced = f"turnwire coalesce {opts.coalesce_ms:g} ms"
    factories: dict[str, Callable[[Path], ServerProcess]] = {
        FLOOR: lambda d: ServerProcess.floor(d, deltas=opts.deltas, chunk_size=opts.chunk_size),
        TURNWIRE: lambda d: ServerProcess.turnwire(d, deltas=opts.deltas, chunk_size=opts.chunk_size),
        coalesced: lambda d: ServerProcess.turnwire(
            d, deltas=opts.deltas, chunk_size=opts.chunk_size, coalesce_ms=opts.coalesce_ms
        ),
    }
    if opts.with_prototype:
        factories[PROTOTYPE] = lambda d: ServerProcess.prototype(
            d, deltas=opts.deltas, chunk_size=opts.chunk_size
        )
    quiet = QuietGate(opts.quiet_budget)
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-") as tmp:
        root = Path(tmp)
        servers: dict[str, ServerProcess] = {}
        try:
            for index, (name, make) in enumerate(factories.items()):
                workdir = root / f"s{index}"
                workdir.mkdir()
                servers[name] = make(workdir)
                _log(f"starting {name}: {' '.join(servers[name].argv[1:])}")
                await servers[name].start()
                assert servers[name].ps is not None
                quiet.exclude.append(servers[name].ps)
            # (a) interleaved: floor, turnwire, floor, turnwire ...
            per_round = max(1, opts.ttfe_turns // opts.rounds)
            ttfe_servers = [FLOOR, TURNWIRE] + ([PROTOTYPE] if opts.with_prototype else [])
            for r in range(opts.rounds):
                for name in ttfe_servers:
                    _log(f"(a) {name}: time to first event, {per_round} sequential turns, round {r + 1}")
                    warmup = opts.warmup_turns if r == 0 else 5
                    await quiet()
                    res.ttfe.setdefault(name, []).extend(
                        await time_to_first_event(servers[name].target, per_round, warmup, f"a{r}")
                    )
            # (b)/(d) interleaved by round and concurrency level
            for r in range(opts.rounds):
                for streams in opts.levels:
                    for name, server in servers.items():
                        _log(f"(b) {name}: {streams} stream(s), {opts.window:g} s window, round {r + 1}")
                        await quiet()
                        res.tput.setdefault((name, streams), []).append(
                            await throughput(server, streams, opts, f"b{r}", coalesced=name == coalesced)
                        )
            res.quiet_waited, res.noisy = quiet.waited, quiet.noisy
            res.measurements = opts.rounds * (len(ttfe_servers) + len(opts.levels) * len(servers))
            # correctness
            _log("checking the streams")
            res.checks[FLOOR] = await check_streams(
                servers[FLOOR].target, expected, turns=20, concurrency=10, tag="c"
            )
            for name in (TURNWIRE, coalesced, *([PROTOTYPE] if opts.with_prototype else [])):
                target = servers[name].target
                res.checks[name] = await check_streams(
                    target, expected, turns=opts.verify_turns, concurrency=opts.concurrency, tag="c"
                )
                res.checks[f"{name}, paced {PACED_DELAY_MS:g} ms"] = await check_streams(
                    target,
                    expected,
                    turns=opts.verify_turns,
                    concurrency=opts.concurrency,
                    tag="p",
                    model=PACED_MODEL,
                )
        finally:
            for server in servers.values():
                server.stop()
        # (c) on fresh processes, one at a time
        if not opts.skip_memory:
            for index, name in enumerate((FLOOR, TURNWIRE)):
                workdir = root / f"m{index}"
                workdir.mkdir()
                server = factories[name](workdir)
                await server.start()
                try:
                    _log(f"(c) {name}: memory, {opts.streams} open streams")
                    res.mem[name] = await memory_per_stream(server, opts.streams, name)
                finally:
                    server.stop()
    res.seconds = time.perf_counter() - started
    return tables(res, coalesced)


def _median(rows: list[Throughput], key: str) -> float:
    return statistics.median(getattr(r, key) for r in rows)


def tables(res: Results, coalesced: str) -> list[Table]:
    opts = res.opts
    n_events = events_per_turn(opts.deltas)
    workload = (
        f"{opts.deltas} text deltas of {opts.chunk_size} chars per turn = {n_events} events/turn, "
        "no provider delay"
    )
    out: list[Table] = []

    # (a)
    t = Table(
        "(a) Time to first event, sequential turns (client-observed, ms)",
        ["server", "turns", "p50", "p90", "p99", "max", "target", "verdict"],
    )
    for name, samples in res.ttfe.items():
        t.add(
            name,
            len(samples),
            fmt_ms(percentile(samples, 50)),
            fmt_ms(percentile(samples, 90)),
            fmt_ms(percentile(samples, 99)),
            fmt_ms(max(samples)),
            "",
            "",
        )
    if FLOOR in res.ttfe and TURNWIRE in res.ttfe:
        floor, tw = res.ttfe[FLOOR], res.ttfe[TURNWIRE]
        d50 = percentile(tw, 50) - percentile(floor, 50)
        d99 = percentile(tw, 99) - percentile(floor, 99)
        t.add(
            "added (turnwire - floor) p50",
            "",
            fmt_ms(d50),
            "",
            "",
            "",
            f"<= {TARGET_TTFE_P50_MS:g} ms",
            verdict(d50 * 1000 <= TARGET_TTFE_P50_MS),
        )
        t.add(
            "added (turnwire - floor) p99",
            "",
            "",
            "",
            fmt_ms(d99),
            "",
            f"<= {TARGET_TTFE_P99_MS:g} ms",
            verdict(d99 * 1000 <= TARGET_TTFE_P99_MS),
        )
    if FLOOR in res.ttfe and PROTOTYPE in res.ttfe:
        floor, proto = res.ttfe[FLOOR], res.ttfe[PROTOTYPE]
        t.add(
            "added (prototype - floor) p50 / p99",
            "",
            fmt_ms(percentile(proto, 50) - percentile(floor, 50)),
            "",
            fmt_ms(percentile(proto, 99) - percentile(floor, 99)),
            "",
            "",
            "",
        )
    t.notes.append(
        f"{workload}. One turn at a time, each on a new conversation, after warm-up turns; "
        f"floor and Turnwire interleaved in {opts.rounds} round(s). The first event is TurnStart, "
        "which Turnwire sends before it writes anything to SQLite."
    )
    out.append(t)

    # (b)/(d) throughput
    t = Table(
        "(b)/(d) Throughput: events received per second by the client",
        ["server", "streams", "events/s", "min..max", "turns/s", "vs floor", "target", "verdict"],
    )
    floor_rows = {s: rows for (n, s), rows in res.tput.items() if n == FLOOR}
    for (name, streams), rows in res.tput.items():
        ev = _median(rows, "events_per_s")
        turns = _median(rows, "turn_equiv_per_s")
        ratio_txt = target = ok = ""
        base = floor_rows.get(streams)
        if name != FLOOR and base:
            if name == coalesced:
                # Fewer, larger events per turn: compare delivered turns (the same text each).
                ratio = turns / _median(base, "turn_equiv_per_s")
                ratio_txt = f"{ratio:.0%} (turns/s)"
            else:
                ratio = ev / _median(base, "events_per_s")
                ratio_txt = f"{ratio:.0%}"
            if streams == opts.concurrency:
                target, ok = f">= {TARGET_THROUGHPUT_RATIO:.0%}", verdict(ratio >= TARGET_THROUGHPUT_RATIO)
                if name == PROTOTYPE:
                    ok = f"({ok})"
        spread = f"{min(r.events_per_s for r in rows):,.0f}..{max(r.events_per_s for r in rows):,.0f}"
        t.add(name, streams, f"{ev:,.0f}", spread, f"{turns:,.1f}", ratio_txt, target, ok)
    t.notes.append(
        f"{workload}. Each stream runs turns back to back, each turn on a new conversation; "
        f"{opts.warm:g} s warm-up then a {opts.window:g} s window, median of {opts.rounds} "
        "interleaved round(s). Client and server are separate processes on the same machine."
    )
    t.notes.append(
        f"turns/s = events/s / {n_events} (for the coalesced rows: text characters/s received / "
        f"{opts.deltas * opts.chunk_size}, counted by parsing every event). The coalesced rows' "
        "'vs floor' compares these turns/s (the same text in fewer, larger events); their events/s "
        "counts merged messages."
    )
    out.append(t)

    # server cost and latency under load
    t = Table(
        "(b) Where the CPU goes under load, and time to first event under load",
        [
            "server",
            "streams",
            "srv CPU us/event",
            "capacity vs floor",
            "srv cores",
            "client cores",
            "other cores",
            "TTFE p50 ms",
            "TTFE p99 ms",
            "verdict (capacity)",
        ],
    )
    for (name, streams), rows in res.tput.items():
        cpu = _median(rows, "server_cpu_us_per_event")
        capacity = ok = ""
        base = floor_rows.get(streams)
        if name in (TURNWIRE, PROTOTYPE) and base:
            ratio = _median(base, "server_cpu_us_per_event") / cpu
            capacity = f"{ratio:.0%}"
            if streams == opts.concurrency:
                ok = verdict(ratio >= TARGET_THROUGHPUT_RATIO)
                if name == PROTOTYPE:
                    ok = f"({ok})"
        t.add(
            name,
            streams,
            f"{cpu:.1f}",
            capacity,
            f"{_median(rows, 'server_cpu_util'):.2f}",
            f"{_median(rows, 'client_cpu_util'):.2f}",
            f"{_median(rows, 'other_cpu_util'):.2f}",
            f"{_median(rows, 'ttfe_p50_ms'):.2f}",
            f"{_median(rows, 'ttfe_p99_ms'):.2f}",
            ok,
        )
    t.notes.append(
        "srv CPU us/event: server process CPU time (all its threads) / events, in the window. "
        "capacity vs floor = floor's us/event / Turnwire's: the events/s ratio a server-bound "
        "run would show (the client needs about 30 us/event too, so on 2 cores the client-observed "
        "ratio above understates the server's overhead when the floor is client-bound)."
    )
    t.notes.append(
        "cores = CPU seconds per second; 'other' = the rest of the machine (idle servers, other "
        "users) - should be near 0 for clean numbers. TTFE under load: first event of the turns "
        "started in the window (queueing in client and server included)."
    )
    t.notes.append(
        f"Before each measurement the run waited for other load on the machine to stop "
        f"({res.quiet_waited:.0f} s waited in total); {res.noisy} of {res.measurements} "
        "measurements still started with other load above 0.25 cores."
    )
    out.append(t)

    # correctness
    t = Table(
        "(d) Stream correctness (every event parsed)",
        ["server / script", "turns", "events/turn", "bytes/turn", "bad turns", "text == script text"],
    )
    for name, check in res.checks.items():
        t.add(
            name,
            check.turns,
            f"{check.events_per_turn:.1f}",
            f"{check.bytes_per_turn:,.0f}",
            check.bad,
            "yes" if check.bad == 0 else f"NO: {check.first_problem}",
        )
    t.notes.append(
        f"Turnwire rows: {opts.concurrency} turns at a time. Checked per turn: sequence numbers "
        "1..n, TurnStart first, one COMPLETED TurnEnd last, text rebuilt from the deltas == the "
        "script's text == the TurnEnd message's text. 'paced' = the same script with "
        f"{PACED_DELAY_MS:g} ms before each delta, so coalescing merges only some deltas. The floor "
        "row shows its stream has the size of Turnwire's."
    )
    out.append(t)

    # (c)
    if res.mem:
        t = Table(
            "(c) Server memory per open Chat stream (RSS)",
            [
                "server",
                "open streams",
                "RSS before MB",
                "RSS open MB",
                "KB/stream",
                "marginal KB/stream",
                "after close MB",
                "reopened MB",
                "open time s",
                "target",
                "verdict",
            ],
        )
        for name, m in res.mem.items():
            is_tw = name == TURNWIRE
            t.add(
                name,
                m.streams,
                f"{m.rss_before / 2**20:.1f}",
                f"{m.rss_open / 2**20:.1f}",
                f"{m.kb_per_stream:.1f}",
                f"{m.marginal_kb_per_stream:.1f}",
                f"{m.rss_closed / 2**20:.1f}",
                f"{m.rss_reopen / 2**20:.1f}",
                f"{m.open_seconds:.1f}",
                f"<= {TARGET_KB_PER_STREAM:g} KB" if is_tw else "",
                verdict(m.kb_per_stream <= TARGET_KB_PER_STREAM) if is_tw else "",
            )
        if TURNWIRE in res.mem and FLOOR in res.mem:
            extra = res.mem[TURNWIRE].kb_per_stream - res.mem[FLOOR].kb_per_stream
            t.add("turnwire - floor", "", "", "", f"{extra:.1f}", "", "", "", "", "", "")
        t.notes.append(
            "Each stream is a Chat call whose script sleeps (delay_ms = 1 h) after TurnStart and "
            "StepStart were received: a turn admitted, persisted and waiting on the model. Fresh "
            "server process (Turnwire: `python -m server serve --config`), RSS via psutil after "
            "100 warm-up calls. Marginal = slope between the first and last fifth. 'reopened' = "
            "RSS with the same number open again after closing all: no growth over 'RSS open' "
            "means the memory kept after close is reused, not leaked."
        )
        out.append(t)
    return out


def _log(message: str) -> None:
    print(f"[stream_overhead] {message}", file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="~30 s smoke run")
    parser.add_argument("--streams", type=int, help="open streams for (c) (default 5000, quick 1000)")
    parser.add_argument("--deltas", type=int, help="text deltas per turn (default 200)")
    parser.add_argument("--chunk-size", type=int, help="characters per delta (default 4)")
    parser.add_argument("--levels", help="concurrent streams for (b), comma-separated (default 1,10,100)")
    parser.add_argument("--ttfe-turns", type=int, help="sequential turns for (a) (default 200)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2)")
    parser.add_argument("--window", type=float, help="seconds measured per throughput row and round")
    parser.add_argument("--skip-memory", action="store_true", help="skip (c)")
    parser.add_argument(
        "--with-prototype",
        action="store_true",
        help="also measure Turnwire with the proposed store fixes patched in (bench/proto_server.py)",
    )


def options_from_args(args: argparse.Namespace) -> Options:
    opts = Options.quick() if args.quick else Options()
    for key in ("streams", "deltas", "chunk_size", "ttfe_turns", "rounds", "window"):
        value = getattr(args, key, None)
        if value is not None:
            setattr(opts, key, value)
    if getattr(args, "levels", None):
        opts.levels = tuple(int(x) for x in args.levels.split(","))
    opts.skip_memory = bool(getattr(args, "skip_memory", False))
    opts.with_prototype = bool(getattr(args, "with_prototype", False))
    return opts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    opts = options_from_args(parser.parse_args())
    result_tables = asyncio.run(run(opts))
    print_tables(result_tables)
    header = (
        "# stream_overhead results\n\n"
        f"`python bench/stream_overhead.py` ({opts.describe()}); {machine_summary()}."
    )
    write_markdown(BENCH_DIR / "results.md", header, result_tables)


if __name__ == "__main__":
    main()
