"""What observability costs: time to first token and events/s with traces and metrics on vs off.

Two Turnwire servers, each in its own process on the ``stream_overhead.py`` workload (a scripted
reply of N text deltas, a new conversation per turn): "off" on the defaults (no tracing, no
metrics endpoint), and "on" with ``tracing.enabled`` and the real OTLP/gRPC exporter (batch span
processor, every trace sampled) sending to a local sink process (``_otlp_sink.py``, counting the
spans it receives), and ``metrics.enabled`` with its ``/metrics`` endpoint scraped once a second
(15 times as often as Prometheus' default). The Prometheus counters themselves are recorded in
both (they are not switchable; an unscraped counter costs its increment only): their work per
turn is timed alone in the second table.

On a machine with two or more CPUs the servers run pinned to one (``taskset``) and this process
(the load generator, the scraper) and the sink to the others, so neither side's work lands on the
other's core. Measured, interleaved round by round (off, on, off, on, ...) so drift hits both
alike (who goes first alternates); medians over the rounds of each round's difference:

- time to first token: sequential turns (one stream), the servers taking turns one turn at a time
  (both see the same moment of a busy machine), call start to the first text delta, p50/p99;
- at S concurrent streams (default 100), each running turns back to back: the server's CPU time
  per event (user + system, all its threads: the primary throughput-cost measure, much less
  sensitive than wall events/s to other load on a shared machine), events/s, and the time to
  first event of the turns started in the window.

Then the engine alone in this process (no gRPC, no load client competing for the cores): blocks of
sequential turns on two engines, tracing off and on (the real exporter to the same sink),
interleaved: time to first token and CPU time per turn; and tracing's and the metrics' own work
per turn, timed alone.

Targets (issue 14): added time to first token p50 <= 0.1 ms; events/s at 100 streams >= 95 % of
"off", that is CPU per event <= 1/0.95 of "off" (+5.3 %). Reported, not asserted.

    .venv/bin/python bench/observability.py [--quick] [--rounds N] [--window S] [--streams S]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import grpc
from _common import (
    BENCH_DIR,
    CHAT_METHOD,
    CLIENT_OPTIONS,
    PYTHON,
    ServerProcess,
    Table,
    chat_request,
    free_port,
    percentile,
    print_tables,
    turnwire_config,
    verdict,
    wait_for_quiet,
    write_tables_json,
)
from _load import load
from _observability_in_process import OFF, ON, THROUGHPUT_TARGET, TTFT_TARGET_MS, in_process, in_process_table

from turnwire_client.v1 import chat_service_pb2

CPU_TARGET = 1 / THROUGHPUT_TARGET
"""CPU per event "on" / "off" at most: events/s >= 95 % of "off" on a CPU-bound server."""

SCRAPE_SECONDS = 1.0


def _pinning() -> tuple[list[str], set[int] | None]:
    """The ``taskset`` prefix for the servers (the first CPU this process may use) and the CPUs
    left for this process and the sink; no pinning on one CPU or without ``taskset``."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2 or shutil.which("taskset") is None:
        return [], None
    return ["taskset", "-c", str(cpus[0])], set(cpus[1:])


def _server(
    workdir: Path, name: str, deltas: int, pin: list[str], *, sink_port: int | None, metrics_port: int | None
) -> ServerProcess:
    port = free_port()
    workdir.mkdir(exist_ok=True)
    config = turnwire_config(workdir, port, deltas=deltas, chunk_size=4)
    with config.open("a") as file:
        if sink_port is not None:
            file.write(f"tracing:\n  enabled: true\n  endpoint: http://127.0.0.1:{sink_port}\n")
        if metrics_port is not None:
            file.write(f"metrics:\n  enabled: true\n  listen: 127.0.0.1:{metrics_port}\n")
    argv = [*pin, PYTHON, "-m", "turnwire_server", "serve", "--config", str(config)]
    return ServerProcess(argv, port, workdir, name)


