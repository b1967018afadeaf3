"""What observability costs: time to first token and events/s with traces on vs off.

Two Turnwire servers, each in its own process on the ``stream_overhead.py`` workload (a scripted
reply of N text deltas, a new conversation per turn): "off" on the defaults, and "on" with
``tracing.enabled`` and the real OTLP/gRPC exporter (batch span processor, every trace sampled)
sending to a local sink process (``_otlp_sink.py``, ``TraceService`` from ``opentelemetry-proto``)
that counts the spans it receives. The Prometheus counters of ``engine/metrics.py`` are always
on in both (they are not switchable); a metrics *endpoint* (``metrics:``) is not on this branch,
so "on" means traces + the in-process counters.

Measured, interleaved round by round (off, on, off, on, ...) so drift hits both alike:

- time to first token: sequential turns (one stream), call start to the first text delta, p50/p99;
- events/s at S concurrent streams (default 100), each running turns back to back, with the
  server's CPU time per event (less sensitive than events/s to other load on a shared machine)
  and the time to first event of the turns started in the window.

Then the engine alone in this process (no gRPC, no load client competing for the cores): blocks of
sequential turns on two engines, tracing off and on (the real exporter to the same sink),
interleaved: time to first token and CPU time per turn.

Targets (issue 14): added time to first token p50 <= 0.1 ms; events/s at 100 streams >= 95 % of
"off" (in process: CPU per turn <= +5 %). Reported, not asserted.

    .venv/bin/python bench/observability.py [--quick] [--rounds N] [--window S] [--streams S]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BENCH_DIR,
    PYTHON,
    ServerProcess,
    Table,
    free_port,
    percentile,
    print_tables,
    turnwire_config,
    verdict,
    wait_for_quiet,
    write_tables_json,
)
from _load import load
from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from turnwire.providers import ModelRequest
from turnwire.testing import ScriptedProvider, ScriptStep
from turnwire.types import FinishReason, FinishStep, Usage
from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api.status import status_of
from turnwire_server.engine import EngineSettings, TurnEngine, TurnRequest
from turnwire_server.engine.assistant_message import AssistantMessage
from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.sqlite import SqliteStore

OFF, ON = "off", "traces on"
TTFT_TARGET_MS = 0.1
THROUGHPUT_TARGET = 0.95


def _server(workdir: Path, name: str, deltas: int, sink_port: int | None) -> ServerProcess:
    port = free_port()
    workdir.mkdir(exist_ok=True)
    config = turnwire_config(workdir, port, deltas=deltas, chunk_size=4)
    if sink_port is not None:
        with config.open("a") as file:
            file.write(f"tracing:\n  enabled: true\n  endpoint: http://127.0.0.1:{sink_port}\n")
    argv = [PYTHON, "-m", "turnwire_server", "serve", "--config", str(config)]
    return ServerProcess(argv, port, workdir, name)


async def measure(
    args: argparse.Namespace, root: Path, sink_port: int
) -> tuple[dict[str, dict[str, list[float]]], float]:
    """Per server: the samples of each measure."""
    servers = {
        OFF: _server(root / "off", "off", args.deltas, None),
        ON: _server(root / "on", "on", args.deltas, sink_port),
    }
    samples: dict[str, dict[str, list[float]]] = {name: {} for name in servers}
    started = time.perf_counter()
    try:
        for server in servers.values():
            await server.start()
        for round_ in range(args.rounds + 1):  # round 0 warms both up and is not kept
            for name, server in servers.items():
                await wait_for_quiet(max_wait=0.5 if args.quick else 2.0)
                _log(f"{name}: time to first token, round {round_}")
                first = await load(
                    server.target, 1, args.warm, args.ttft_seconds, f"t{round_}", count_text=True
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
                kept.setdefault("ttft_p50", []).append(first["ttft_p50_ms"])
                kept.setdefault("ttft_p99", []).append(first["ttft_p99_ms"])
                kept.setdefault("events", []).append(busy["events_per_s"])
                kept.setdefault("ttfe_busy", []).append(busy["ttfe_p50_ms"])
                kept.setdefault("cpu_us", []).append((cpu["end"] - cpu["start"]) / busy["events"] * 1e6)
    finally:
        for server in servers.values():
            server.stop()
    return samples, time.perf_counter() - started


def table(
    samples: dict[str, dict[str, list[float]]], spans: int, args: argparse.Namespace, seconds: float
) -> Table:
    off, on = samples[OFF], samples[ON]

    def mid(values: list[float]) -> float:
        return percentile(values, 50)

    result = Table(
        f"Observability cost: traces on (OTLP/gRPC to a local sink) vs off, {args.streams} streams",
        ["measure", OFF, ON, "added", "target", "verdict"],
    )
    ttft = mid(on["ttft_p50"]) - mid(off["ttft_p50"])
    result.add(
        "time to first token p50 (ms)",
        f"{mid(off['ttft_p50']):.3f}",
        f"{mid(on['ttft_p50']):.3f}",
        f"{ttft:+.3f}",
        f"<= +{TTFT_TARGET_MS} ms",
        verdict(ttft <= TTFT_TARGET_MS),
    )
    result.add(
        "time to first token p99 (ms)",
        f"{mid(off['ttft_p99']):.3f}",
        f"{mid(on['ttft_p99']):.3f}",
        f"{mid(on['ttft_p99']) - mid(off['ttft_p99']):+.3f}",
        "",
        "",
    )
    ratio = mid(on["events"]) / mid(off["events"])
    result.add(
        f"events/s at {args.streams} streams",
        f"{mid(off['events']):,.0f}",
        f"{mid(on['events']):,.0f}",
        f"{(ratio - 1) * 100:+.1f} %",
        f">= {THROUGHPUT_TARGET * 100:.0f} % of off",
        verdict(ratio >= THROUGHPUT_TARGET),
    )
    cpu = mid(on["cpu_us"]) / mid(off["cpu_us"])
    result.add(
        f"server CPU per event at {args.streams} streams (µs)",
        f"{mid(off['cpu_us']):.1f}",
        f"{mid(on['cpu_us']):.1f}",
        f"{(cpu - 1) * 100:+.1f} %",
        "",
        "",
    )
    result.add(
        f"time to first event p50 at {args.streams} streams (ms)",
        f"{mid(off['ttfe_busy']):.2f}",
        f"{mid(on['ttfe_busy']):.2f}",
        f"{mid(on['ttfe_busy']) - mid(off['ttfe_busy']):+.2f}",
        "",
        "",
    )
    result.notes += [
        f"Medians over {args.rounds} interleaved rounds (after one warm-up round); each round: "
        f"{args.ttft_seconds:g} s of sequential turns for time to first token, {args.window:g} s "
        f"at {args.streams} streams; a turn is {args.deltas} text deltas + 6 events; took {seconds:.0f} s.",
        f"'{ON}': tracing.enabled with the default sampler (every trace recorded) and the batch "
        f"span processor; the sink received {spans:,} spans. Both servers keep the always-on "
        "Prometheus counters (engine/metrics.py); a metrics endpoint is not part of this branch.",
    ]
    return result


async def in_process(
    args: argparse.Namespace, root: Path, sink_port: int
) -> dict[str, dict[str, list[float]]]:
    """The engine alone in this process (no gRPC, no client in the way): per block of sequential
    turns, the time from ``start`` to the first text delta, and this process's CPU time per turn
    (the exporter's thread included); tracing on exports to the sink with the real exporter."""
    provider = TracerProvider()
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{sink_port}", insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracings = {OFF: TRACING_OFF, ON: Tracing(provider.get_tracer("bench"))}
    text = "x" * (4 * args.deltas)
    engines: dict[str, TurnEngine] = {}
    stores: list[SqliteStore] = []
    for name, tracing in tracings.items():
        store = SqliteStore(root / f"in-process-{len(stores)}.db")
        await store.open()
        stores.append(store)
        scripted = ScriptedProvider({"bench": [ScriptStep(text=text, chunk_size=4)]})
        engines[name] = TurnEngine(
            store=store,
            providers=ProviderRegistry({"scripted": scripted}),
            tools={},
            chain=MiddlewareChain(),
            settings=EngineSettings(default_model="scripted:bench"),
            error_status=status_of,
            tracing=tracing,
        )
    samples: dict[str, dict[str, list[float]]] = {OFF: {}, ON: {}}
    try:
        for block in range(args.blocks + 1):  # block 0 warms up
            for name, engine in engines.items():
                firsts: list[float] = []
                cpu = time.process_time()
                for turn in range(args.block_turns):
                    message = message_pb2.Message(id=f"u-{block}-{turn}", role=message_pb2.ROLE_USER)
                    message.parts.add().text.text = "hi"
                    request = TurnRequest(
                        conversation_id=f"{name}-{block}-{turn}",
                        request_id=f"r-{block}-{turn}",
                        messages=[message],
                        body={},
                        model="scripted:bench",
                        continuation=False,
                        response_type=chat_service_pb2.ChatResponse,
                    )
                    started = time.perf_counter()
                    handle = engine.start(request)
                    first = 0.0
                    async for response in handle:
                        if not first and response.event.HasField("text_delta"):
                            first = time.perf_counter() - started
                    await handle.task
                    firsts.append(first)
                cpu = time.process_time() - cpu
                if block:
                    samples[name].setdefault("ttft_p50", []).append(percentile(firsts, 50) * 1000)
                    samples[name].setdefault("cpu_ms", []).append(cpu / args.block_turns * 1000)
    finally:
        for engine in engines.values():
            await engine.drain(1.0)
        for store in stores:
            await store.close()
        provider.shutdown()
    # After the blocks, on a provider of its own: these spans must not wait in the blocks' queue.
    alone = TracerProvider()
    memory = InMemorySpanExporter()
    alone.add_span_processor(SimpleSpanProcessor(memory))
    tracing = Tracing(alone.get_tracer("bench"))
    for _ in range(5):
        memory.clear()
        before_first, whole = span_work(tracing, 500)
        samples[ON].setdefault("first_work_us", []).append(before_first)
        samples[ON].setdefault("span_work_us", []).append(whole)
        spans = memory.get_finished_spans()
        started = time.thread_time()
        encode_spans(spans).SerializeToString()
        samples[ON].setdefault("export_us", []).append((time.thread_time() - started) / 500 * 1e6)
    return samples


def span_work(tracing: Tracing, turns: int) -> tuple[float, float]:
    """This thread's CPU time (µs) for what tracing adds to one one-step turn, alone: up to the
    model's first chunk (the turn and model call spans started and current, the provider's
    header injected), and in all (their end attributes, ended); less exposed to other load than
    whole turns."""
    request = TurnRequest(
        conversation_id="c",
        request_id="r",
        messages=[],
        body={},
        model="scripted:bench",
        continuation=False,
        response_type=chat_service_pb2.ChatResponse,
    )
    model_request = ModelRequest(model="bench", system="", messages=[])
    scripted = ScriptedProvider({})
    finish = FinishStep(finish_reason=FinishReason.STOP)
    reply = AssistantMessage("a", message_pb2.Message().create_time)
    usage = Usage()
    before_first = 0.0
    started = time.thread_time()
    for _ in range(turns):
        entered = time.thread_time()
        with tracing.turn(request, scripted, attempt=1) as turn:
            with tracing.chat(scripted, model_request, "c") as chat:
                propagate.inject({})
                before_first += time.thread_time() - entered
                tracing.end_chat(chat, finish, reply)
            tracing.end_turn(turn, outcome="completed", usage=usage, error=None)
    return before_first / turns * 1e6, (time.thread_time() - started) / turns * 1e6


def in_process_table(samples: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> Table:
    off, on = samples[OFF], samples[ON]

    def mid(values: list[float]) -> float:
        return percentile(values, 50)

    result = Table(
        "Observability cost in process: the engine alone, traces on (OTLP/gRPC to the sink) vs off",
        ["measure", OFF, ON, "added", "target", "verdict"],
    )
    added = mid(on["ttft_p50"]) - mid(off["ttft_p50"])
    result.add(
        "time to first token p50 (ms)",
        f"{mid(off['ttft_p50']):.3f}",
        f"{mid(on['ttft_p50']):.3f}",
        f"{added:+.3f}",
        f"<= +{TTFT_TARGET_MS} ms",
        verdict(added <= TTFT_TARGET_MS),
    )
    cpu = mid(on["cpu_ms"]) / mid(off["cpu_ms"])
    result.add(
        "CPU per turn (ms)",
        f"{mid(off['cpu_ms']):.3f}",
        f"{mid(on['cpu_ms']):.3f}",
        f"{(cpu - 1) * 100:+.1f} %",
        f"<= +{(1 - THROUGHPUT_TARGET) * 100:.0f} %",
        verdict(cpu <= 1 / THROUGHPUT_TARGET),
    )
    first = mid(on["first_work_us"])
    result.add(
        "tracing's work before the first token (µs CPU)",
        "0",
        f"{first:.1f}",
        f"{first / 1000:+.3f} ms",
        f"<= +{TTFT_TARGET_MS} ms",
        verdict(first / 1000 <= TTFT_TARGET_MS),
    )
    work, export = mid(on["span_work_us"]), mid(on["export_us"])
    share = (work + export) / 10 / mid(off["cpu_ms"])
    result.add("tracing's work per one-step turn, in the turn (µs CPU)", "0", f"{work:.1f}", "", "", "")
    result.add("the exporter's work per turn, its thread (µs CPU)", "0", f"{export:.1f}", "", "", "")
    result.add(
        "tracing's work per turn, both",
        "",
        "",
        f"{share:+.1f} % of a turn",
        f"<= +{(1 - THROUGHPUT_TARGET) * 100:.0f} %",
        verdict(share <= (1 / THROUGHPUT_TARGET - 1) * 100),
    )
    result.notes.append(
        f"Medians over {args.blocks} interleaved blocks of {args.block_turns} sequential turns (after a "
        "warm-up block), TurnEngine.start to the first TextDelta; CPU is this process's (the span "
        "exporter's thread included). Less exposed to other load on the machine than the table "
        "above. The last rows time tracing's work for one turn alone: the calls in the turn (turn "
        "and model call spans, attributes, context, header injection) and the exporter's OTLP "
        "encoding of those spans (done on the batch processor's thread), against the CPU of a "
        "whole turn with tracing off (an in-process turn, without gRPC: the real share is smaller)."
    )
    return result


def _log(message: str) -> None:
    print(f"[observability] {message}", file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 1 round, 1 s windows")
    parser.add_argument("--rounds", type=int, help="measured rounds (default 3, quick 1)")
    parser.add_argument("--window", type=float, help="seconds at S streams per round (default 3, quick 1)")
    parser.add_argument("--streams", type=int, default=100, help="concurrent streams (default 100)")
    parser.add_argument("--deltas", type=int, default=200, help="text deltas per turn (default 200)")
    parser.add_argument("--json", type=Path, help="write the table as JSON here (for bench/run.py)")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.window = args.window or (1.0 if args.quick else 3.0)
    args.ttft_seconds = 1.0 if args.quick else 3.0
    args.warm = 0.5 if args.quick else 1.0
    args.blocks = 2 if args.quick else 20
    args.block_turns = 50
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-observability-") as tmp:
        root = Path(tmp)
        sink_port = free_port()
        count = root / "spans.txt"
        sink = subprocess.Popen(
            [PYTHON, str(BENCH_DIR / "_otlp_sink.py"), "--port", str(sink_port), "--count", str(count)]
        )
        try:
            samples, seconds = asyncio.run(measure(args, root, sink_port))
            _log("the engine in process")
            engine_samples = asyncio.run(in_process(args, root, sink_port))
        finally:
            sink.terminate()
            sink.wait()
        spans = int(count.read_text()) if count.exists() else 0
    results = [table(samples, spans, args, seconds), in_process_table(engine_samples, args)]
    if args.json:
        write_tables_json(args.json, results)
    else:
        print_tables(results)


if __name__ == "__main__":
    main()
