r"""The in-process part of ``observability.py``: the engine alone, traces on vs off.

Two :class:`TurnEngine`\ s in this process (SQLite in a temp dir, the scripted model), one with
tracing through the real OTLP/gRPC exporter to the benchmark's sink: blocks of sequential turns,
interleaved, for the time to the first text delta and this process's CPU per turn; then
tracing's own work for one turn timed alone (the calls in the turn, the exporter's encoding), and
the metrics' (the Prometheus observations of one served turn, engine and gRPC layer).
"""

from __future__ import annotations

import argparse
import gc
import threading
import time
from pathlib import Path

from _common import Table, percentile, verdict
from opentelemetry import propagate
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from turnwire.providers import ModelRequest
from turnwire.testing import ScriptedProvider, ScriptStep
from turnwire.types import FinishReason, FinishStep, Usage
from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api import metrics as rpc_metrics
from turnwire_server.api.status import status_of
from turnwire_server.engine import EngineSettings, TurnEngine, TurnRequest, metrics
from turnwire_server.engine.assistant_message import AssistantMessage
from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.sqlite import SqliteStore
from turnwire_server.trace_export import SdkSpans, service_resource

OFF, ON = "off", "traces on"
TTFT_TARGET_MS = 0.1
THROUGHPUT_TARGET = 0.95


async def in_process(
    args: argparse.Namespace, root: Path, sink_port: int
) -> dict[str, dict[str, list[float]]]:
    """The engine alone in this process (no gRPC, no client in the way): per block of sequential
    turns, the time from ``start`` to the first text delta, and this process's CPU time per turn
    (the exporter's thread included); tracing on exports to the sink with the real exporter."""
    spans = SdkSpans(service_resource({"service.name": "bench"}))  # as the server's
    provider = spans.provider
    exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{sink_port}", insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracings = {OFF: TRACING_OFF, ON: Tracing(spans)}
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
    exporter_clock = _exporter_clock()
    gc.collect()
    gc.freeze()  # as ``turnwire serve`` does once started (app.serve)
    try:
        for block in range(args.blocks + 1):  # block 0 warms up
            firsts: dict[str, list[float]] = {OFF: [], ON: []}
            cpu = dict.fromkeys(engines, 0.0)
            exported = 0.0
            for turn in range(args.block_turns):
                # Turn by turn, the order swapped every other turn: drift and other load hit both alike.
                order = list(engines) if turn % 2 == 0 else list(reversed(engines))
                for name in order:
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
                    process, exporting = time.process_time(), time.clock_gettime(exporter_clock)
                    started = time.perf_counter()
                    handle = await engines[name].start(request)
                    first = 0.0
                    async for response in handle:
                        if not first and response.event.HasField("text_delta"):
                            first = time.perf_counter() - started
                    await handle.task
                    firsts[name].append(first)
                    # The exporter's thread runs whenever its batch is full, during either engine's
                    # turns: its CPU is taken out of the turn it fell in and charged to "on".
                    export = time.clock_gettime(exporter_clock) - exporting
                    exported += export
                    cpu[name] += time.process_time() - process - export
            cpu[ON] += exported
            if block:
                for name in engines:
                    samples[name].setdefault("ttft_p50", []).append(percentile(firsts[name], 50) * 1000)
                    samples[name].setdefault("cpu_ms", []).append(cpu[name] / args.block_turns * 1000)
                ttft = samples[ON]["ttft_p50"][-1] - samples[OFF]["ttft_p50"][-1]
                samples[ON].setdefault("ttft_added", []).append(ttft)
                samples[ON].setdefault("cpu_ratio", []).append(cpu[ON] / cpu[OFF])
    finally:
        for engine in engines.values():
            await engine.drain(1.0)
        for store in stores:
            await store.close()
        provider.shutdown()
    # After the blocks, on a provider of its own: these spans must not wait in the blocks' queue.
    alone = SdkSpans(service_resource({"service.name": "bench"}))
    memory = InMemorySpanExporter()
    alone.provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing = Tracing(alone)
    for _ in range(5):
        memory.clear()
        before_first, whole = span_work(tracing, 500)
        samples[ON].setdefault("first_work_us", []).append(before_first)
        samples[ON].setdefault("span_work_us", []).append(whole)
        finished = memory.get_finished_spans()
        started = time.thread_time()
        encode_spans(finished).SerializeToString()
        samples[ON].setdefault("export_us", []).append((time.thread_time() - started) / 500 * 1e6)
        samples[ON].setdefault("metrics_work_us", []).append(metrics_work(2000))
        memory.clear()
        started = time.thread_time()
        for _ in range(500):
            with tracing.hook("bench", "before_step"):
                pass
        hooked = time.thread_time()
        encode_spans(memory.get_finished_spans()).SerializeToString()
        samples[ON].setdefault("hook_us", []).append((hooked - started) / 500 * 1e6)
        samples[ON].setdefault("hook_export_us", []).append((time.thread_time() - hooked) / 500 * 1e6)
    return samples


