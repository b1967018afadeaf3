"""``ttft.py --budget``: issue 33's harness shape and the per-turn budget, with PASS/MISS.

The bare official SDK (``openai.AsyncOpenAI``, ``anthropic.AsyncAnthropic``) against the local
upstream (``_upstream.py``) vs a gRPC ``Chat`` client through a real ``turnwire serve`` (SQLite,
a new conversation per request, answers of 4 text deltas, no middleware, demo tools off: the
0-middleware sidecar of ``ttft.py``). This process is both clients; the sidecar and the upstream
run in their own processes.

A run is ``--pairs`` (default 3) interleaved pairs per API; a pair is a sidecar arm and a bare
arm of ``--requests`` (default 200) sequential requests each, the arms' order alternating from
pair to pair so that a drift in the machine's load falls on both. Each figure is a difference
to the bare SDK *within* a pair; the table gives the median over the pairs:

- **added time to first token** p50 and p99: the arm's percentile (call → first text delta
  received) minus the bare arm's;
- **own CPU per request**: the sidecar process's CPU over its arm (``/proc/<pid>/stat``: user +
  system, all threads, via psutil) / requests, minus this process's CPU over the bare arm /
  requests (the bare SDK does the HTTP call and SSE parsing the sidecar also does inside it);
- **marginal CPU per chunk**: the slope of the sidecar's CPU per request between answers of
  ``burst-4`` and ``burst-64`` (a sidecar arm of each in the pair), so the fixed per-turn cost
  is not divided into it; the bare SDK's slope is given beside it for scale;
- **throughput at 16 streams**: 64-delta answers written at once (``burst-64``), turns back to
  back on 16 concurrent streams for ``--window`` seconds each arm, the upstream's text deltas
  received per second, sidecar over bare SDK.

Targets (issue 33, each a difference to the bare SDK in the same run): added TTFT p50 ≤ 3 ms and
p99 ≤ 10 ms; own CPU per request ≤ 3 ms; marginal CPU per chunk ≤ 60 µs; Anthropic throughput
at 16 streams ≥ 1.0x and OpenAI's not below :data:`OPENAI_THROUGHPUT_FLOOR` (before issue 33's
cuts, measured with this mode; ``bench/ttft.md``). Printed with PASS/MISS, never asserted.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from _common import ServerProcess, Table, percentile, verdict, wait_for_quiet
from _ttft_clients import BareClient, SidecarClient, Upstream, new_conversation_id, sidecar

APIS = ("openai", "anthropic")
ADDED_P50_TARGET_MS = 3.0
ADDED_P99_TARGET_MS = 10.0
OWN_CPU_TARGET_MS = 3.0
CHUNK_CPU_TARGET_US = 60.0
ANTHROPIC_THROUGHPUT_TARGET = 1.0
OPENAI_THROUGHPUT_FLOOR = 1.86  # before issue 33's cut (bench/ttft.md, "Issue 33"), a loaded machine
SHORT, LONG = 4, 64
STREAMS = 16


@dataclass
class BudgetOptions:
    """``--pairs`` pairs of ``--requests`` requests per arm; a ``--window`` s throughput window."""

    pairs: int = 3
    requests: int = 200
    window: float = 3.0


@dataclass
class Arm:
    """One arm of a pair: first-token times (s) and CPU (s) over its requests."""

    firsts: list[float] = field(default_factory=list)
    cpu: float = 0.0
    requests: int = 0

    @property
    def cpu_per_request(self) -> float:
        return self.cpu / self.requests


@dataclass
class Pair:
    """What one pair measured for one API: differences are taken within it."""

    sidecar: Arm
    bare: Arm
    sidecar_long: Arm
    bare_long: Arm
    sidecar_rate: float = 0.0
    bare_rate: float = 0.0
    sidecar_rate_cpu: float = 0.0  # server CPU per delta in the throughput window, s


Turn = Callable[[str], Awaitable[tuple[float, int]]]


async def _arm(turn: Turn, model: str, requests: int, cpu: Callable[[], float]) -> Arm:
    arm = Arm(requests=requests)
    start = cpu()
    for _ in range(requests):
        first, _ = await turn(model)
        arm.firsts.append(first)
    arm.cpu = cpu() - start
    return arm


async def _rate(
    turn: Turn, model: str, streams: int, window: float, cpu: Callable[[], float]
) -> tuple[float, float]:
    """Deltas received per second by turns ending in the window (after a quarter-window warm-up),
    and the CPU (of ``cpu``) per delta over the window."""
    counted = 0
    begin = time.perf_counter() + window / 4
    end = begin + window
    cpu0, wall0 = cpu(), time.perf_counter()

    async def worker() -> None:
        nonlocal counted
        while time.perf_counter() < end:
            _, deltas = await turn(model)
            if begin <= time.perf_counter() <= end:
                counted += deltas

    await asyncio.gather(*(worker() for _ in range(streams)))
    used = (cpu() - cpu0) * window / (time.perf_counter() - wall0)
    return counted / window, used / max(counted, 1)


async def measure(
    opts: BudgetOptions,
    server: ServerProcess,
    sidecar_turn: Callable[[str, str], Awaitable[tuple[float, int]]],
    bare_turn: Callable[[str, str], Awaitable[tuple[float, int]]],
) -> dict[str, list[Pair]]:
    """Every pair of every API; ``sidecar_turn(api, model)`` / ``bare_turn(api, model)`` run one
    turn on a new conversation and return (time to first token s, deltas received)."""
    results: dict[str, list[Pair]] = {api: [] for api in APIS}
    client_cpu = time.process_time
    for api in APIS:  # warm-up: connections, first-call costs, caches
        for model in (f"burst-{SHORT}", f"burst-{LONG}"):
            for _ in range(5):
                await sidecar_turn(api, model)
                await bare_turn(api, model)
    for number in range(opts.pairs):
        for api in APIS:
            await wait_for_quiet(max_wait=3.0)

            def side(model: str, api: str = api) -> Awaitable[tuple[float, int]]:
                return sidecar_turn(api, model)

            def bare(model: str, api: str = api) -> Awaitable[tuple[float, int]]:
                return bare_turn(api, model)

            arms: dict[str, Arm] = {}
            order = [("sidecar", side, server.cpu_seconds), ("bare", bare, client_cpu)]
            if number % 2:
                order.reverse()
            for name, turn, cpu in order:
                arms[name] = await _arm(turn, f"burst-{SHORT}", opts.requests, cpu)
                arms[f"{name}_long"] = await _arm(turn, f"burst-{LONG}", opts.requests // 2, cpu)
            pair = Pair(arms["sidecar"], arms["bare"], arms["sidecar_long"], arms["bare_long"])
            for name, turn, cpu in order:
                rate, per_delta = await _rate(turn, f"burst-{LONG}", STREAMS, opts.window, cpu)
                if name == "sidecar":
                    pair.sidecar_rate, pair.sidecar_rate_cpu = rate, per_delta
                else:
                    pair.bare_rate = rate
            results[api].append(pair)
        print(f"  [budget pair {number + 1}/{opts.pairs} done]", file=sys.stderr, flush=True)
    return results


def _slope(short: Arm, long: Arm) -> float:
    """CPU per extra chunk between the two answer lengths, s."""
    return (long.cpu_per_request - short.cpu_per_request) / (LONG - SHORT)


def _added(pair: Pair, q: float) -> float:
    """The sidecar's q-th percentile time to first token minus the bare SDK's in ``pair``, ms."""
    return (percentile(pair.sidecar.firsts, q) - percentile(pair.bare.firsts, q)) * 1e3


def budget_tables(results: dict[str, list[Pair]], opts: BudgetOptions) -> list[Table]:
    """The measured figures per API, and the per-turn budget with PASS/MISS."""
    figures = Table(
        f"Issue 33's harness: sidecar vs bare SDK, {opts.pairs} interleaved pairs x {opts.requests} "
        "requests per arm (medians of per-pair differences)",
        [
            "API",
            "bare p50/p99 ms",
            "sidecar p50/p99 ms",
            "added p50/p99 ms",
            "server CPU ms/req",
            "bare CPU ms/req",
            "own CPU ms/req",
            "server µs/chunk (slope)",
            "bare µs/chunk (slope)",
            "16 streams: bare / sidecar deltas/s",
            "ratio",
            "server µs/delta at 16",
        ],
    )
    budget = Table(
        "Per-turn budget (issue 33; each a difference to the bare SDK in the same run)",
        ["figure", "API", "value", "target", "verdict"],
    )

    def med(values: list[float]) -> float:
        return statistics.median(values)

    for api, pairs in results.items():

        def firsts(q: float, pairs: list[Pair] = pairs) -> tuple[float, float]:
            """Median over the pairs of the sidecar's and the bare SDK's q-th percentile, ms."""
            return (
                med([percentile(p.sidecar.firsts, q) * 1e3 for p in pairs]),
                med([percentile(p.bare.firsts, q) * 1e3 for p in pairs]),
            )

        added50 = med(
            [(percentile(p.sidecar.firsts, 50) - percentile(p.bare.firsts, 50)) * 1e3 for p in pairs]
        )
        added99 = med(
            [(percentile(p.sidecar.firsts, 99) - percentile(p.bare.firsts, 99)) * 1e3 for p in pairs]
        )
        own = med([(p.sidecar.cpu_per_request - p.bare.cpu_per_request) * 1e3 for p in pairs])
        slope = med([_slope(p.sidecar, p.sidecar_long) * 1e6 for p in pairs])
        ratio = med([p.sidecar_rate / p.bare_rate for p in pairs if p.bare_rate])
        (s50, b50), (s99, b99) = firsts(50), firsts(99)
        figures.add(
            api,
            f"{b50:.2f} / {b99:.2f}",
            f"{s50:.2f} / {s99:.2f}",
            f"{added50:+.2f} / {added99:+.2f}",
            f"{med([p.sidecar.cpu_per_request * 1e3 for p in pairs]):.2f}",
            f"{med([p.bare.cpu_per_request * 1e3 for p in pairs]):.2f}",
            f"{own:.2f}",
            f"{slope:.1f}",
            f"{med([_slope(p.bare, p.bare_long) * 1e6 for p in pairs]):.1f}",
            f"{med([p.bare_rate for p in pairs]):,.0f} / {med([p.sidecar_rate for p in pairs]):,.0f}",
            f"{ratio:.2f}x",
            f"{med([p.sidecar_rate_cpu * 1e6 for p in pairs]):.1f}",
        )
        floor = ANTHROPIC_THROUGHPUT_TARGET if api == "anthropic" else OPENAI_THROUGHPUT_FLOOR
        checks = (
            ("added TTFT p50", f"{added50:+.2f} ms", ADDED_P50_TARGET_MS, added50, "ms"),
            ("added TTFT p99", f"{added99:+.2f} ms", ADDED_P99_TARGET_MS, added99, "ms"),
            ("own CPU per request", f"{own:.2f} ms", OWN_CPU_TARGET_MS, own, "ms"),
            ("marginal CPU per chunk", f"{slope:.1f} µs", CHUNK_CPU_TARGET_US, slope, "µs"),
        )
        for name, value, target, measured, unit in checks:
            budget.add(name, api, value, f"<= {target:g} {unit}", verdict(measured <= target))
        budget.add(
            "throughput at 16 streams", api, f"{ratio:.2f}x", f">= {floor:.2f}x", verdict(ratio >= floor)
        )
    figures.notes += [
        "Sidecar: turnwire serve, SQLite, a new conversation per request, no middleware, demo tools off, "
        f"burst-{SHORT} answers ({SHORT} text deltas); bare: the official SDK on the same upstream. Arms "
        "alternate order from pair to pair.",
        "own CPU = server CPU per request (its /proc: all threads) - the bare SDK client's CPU per request "
        f"(this process); slope = (CPU/request at burst-{LONG} - at burst-{SHORT}) / {LONG - SHORT} chunks.",
        f"16 streams: burst-{LONG} answers, {opts.window:g} s window per arm after a quarter-window warm-up.",
    ]
    budget.notes.append(
        "OpenAI's throughput floor is the figure measured before issue 33's cuts (bench/ttft.md); later "
        "issues get <= 0.3 ms own CPU per request each unless their text says otherwise."
    )
    return [figures, budget]


async def run_budget(opts: BudgetOptions) -> list[Table]:
    """Issue 33's harness shape (``py``): the 0-middleware sidecar vs the bare SDK."""
    upstream = Upstream()
    try:
        with tempfile.TemporaryDirectory(prefix="turnwire-bench-budget-") as tmp:
            server = sidecar(Path(tmp), upstream.url, 0)
            await server.start(startup_seconds=600)  # a loaded machine imports the SDKs slowly
            client = SidecarClient(server.target)
            bare = {api: BareClient(api, upstream.url) for api in APIS}
            try:

                async def sidecar_turn(api: str, model: str) -> tuple[float, int]:
                    return await client.turn(new_conversation_id(), f"{api}:{model}")

                async def bare_turn(api: str, model: str) -> tuple[float, int]:
                    return await bare[api].turn([], model)

                results = await measure(opts, server, sidecar_turn, bare_turn)
            finally:
                await client.close()
                for each in bare.values():
                    await each.close()
                server.stop()
    finally:
        upstream.close()
    return budget_tables(results, opts)
