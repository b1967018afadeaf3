"""The measurements of ``stream_overhead.py``: its options, (a)-(d), and the results they fill.

(a) time to first event, (b) throughput with server CPU per event, (c) memory
per open stream, and the stream correctness checks of (d); each talks gRPC to
a server process (``_common.ServerProcess``). The tables are built from a
:class:`Results` by ``_stream_tables.py``.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    CHAT_METHOD,
    CLIENT_OPTIONS,
    HOLD_MODEL,
    STREAM_MODEL,
    ServerProcess,
    chat_request,
    events_per_turn,
    machine_busy_seconds,
)
from _load import load

from turnwire_client.v1 import chat_service_pb2, event_pb2

# The servers' names: keys of Results and rows of the tables (the coalescing server's name
# depends on the options: see stream_overhead.run).
FLOOR = "floor"
TURNWIRE = "turnwire"


@dataclass
class Options:
    """What one run measures and how long; ``Options.quick()`` for ``--quick``."""

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


# ----------------------------------------------------------------------------- results


@dataclass
class Results:
    """Everything one run measured; ``_stream_tables.tables`` renders it."""

    opts: Options
    ttfe: dict[str, list[float]] = field(default_factory=dict)
    tput: dict[tuple[str, int], list[Throughput]] = field(default_factory=dict)
    checks: dict[str, Check] = field(default_factory=dict)
    mem: dict[str, Memory] = field(default_factory=dict)
    seconds: float = 0.0
    quiet_waited: float = 0.0
    noisy: int = 0
    measurements: int = 0