def metrics_work(turns: int) -> float:
    """This thread's CPU time (µs) for the Prometheus observations of one served one-step turn,
    alone: the engine's (queue gauge, time to first token, step, tokens, turn and its duration)
    and the gRPC layer's (started, open streams, handled, handling seconds), as they make them."""
    usage = Usage(input_tokens=12, output_tokens=200)
    method = ("server_stream", "turnwire.v1.ChatService", "Chat")
    started, seconds = rpc_metrics.STARTED.labels(*method), rpc_metrics.HANDLING_SECONDS.labels(*method)
    open_streams = rpc_metrics.OPEN_STREAMS.labels(*method[1:])
    handled = rpc_metrics.HANDLED.labels(*method, "OK")
    model = metrics.model_label("scripted:bench", None)
    begun = time.thread_time()
    for _ in range(turns):
        started.inc()
        open_streams.inc()
        metrics.QUEUED_TURNS.inc()
        metrics.QUEUED_TURNS.dec()
        metrics.TIME_TO_FIRST_TOKEN.labels(model).observe(0.001)
        metrics.STEPS.labels(model, "stop").inc()
        metrics.count_tokens(model, usage)
        metrics.TURNS.labels("chat", "completed").inc()
        metrics.TURN_DURATION.labels("completed").observe(0.01)
        open_streams.dec()
        seconds.observe(0.01)
        handled.inc()
    return (time.thread_time() - begun) / turns * 1e6


def _exporter_clock() -> int:
    """The CPU-time clock of the batch span processor's thread (opentelemetry-sdk names it
    ``OtelBatchSpanRecordProcessor``)."""
    for thread in threading.enumerate():
        if thread.name.startswith("OtelBatchSpan") and thread.ident is not None:
            return time.pthread_getcpuclockid(thread.ident)
    raise RuntimeError("no batch span processor thread: has opentelemetry-sdk renamed it?")


def span_work(tracing: Tracing, turns: int) -> tuple[float, float]:
    """This thread's CPU time (µs) for what tracing adds to one one-step turn, alone: up to the
    model's first chunk (the turn and model call spans planned and current, the provider's
    header injected), and in all (their end attributes, started on the SDK at the turn's end
    here, ended); less exposed to other load than whole turns."""
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
    added = mid(on["ttft_added"])
    result.add(
        "time to first token p50 (ms)",
        f"{mid(off['ttft_p50']):.3f}",
        f"{mid(on['ttft_p50']):.3f}",
        f"{added:+.3f}",
        f"<= +{TTFT_TARGET_MS} ms",
        verdict(added <= TTFT_TARGET_MS),
    )
    cpu = mid(on["cpu_ratio"])
    result.add(
        "CPU per turn (ms)",
        f"{mid(off['cpu_ms']):.3f}",
        f"{mid(on['cpu_ms']):.3f}",
        f"{(cpu - 1) * 100:+.1f} %",
        f"<= +{(1 / THROUGHPUT_TARGET - 1) * 100:.1f} %",
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
        "a traced hook call (per middleware and hook): in the turn + the exporter (µs CPU)",
        "0",
        f"{mid(on['hook_us']):.1f} + {mid(on['hook_export_us']):.1f}",
        "",
        "",
        "",
    )
    result.add(
        "the metrics' work per served turn (µs CPU, in both)",
        f"{mid(on['metrics_work_us']):.1f}",
        "",
        "",
        "",
        "",
    )
    result.add(
        "tracing's work per turn, both, of an in-process turn",
        "",
        "",
        f"{share:+.1f} %",
        "",
        "",
    )
    result.notes.append(
        f"Medians over {args.blocks} blocks of {args.block_turns} sequential turns per engine (after a "
        "warm-up block), the engines taking turns one turn at a time; TurnEngine.start to the first "
        "TextDelta, 'added' the median of the blocks' differences; CPU is this process's (its "
        "SQLite threads included), the span exporter's thread charged to 'on' whichever turn it ran "
        "in. This process runs alone on its CPU (the sink on the others). The last rows time "
        "tracing's work for one turn alone: the calls in the turn (turn and model call spans, "
        "attributes, context, header injection) and the exporter's OTLP encoding of those spans "
        "(on the batch processor's thread), and the share of an in-process turn that is (a turn "
        "without gRPC: a served turn costs 3-4 times as much, see the first table's last row)."
    )
    return result
