"""Diagnostic: where a turn's wall time goes, and what the store costs at most.

Runs Turnwire in this process through ``turnwire_server.app.start(settings)`` (SQLite in
a temp dir) and instruments it from the outside, without changing server code:

* the store's ``start_turn`` / ``save_message`` (checkpoints) / ``finish_turn`` /
  ``load_messages`` calls (latency seen by the turn, queueing included),
* the SQLite writer's batches (writes per batch, writer-thread round trips per
  batch, batch duration) and every round trip to the writer thread,
* event-loop lag (how late a 1 ms timer fires).

The load comes from ``bench/_load.py`` in a separate process (turns back to
back, a new conversation each; 1, 10 and 100 streams). Only samples inside the
client's measurement window count.

``--variants`` picks what runs: ``baseline`` (the server as it is) and
``null-store``, where every store call returns at once without touching SQLite,
patched in at run time (bench-only code; the server source is untouched). Not a
fix: the bound on what any store work could cost.

    python bench/turn_phases.py [--levels 1,10,100] [--seconds 3] [--variants baseline,null-store]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BENCH_DIR,
    HOLD_DELAY_MS,
    PYTHON,
    STREAM_MODEL,
    Table,
    free_port,
    machine_busy_seconds,
    own_cpu_seconds,
    percentile,
    print_tables,
    stream_text,
    wait_for_quiet,
)

VARIANTS = ("baseline", "null-store")


class Recorder:
    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[float, float]]] = defaultdict(list)  # name -> (end, value)

    def add(self, name: str, value: float) -> None:
        self.samples[name].append((time.monotonic(), value))

    def window(self, name: str, t0: float, t1: float) -> list[float]:
        return [v for t, v in self.samples.get(name, []) if t0 <= t <= t1]

    def clear(self) -> None:
        self.samples.clear()


# ----------------------------------------------------------------------------- the null-store bound


def patch_null_store(store: Any) -> None:
    """Bound, not a fix: the store's per-turn calls do nothing (no SQLite, no threads)."""

    async def nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    async def no_messages(*_args: Any, **_kwargs: Any) -> list[Any]:
        return []

    for name in ("start_turn", "save_message", "finish_turn"):
        setattr(store, name, nothing)
    store.load_messages = no_messages


# ----------------------------------------------------------------------------- instrumentation