class Scraper:
    """Scrapes ``url`` every :data:`SCRAPE_SECONDS` on a thread while running; counts the scrapes
    that answered with the turn counter in them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SCRAPE_SECONDS):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    if b"turnwire_turns_total" in response.read():
                        self.scrapes += 1
            except OSError as error:
                _log(f"scrape failed: {error}")

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def first_tokens(targets: dict[str, str], seconds: float, tag: str) -> dict[str, list[float]]:
    """Sequential turns for ``seconds``, one server after the other turn by turn (so both see the
    same moment of a busy machine): per server, each turn's time from the call to its first text
    delta (ms)."""
    found: dict[str, list[float]] = {name: [] for name in targets}
    channels = {
        name: grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS) for name, target in targets.items()
    }
    try:
        chats = {
            name: channel.unary_stream(
                CHAT_METHOD,
                request_serializer=chat_service_pb2.ChatRequest.SerializeToString,
                response_deserializer=chat_service_pb2.ChatResponse.FromString,
            )
            for name, channel in channels.items()
        }
        deadline = time.perf_counter() + seconds
        turn = 0
        while time.perf_counter() < deadline:
            for name in list(chats) if turn % 2 else list(reversed(chats)):
                started = time.perf_counter()
                first = 0.0
                async for response in chats[name](chat_request(f"{tag}-{len(name)}-{turn}")):
                    if not first and response.event.HasField("text_delta"):
                        first = time.perf_counter() - started
                found[name].append(first * 1000)
            turn += 1
    finally:
        for channel in channels.values():
            await channel.close()
    return found


async def measure(
    args: argparse.Namespace, root: Path, sink_port: int, pin: list[str]
) -> tuple[dict[str, dict[str, list[float]]], float, int]:
    """Per server: the samples of each measure; the seconds taken; the scrapes answered."""
    metrics_port = free_port()
    servers = {
        OFF: _server(root / "off", "off", args.deltas, pin, sink_port=None, metrics_port=None),
        ON: _server(root / "on", "on", args.deltas, pin, sink_port=sink_port, metrics_port=metrics_port),
    }
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in servers}
    started = time.perf_counter()
    try:
        for server in servers.values():
            await server.start()
        with Scraper(f"http://127.0.0.1:{metrics_port}/metrics") as scraper:
            for round_ in range(args.rounds + 1):  # round 0 warms both up and is not kept
                order = list(servers.items())
                for name, server in order if round_ % 2 else reversed(order):  # who goes first swaps
                    await wait_for_quiet(
                        [s.ps for s in servers.values() if s.ps], max_wait=0.5 if args.quick else 2.0
                    )
                    _log(f"{name}: {args.streams} streams, round {round_}")
                    cpu: dict[str, float] = {}

                    def mark(edge: str, server: ServerProcess = server, cpu: dict[str, float] = cpu) -> None:
                        cpu[edge] = server.cpu_seconds()

                    busy = await load(
                        server.target, args.streams, args.warm, args.window, f"b{round_}", on_window=mark
                    )
                    if round_ == 0:
                        continue
                    kept = samples[name]
                    kept.setdefault("events", []).append(busy["events_per_s"])
                    kept.setdefault("ttfe_busy", []).append(busy["ttfe_p50_ms"])
                    kept.setdefault("cpu_us", []).append((cpu["end"] - cpu["start"]) / busy["events"] * 1e6)
                _log(f"time to first token, turns taking turns, round {round_}")
                firsts = await first_tokens(
                    {name: server.target for name, server in servers.items()}, args.ttft_seconds, f"t{round_}"
                )
                if round_:  # each round's pair: the load on the machine changes less within a round
                    off, on = samples[OFF], samples[ON]
                    for name, values in firsts.items():
                        samples[name].setdefault("ttft", []).extend(values)
                        samples[name].setdefault("ttft_p50", []).append(percentile(values, 50))
                        samples[name].setdefault("ttft_p99", []).append(percentile(values, 99))
                    on.setdefault("ttft_added", []).append(on["ttft_p50"][-1] - off["ttft_p50"][-1])
                    on.setdefault("cpu_ratio", []).append(on["cpu_us"][-1] / off["cpu_us"][-1])
                    on.setdefault("events_ratio", []).append(on["events"][-1] / off["events"][-1])
            scrapes = scraper.scrapes
    finally:
        for server in servers.values():
            server.stop()
    return samples, time.perf_counter() - started, scrapes


def table(
    samples: dict[str, dict[str, list[float]]],
    *,
    spans: int,
    scrapes: int,
    args: argparse.Namespace,
    seconds: float,
    pinned: bool,
) -> Table:
    off, on = samples[OFF], samples[ON]

    def mid(values: list[float]) -> float:
        return percentile(values, 50)

    result = Table(
        f"Observability cost: traces (OTLP/gRPC to a local sink) and metrics (scraped) on vs off, "
        f"{args.streams} streams",
        ["measure", OFF, ON, "added", "target", "verdict"],
    )
    ttft = mid(on["ttft_added"])
    result.add(
        "time to first token p50 (ms)",
        f"{mid(off['ttft']):.3f}",
        f"{mid(on['ttft']):.3f}",
        f"{ttft:+.3f}",
        f"<= +{TTFT_TARGET_MS} ms",
        verdict(ttft <= TTFT_TARGET_MS),
    )
    result.add(
        "time to first token p99 (ms)",
        f"{percentile(off['ttft'], 99):.3f}",
        f"{percentile(on['ttft'], 99):.3f}",
        f"{percentile(on['ttft'], 99) - percentile(off['ttft'], 99):+.3f}",
        "",
        "",
    )
    cpu = mid(on["cpu_ratio"])
    result.add(
        f"server CPU per event at {args.streams} streams (µs)",
        f"{mid(off['cpu_us']):.1f}",
        f"{mid(on['cpu_us']):.1f}",
        f"{(cpu - 1) * 100:+.1f} %",
        f"<= +{(CPU_TARGET - 1) * 100:.1f} %",
        verdict(cpu <= CPU_TARGET),
    )
    ratio = mid(on["events_ratio"])
    result.add(
        f"events/s at {args.streams} streams (wall)",
        f"{mid(off['events']):,.0f}",
        f"{mid(on['events']):,.0f}",
        f"{(ratio - 1) * 100:+.1f} %",
        f">= {THROUGHPUT_TARGET * 100:.0f} % of off",
        verdict(ratio >= THROUGHPUT_TARGET),
    )
    result.add(
        f"time to first event p50 at {args.streams} streams (ms)",
        f"{mid(off['ttfe_busy']):.2f}",
        f"{mid(on['ttfe_busy']):.2f}",
        f"{mid(on['ttfe_busy']) - mid(off['ttfe_busy']):+.2f}",
        "",
        "",
    )
    spread = (
        ", ".join(f"{value:.1f}" for value in off["cpu_us"])
        + " / "
        + ", ".join(f"{value:.1f}" for value in on["cpu_us"])
    )
    result.notes += [
        f"Medians over {args.rounds} rounds (after one warm-up round), each measuring both servers "
        "(who goes first alternates); 'added' is the median of the rounds' differences (ratios). "
        "Each round: "
        f"{args.ttft_seconds:g} s of sequential turns, the servers taking turns one turn at a time, for "
        f"time to first token ({len(on['ttft']):,} turns each in all; p50 and p99 over all), "
        f"{args.window:g} s at {args.streams} streams; a turn is {args.deltas} text deltas + 6 events; "
        f"took {seconds:.0f} s. "
        f"CPU per event by round (off / on, µs): {spread}.",
        f"'{ON}': tracing.enabled with the default sampler (every trace recorded) and the batch "
        f"span processor, the sink received {spans:,} spans; metrics.enabled, /metrics scraped every "
        f"{SCRAPE_SECONDS:g} s ({scrapes} scrapes). Both servers record the Prometheus metrics (not "
        "switchable): their work per turn is in the second table. "
        + (
            "Servers pinned to one CPU (taskset), the load generator and the sink to the others; "
            "the server's CPU per event is the primary measure (events/s also moves with other "
            "load on the machine)."
            if pinned
            else "Not pinned (one CPU or no taskset)."
        ),
    ]
    return result


def _log(message: str) -> None:
    print(f"[observability] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 s windows")
    parser.add_argument("--rounds", type=int, help="measured rounds (default 7, quick 1)")
    parser.add_argument("--window", type=float, help="seconds at S streams per round (default 2, quick 1)")
    parser.add_argument("--streams", type=int, default=100, help="concurrent streams (default 100)")
    parser.add_argument("--deltas", type=int, default=200, help="text deltas per turn (default 200)")
    parser.add_argument("--json", type=Path, help="write the table as JSON here (for bench/run.py)")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 7)
    args.window = args.window or (1.0 if args.quick else 2.0)
    args.ttft_seconds = 1.0 if args.quick else 4.0
    args.warm = 0.5 if args.quick else 1.0
    args.blocks = 2 if args.quick else 20
    args.block_turns = 50
    pin, rest = _pinning()
    if rest is not None:
        os.sched_setaffinity(0, rest)  # this process and the sink it starts: off the servers' CPU
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-observability-") as tmp:
        root = Path(tmp)
        sink_port = free_port()
        count = root / "spans.txt"
        sink = subprocess.Popen(
            [PYTHON, str(BENCH_DIR / "_otlp_sink.py"), "--port", str(sink_port), "--count", str(count)]
        )
        try:
            samples, seconds, scrapes = asyncio.run(measure(args, root, sink_port, pin))
            _log("the engine in process")
            if rest is not None:
                os.sched_setaffinity(0, {int(pin[-1])})  # the engine on the servers' CPU, the sink apart
            engine_samples = asyncio.run(in_process(args, root, sink_port))
        finally:
            sink.terminate()
            sink.wait()
        spans = int(count.read_text()) if count.exists() else 0
    results = [
        table(samples, spans=spans, scrapes=scrapes, args=args, seconds=seconds, pinned=rest is not None),
        in_process_table(engine_samples, args),
    ]
    # Tracing's and the metrics' work for one turn, timed alone, against what a served turn costs.
    per_turn_ms = percentile(samples[OFF]["cpu_us"], 50) * (args.deltas + 6) / 1000
    work_ms = (
        percentile(engine_samples[ON]["span_work_us"], 50)
        + percentile(engine_samples[ON]["export_us"], 50)
        + percentile(engine_samples[ON]["metrics_work_us"], 50)
    ) / 1000
    share = work_ms / per_turn_ms * 100
    results[0].add(
        "traces' and metrics' work per served turn (timed alone)",
        f"{per_turn_ms:.2f} ms CPU",
        f"+{work_ms * 1000:.0f} µs",
        f"{share:+.1f} %",
        f"<= +{(CPU_TARGET - 1) * 100:.1f} %",
        verdict(share <= (CPU_TARGET - 1) * 100),
    )
    results[0].notes.append(
        "The last row: the server's CPU for one turn with both off (CPU per event x events per "
        "turn) against the work of traces (in the turn's task and the exporter's encoding) and of "
        "the metrics for one turn, each measured alone (see the second table): free of the noise "
        "of a shared machine that the rows above carry, but a floor: inside real turns the same "
        "work costs two to three times as much (the second table's whole-turn rows, measured turn "
        "by turn against an untraced engine)."
    )
    if args.json:
        write_tables_json(args.json, results)
    else:
        print_tables(results)


if __name__ == "__main__":
    main()
