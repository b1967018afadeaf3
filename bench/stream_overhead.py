"""Streaming overhead of Turnwire over a bare grpc.aio floor, measured in the same run.

Workload: the scripted provider streams one text block of N deltas (default
200 deltas of 4 characters, no delay), so a turn is N + 6 events: TurnStart,
StepStart, TextStart, N x TextDelta, TextEnd, StepFinish, TurnEnd (with the
stored message). The floor (``bench/floor_server.py``) streams the same N + 6
pre-built ``ChatResponse`` messages, of the same shapes and sizes, from a
bare grpc.aio server.

Every server runs in its own process (Turnwire as ``python -m server serve
--config ...`` with SQLite in a temp dir); this process is the client. One
server runs at a time, so on a 2-core machine the server has a core to itself
and the client the other. The client does not deserialize responses in the
timing runs (raw bytes; it is the same client for the floor and Turnwire);
correctness runs parse every event and check the reconstructed text.

Measured:
  (a) time to first event (call start -> first message), sequential turns, a
      new conversation per turn; p50/p99 floor vs Turnwire and the difference;
  (b) events/s with 1 stream and with C concurrent streams (each stream runs
      turns back to back, each turn on its own new conversation); server CPU
      per event from psutil;
  (c) server RSS per open stream: S concurrent Chat calls held open by a
      script with a one-hour delay_ms (and the floor holding S calls, for
      gRPC's own share);
  (d) the throughput rows again with ``events.text_coalesce_ms: 2``, with the
      reconstructed text checked against the script's text.

Run alone (``python bench/stream_overhead.py [--quick] [--streams N]``) or via
``bench/run.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BENCH_DIR,
    CHAT_METHOD,
    CLIENT_OPTIONS,
    HOLD_MODEL,
    ServerProcess,
    Table,
    chat_request,
    events_per_turn,
    fmt_ms,
    own_cpu_seconds,
    percentile,
    print_tables,
    stream_text,
    verdict,
    write_markdown,
)

from turnwire.v1 import chat_service_pb2, event_pb2  # noqa: E402

TARGET_TTFE_P50_MS = 1.0
TARGET_TTFE_P99_MS = 3.0
TARGET_THROUGHPUT_RATIO = 0.70
TARGET_KB_PER_STREAM = 64.0


@dataclass
class Options:
    deltas: int = 200
    chunk_size: int = 4
    ttfe_turns: int = 200
    warmup_turns: int = 30
    window: float = 4.0  # seconds measured per throughput row
    warm: float = 1.0  # seconds run before the window opens
    concurrency: int = 100
    streams: int = 5000
    coalesce_ms: float = 2.0
    verify_turns: int = 300
    skip_memory: bool = False

    @classmethod
    def quick(cls) -> Options:
        return cls(ttfe_turns=60, warmup_turns=10, window=1.5, warm=0.5, streams=1000, verify_turns=150)


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
            assert first is not grpc.aio.EOF
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
    turns_per_s: float
    server_cpu_us_per_event: float
    server_cpu_util: float  # cores
    client_cpu_util: float  # cores
    server_threads: int


async def throughput(server: ServerProcess, streams: int, opts: Options, tag: str) -> Throughput:
    """Each of ``streams`` workers runs turns back to back; count events in a steady window."""
    counts = {"events": 0, "turns": 0}
    stop = asyncio.Event()
    async with grpc.aio.insecure_channel(server.target, options=CLIENT_OPTIONS) as channel:
        chat = _multi(channel, parse=False)

        async def worker(w: int) -> None:
            k = 0
            while not stop.is_set():
                call = chat(chat_request(f"{tag}-tp{streams}-{w}-{k}"))
                async for _ in call:
                    counts["events"] += 1
                counts["turns"] += 1
                k += 1

        tasks = [asyncio.create_task(worker(w)) for w in range(streams)]
        await asyncio.sleep(opts.warm)
        e0, n0, t0 = counts["events"], counts["turns"], time.perf_counter()
        s0, c0 = server.cpu_seconds(), own_cpu_seconds()
        await asyncio.sleep(opts.window)
        e1, n1, t1 = counts["events"], counts["turns"], time.perf_counter()
        s1, c1 = server.cpu_seconds(), own_cpu_seconds()
        threads = server.threads()
        stop.set()
        await asyncio.gather(*tasks)
    elapsed = t1 - t0
    events = e1 - e0
    return Throughput(
        streams=streams,
        events_per_s=events / elapsed,
        turns_per_s=(n1 - n0) / elapsed,
        server_cpu_us_per_event=(s1 - s0) / max(events, 1) * 1e6,
        server_cpu_util=(s1 - s0) / elapsed,
        client_cpu_util=(c1 - c0) / elapsed,
        server_threads=threads,
    )


# ----------------------------------------------------------------------------- correctness


@dataclass
class Check:
    turns: int
    bad: int
    events_per_turn: float
    bytes_per_turn: float
    first_problem: str


async def check_streams(target: str, expected: str, turns: int, concurrency: int, tag: str) -> Check:
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
                async for response in chat(chat_request(f"{tag}-check-{i}")):
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
    milestones: list[tuple[int, int]]  # (open streams, rss)
    open_seconds: float

    @property
    def kb_per_stream(self) -> float:
        return (self.rss_open - self.rss_before) / self.streams / 1024

    @property
    def marginal_kb_per_stream(self) -> float:
        (n0, r0), (n1, r1) = self.milestones[0], self.milestones[-1]
        return (r1 - r0) / max(n1 - n0, 1) / 1024


async def memory_per_stream(server: ServerProcess, streams: int, name: str) -> Memory:
    """Open ``streams`` Chat calls that stay open (HOLD_MODEL); RSS before, while open, after."""
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

        # Warm up: the code paths, the store and the allocator see a few calls first.
        await asyncio.gather(*(open_one(f"warm-{i}") for i in range(100)))
        for call in calls:
            call.cancel()
        calls.clear()
        await asyncio.sleep(1.5)
        rss_before = server.rss()
        milestones: list[tuple[int, int]] = []
        start = time.perf_counter()
        for first in range(0, streams, batch):
            count = min(batch, streams - first)
            await asyncio.gather(*(open_one(f"hold-{first + i}") for i in range(count)))
            if (first + count) % max(streams // 5, batch) == 0 or first + count == streams:
                milestones.append((first + count, server.rss()))
        open_seconds = time.perf_counter() - start
        await asyncio.sleep(1.0)
        rss_open = server.rss()
        milestones[-1] = (streams, rss_open)
        for call in calls:
            call.cancel()
        await asyncio.sleep(2.0)
        rss_closed = server.rss()
    return Memory(name, streams, rss_before, rss_open, rss_closed, milestones, open_seconds)


# ----------------------------------------------------------------------------- the run


async def run(opts: Options) -> list[Table]:
    expected = stream_text(opts.deltas, opts.chunk_size)
    n_events = events_per_turn(opts.deltas)
    ttfe: dict[str, list[float]] = {}
    tput: dict[str, list[Throughput]] = {}
    checks: dict[str, Check] = {}
    mem: dict[str, Memory] = {}
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-") as tmp:
        root = Path(tmp)
        setups = [
            ("floor", lambda d: ServerProcess.floor(d, deltas=opts.deltas, chunk_size=opts.chunk_size)),
            ("turnwire", lambda d: ServerProcess.turnwire(d, deltas=opts.deltas, chunk_size=opts.chunk_size)),
            (
                f"turnwire coalesce {opts.coalesce_ms:g} ms",
                lambda d: ServerProcess.turnwire(
                    d, deltas=opts.deltas, chunk_size=opts.chunk_size, coalesce_ms=opts.coalesce_ms
                ),
            ),
        ]
        for index, (name, make) in enumerate(setups):
            workdir = root / f"s{index}"
            workdir.mkdir()
            server = make(workdir)
            _log(f"{name}: starting {' '.join(server.argv[1:4])}...")
            await server.start()
            try:
                tag = f"r{index}"
                if not name.startswith("turnwire coalesce"):
                    _log(f"{name}: time to first event, {opts.ttfe_turns} sequential turns")
                    ttfe[name] = await time_to_first_event(
                        server.target, opts.ttfe_turns, opts.warmup_turns, tag
                    )
                tput[name] = []
                for streams in (1, opts.concurrency):
                    _log(f"{name}: throughput, {streams} stream(s), {opts.window:g} s window")
                    tput[name].append(await throughput(server, streams, opts, tag))
                if name != "floor":
                    _log(f"{name}: checking {opts.verify_turns} turns ({opts.concurrency} at a time)")
                    checks[name] = await check_streams(
                        server.target, expected, opts.verify_turns, opts.concurrency, tag
                    )
                elif opts.deltas:
                    checks[name] = await check_streams(server.target, expected, 20, 10, tag)
            finally:
                server.stop()
        if not opts.skip_memory:
            for index, (name, make) in enumerate(setups[:2]):
                workdir = root / f"m{index}"
                workdir.mkdir()
                server = make(workdir)
                await server.start()
                try:
                    _log(f"{name}: memory, opening {opts.streams} streams")
                    mem[name] = await memory_per_stream(server, opts.streams, name)
                finally:
                    _log(f"{name}: stopping")
                    server.stop()
    return _tables(opts, n_events, ttfe, tput, checks, mem)


def _tables(
    opts: Options,
    n_events: int,
    ttfe: dict[str, list[float]],
    tput: dict[str, list[Throughput]],
    checks: dict[str, Check],
    mem: dict[str, Memory],
) -> list[Table]:
    tables: list[Table] = []
    workload = (
        f"{opts.deltas} text deltas of {opts.chunk_size} chars per turn = {n_events} events/turn, "
        "no provider delay"
    )

    # (a)
    t = Table(
        "(a) Time to first event (client-observed, ms)",
        ["server", "turns", "p50", "p90", "p99", "max", "target", "verdict"],
    )
    floor = ttfe.get("floor", [])
    for name, samples in ttfe.items():
        t.add(
            name, len(samples), fmt_ms(percentile(samples, 50)), fmt_ms(percentile(samples, 90)),
            fmt_ms(percentile(samples, 99)), fmt_ms(max(samples)), "", "",
        )
    if floor and "turnwire" in ttfe:
        tw = ttfe["turnwire"]
        d50 = percentile(tw, 50) - percentile(floor, 50)
        d99 = percentile(tw, 99) - percentile(floor, 99)
        t.add("added p50 (turnwire - floor)", "", fmt_ms(d50), "", "", "",
              f"<= {TARGET_TTFE_P50_MS:g} ms", verdict(d50 * 1000 <= TARGET_TTFE_P50_MS))
        t.add("added p99 (turnwire - floor)", "", "", "", fmt_ms(d99), "",
              f"<= {TARGET_TTFE_P99_MS:g} ms", verdict(d99 * 1000 <= TARGET_TTFE_P99_MS))
    t.notes.append(
        f"{workload}; sequential turns, each on a new conversation, after "
        f"{opts.warmup_turns} warm-up turns; server and client in separate processes."
    )
    tables.append(t)

    # (b) + (d)
    t = Table(
        "(b)/(d) Throughput (events received per second by the client)",
        ["server", "streams", "events/s", "turns/s", "vs floor", "srv CPU us/event",
         "srv cores", "client cores", "target", "verdict"],
    )
    floor_rows = {r.streams: r for r in tput.get("floor", [])}
    for name, rows in tput.items():
        for row in rows:
            base = floor_rows.get(row.streams)
            coalesced = name.startswith("turnwire coalesce")
            # With coalescing a turn has fewer events, so compare delivered turns (same text each).
            if base is None or name == "floor":
                ratio_txt, target, ok_txt = "", "", ""
            else:
                ratio = (row.turns_per_s / base.turns_per_s) if coalesced else (
                    row.events_per_s / base.events_per_s)
                ratio_txt = f"{ratio:.0%}" + (" (turns)" if coalesced else "")
                target, ok_txt = "", ""
                if row.streams == opts.concurrency:
                    target = f">= {TARGET_THROUGHPUT_RATIO:.0%}"
                    ok_txt = verdict(ratio >= TARGET_THROUGHPUT_RATIO)
            t.add(
                name, row.streams, f"{row.events_per_s:,.0f}", f"{row.turns_per_s:,.1f}", ratio_txt,
                f"{row.server_cpu_us_per_event:.1f}", f"{row.server_cpu_util:.2f}",
                f"{row.client_cpu_util:.2f}", target, ok_txt,
            )
    t.notes.append(
        f"{workload}. Each stream runs turns back to back, each turn on a new conversation; "
        f"{opts.warm:g} s warm-up, then a {opts.window:g} s window."
    )
    t.notes.append(
        "srv CPU us/event = server process CPU time (all threads) / events in the window: the "
        "client-independent cost. 'cores' = CPU seconds per wall second (2 cores on this machine)."
    )
    t.notes.append(
        "Coalesced row: 'vs floor' compares turns/s (the same text per turn, fewer, larger "
        "events), since its events/s counts merged messages."
    )
    tables.append(t)

    # correctness
    t = Table(
        "Correctness of the streams (every event parsed)",
        ["server", "turns", "events/turn", "bytes/turn", "bad turns", "rebuilt text == script text"],
    )
    for name, check in checks.items():
        t.add(name, check.turns, f"{check.events_per_turn:.1f}", f"{check.bytes_per_turn:,.0f}",
              check.bad, "yes" if check.bad == 0 else f"NO: {check.first_problem}")
    t.notes.append(
        f"Turnwire rows: {opts.concurrency} turns at a time. Checks sequence numbers 1..n, "
        "TurnStart first, one COMPLETED TurnEnd last, text from the deltas == script text == "
        "TurnEnd.message text. The floor row shows its stream is the same size as Turnwire's."
    )
    tables.append(t)

    # (c)
    if mem:
        t = Table(
            "(c) Server memory per open Chat stream",
            ["server", "open streams", "RSS before MB", "RSS open MB", "KB/stream",
             "marginal KB/stream", "RSS after close MB", "open time s", "target", "verdict"],
        )
        for name, m in mem.items():
            is_tw = name == "turnwire"
            t.add(
                name, m.streams, f"{m.rss_before / 2**20:.1f}", f"{m.rss_open / 2**20:.1f}",
                f"{m.kb_per_stream:.1f}", f"{m.marginal_kb_per_stream:.1f}",
                f"{m.rss_closed / 2**20:.1f}", f"{m.open_seconds:.1f}",
                f"<= {TARGET_KB_PER_STREAM:g} KB" if is_tw else "",
                verdict(m.kb_per_stream <= TARGET_KB_PER_STREAM) if is_tw else "",
            )
        if "turnwire" in mem and "floor" in mem:
            extra = mem["turnwire"].kb_per_stream - mem["floor"].kb_per_stream
            t.add("turnwire - floor", "", "", "", f"{extra:.1f}", "", "", "", "", "")
        t.notes.append(
            "Each stream is a Chat call whose script sleeps (delay_ms = 1 h) after TurnStart and "
            "StepStart were received, i.e. a turn admitted, persisted and waiting on the model. "
            "Turnwire runs as `python -m server serve --config` in its own process; RSS via "
            "psutil after 100 warm-up calls. Marginal = slope between the first and last "
            "milestone (excludes one-off growth)."
        )
        tables.append(t)
    return tables


def _log(message: str) -> None:
    print(f"[stream_overhead] {message}", file=sys.stderr, flush=True)


def options_from_args(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~30 s smoke run")
    parser.add_argument("--streams", type=int, help="open streams for (c) (default 5000, quick 1000)")
    parser.add_argument("--deltas", type=int, help="text deltas per turn (default 200)")
    parser.add_argument("--chunk-size", type=int, help="characters per delta (default 4)")
    parser.add_argument("--concurrency", type=int, help="concurrent streams for (b) (default 100)")
    parser.add_argument("--ttfe-turns", type=int, help="sequential turns for (a) (default 200)")
    parser.add_argument("--window", type=float, help="seconds measured per throughput row")
    parser.add_argument("--skip-memory", action="store_true", help="skip (c)")
    args, _ = parser.parse_known_args(argv)
    opts = Options.quick() if args.quick else Options()
    for key in ("streams", "deltas", "chunk_size", "concurrency", "ttfe_turns", "window"):
        value = getattr(args, key)
        if value is not None:
            setattr(opts, key, value)
    opts.skip_memory = args.skip_memory
    return opts


def main() -> None:
    opts = options_from_args()
    tables = asyncio.run(run(opts))
    print_tables(tables)
    write_markdown(BENCH_DIR / "results.md", "# stream_overhead results", tables)


if __name__ == "__main__":
    main()