def _timed_async(rec: Recorder, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.monotonic()
        try:
            return await fn(*args, **kwargs)
        finally:
            rec.add(name, time.monotonic() - start)

    return wrapper


def instrument(sidecar: Any, rec: Recorder) -> None:
    store = sidecar.store
    for name in ("start_turn", "save_message", "finish_turn", "load_messages"):
        setattr(store, name, _timed_async(rec, f"store.{name}", getattr(store, name)))

    writer = store._writer
    executor = writer._executor
    hops = {"n": 0}
    original_submit = executor.submit

    def counted_submit(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        hops["n"] += 1
        start = time.monotonic()
        future = original_submit(fn, *args, **kwargs)
        future.add_done_callback(lambda _f: rec.add("writer.hop", time.monotonic() - start))
        return future

    executor.submit = counted_submit
    original_batch = writer._apply_batch

    async def counted_batch(batch: list[Any]) -> None:
        before = hops["n"]
        start = time.monotonic()
        try:
            await original_batch(batch)
        finally:
            rec.add("writer.batch_s", time.monotonic() - start)
            rec.add("writer.batch_writes", len(batch))
            rec.add("writer.batch_hops", hops["n"] - before)

    writer._apply_batch = counted_batch

    engine = sidecar.engine
    original_start = engine.start

    def timed_start(request: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        handle = original_start(request, **kwargs)
        handle.task.add_done_callback(lambda _t: rec.add("turn.wall", time.monotonic() - started))
        return handle

    engine.start = timed_start


async def loop_lag(rec: Recorder, stop: asyncio.Event) -> None:
    """Loop lag every ~1 ms; this process's CPU time (the server's: the client is a
    subprocess) every ~50 ms, for CPU per event over the client's window."""
    last_cpu = 0.0
    while not stop.is_set():
        start = time.monotonic()
        await asyncio.sleep(0.001)
        now = time.monotonic()
        rec.add("loop.lag", now - start - 0.001)
        if now - last_cpu >= 0.05:
            last_cpu = now
            rec.samples["cpu"].append((now, own_cpu_seconds()))
            rec.samples["machine"].append((now, machine_busy_seconds()))


def cpu_between(rec: Recorder, t0: float, t1: float, series: str = "cpu") -> float:
    """CPU seconds (this process, or ``series="machine"``) between the samples nearest to
    ``t0`` and ``t1``."""
    samples = rec.samples.get(series, [])
    start = min(samples, key=lambda s: abs(s[0] - t0))
    end = min(samples, key=lambda s: abs(s[0] - t1))
    return end[1] - start[1] if end[0] > start[0] else float("nan")


# ----------------------------------------------------------------------------- the run

PHASES = (
    ("turn.wall", "ms", 1e3),
    ("store.start_turn", "ms", 1e3),
    ("store.load_messages", "ms", 1e3),
    ("store.save_message", "ms", 1e3),
    ("store.finish_turn", "ms", 1e3),
    ("writer.batch_s", "ms", 1e3),
    ("writer.batch_writes", "writes", 1),
    ("writer.batch_hops", "round trips", 1),
    ("writer.hop", "ms", 1e3),
    ("loop.lag", "ms", 1e3),
)


async def run_variant(
    variant: str, levels: list[int], *, seconds: float, deltas: int, chunk_size: int, coalesce_ms: float
) -> tuple[list[Table], list[dict[str, Any]]]:
    from turnwire_server.app import start
    from turnwire_server.collector import tune_collector
    from turnwire_server.config import Settings

    phase_tables: list[Table] = []
    summary: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="turnwire-phases-") as tmp:
        port = free_port()
        settings = Settings(
            listen=f"127.0.0.1:{port}",
            default_model=STREAM_MODEL,
            logging={"level": "warning"},
            store={"url": f"sqlite:///{Path(tmp) / 'turnwire.db'}"},
            providers={
                "scripted": {
                    "scripts": {
                        "bench": [{"text": stream_text(deltas, chunk_size), "chunk_size": chunk_size}],
                        "hold": [{"text": "held", "delay_ms": HOLD_DELAY_MS}],
                    }
                }
            },
            tools={"demo": False},
            events={"text_coalesce_ms": coalesce_ms},
            limits={"shutdown_grace_seconds": 1},
        )
        sidecar = await start(settings)
        tune_collector()  # as `turnwire serve` runs
        if variant == "null-store":
            patch_null_store(sidecar.store)
        rec = Recorder()
        instrument(sidecar, rec)
        stop = asyncio.Event()
        lag_task = asyncio.create_task(loop_lag(rec, stop))
        try:
            for streams in levels:
                await wait_for_quiet(max_wait=5.0)
                rec.clear()
                proc = await asyncio.create_subprocess_exec(
                    PYTHON,
                    str(BENCH_DIR / "_load.py"),
                    "--target",
                    f"127.0.0.1:{port}",
                    "--streams",
                    str(streams),
                    "--warm",
                    "1",
                    "--seconds",
                    str(seconds),
                    "--tag",
                    f"ph{streams}",
                    stdout=asyncio.subprocess.PIPE,
                )
                out, _ = await proc.communicate()
                result = json.loads(out.decode().strip().splitlines()[-1])
                t0, t1 = result["window_start"], result["window_end"]
                table = Table(
                    f"[{variant}] {streams} stream(s): {result['events_per_s']:,.0f} events/s, "
                    f"{result['turns_per_s']:.1f} turns/s, client TTFE p50 "
                    f"{result['ttfe_p50_ms']:.2f} ms / p99 {result['ttfe_p99_ms']:.2f} ms",
                    ["what", "count", "p50", "p90", "p99", "mean", "unit"],
                )
                row: dict[str, Any] = {"variant": variant, "streams": streams, **result}
                server_cpu = cpu_between(rec, t0, t1)
                row["cpu_us_per_event"] = server_cpu / max(result["events"], 1) * 1e6
                machine = cpu_between(rec, t0, t1, "machine")
                row["other_cores"] = max(0.0, (machine - server_cpu) / (t1 - t0) - result["client_cores"])
                for name, unit, scale in PHASES:
                    values = rec.window(name, t0, t1)
                    if not values:
                        continue
                    mean = sum(values) / len(values)
                    row[name] = (
                        percentile(values, 50) * scale,
                        percentile(values, 99) * scale,
                        mean * scale,
                    )
                    table.add(
                        name,
                        len(values),
                        f"{percentile(values, 50) * scale:.3f}",
                        f"{percentile(values, 90) * scale:.3f}",
                        f"{percentile(values, 99) * scale:.3f}",
                        f"{mean * scale:.3f}",
                        unit,
                    )
                phase_tables.append(table)
                summary.append(row)
        finally:
            stop.set()
            await lag_task
            await sidecar.stop()
    return phase_tables, summary


def summary_table(rows: list[dict[str, Any]]) -> Table:
    table = Table(
        "Variant comparison (server in-process + instrumentation; client in its own process)",
        [
            "variant",
            "streams",
            "events/s",
            "turns/s",
            "vs baseline",
            "srv CPU us/event",
            "client cores",
            "other cores",
            "turn wall p50 ms",
            "start_turn p50/p99 ms",
            "finish_turn p50/p99 ms",
            "round trips/batch",
            "client TTFE p50/p99 ms",
        ],
    )
    base: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if r["variant"] == "baseline":
            base[r["streams"]].append(r["events_per_s"])
    for r in rows:
        ref = base.get(r["streams"])
        ratio = ""
        if ref and r["variant"] != "baseline":
            ratio = f"{r['events_per_s'] / (sum(ref) / len(ref)):.2f}x"

        def pair(key: str, row: dict[str, Any] = r) -> str:
            v = row.get(key)
            return f"{v[0]:.2f} / {v[1]:.2f}" if v else ""

        hops = r.get("writer.batch_hops")
        table.add(
            r["variant"],
            r["streams"],
            f"{r['events_per_s']:,.0f}",
            f"{r['turns_per_s']:.1f}",
            ratio,
            f"{r['cpu_us_per_event']:.1f}",
            f"{r['client_cores']:.2f}",
            f"{r['other_cores']:.2f}",
            f"{r['turn.wall'][0]:.2f}" if "turn.wall" in r else "",
            pair("store.start_turn"),
            pair("store.finish_turn"),
            f"{hops[2]:.1f}" if hops else "",
            f"{r['ttfe_p50_ms']:.2f} / {r['ttfe_p99_ms']:.2f}",
        )
    table.notes.append(
        "vs baseline: events/s over the mean of the baseline rows with as many streams. other cores: "
        "the rest of the machine during the window (other users); rows with more than ~0.2 are "
        "disturbed - compare srv CPU us/event and the latencies, which suffer less."
    )
    table.notes.append(
        "null-store is patched in at run time by this script (server code unchanged): every store "
        "call returns at once, a bound, not a fix. Absolute numbers are lower than "
        "stream_overhead.py's (instrumentation, server in this process); compare variants."
    )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,10,100", help="concurrent streams, comma-separated")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--chunk-size", type=int, default=4)
    parser.add_argument("--coalesce-ms", type=float, default=0.0)
    parser.add_argument("--variants", default="baseline", help=f"comma-separated: {', '.join(VARIANTS)}")
    parser.add_argument("--details", action="store_true", help="print every phase table")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    variants = [v.strip() for v in args.variants.split(",")]
    unknown = set(variants) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}; known: {', '.join(VARIANTS)}")
    phase_tables: list[Table] = []
    rows: list[dict[str, Any]] = []
    for variant in variants:
        print(f"[turn_phases] {variant} ...", file=sys.stderr, flush=True)
        tables, summary = asyncio.run(
            run_variant(
                variant,
                levels,
                seconds=args.seconds,
                deltas=args.deltas,
                chunk_size=args.chunk_size,
                coalesce_ms=args.coalesce_ms,
            )
        )
        phase_tables.extend(tables)
        rows.extend(summary)
    if args.details or len(variants) == 1:
        print_tables(phase_tables)
    print_tables([summary_table(rows)])


if __name__ == "__main__":
    main()
