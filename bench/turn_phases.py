"""Diagnostic: where a turn's wall time goes, with the real server in-process and instrumented.

Runs Turnwire in this process through ``server.app.start(settings)`` (SQLite in
a temp dir) and wraps, from the outside and without changing server code:

* the store's ``start_turn`` / ``save_message`` (checkpoints) / ``finish_turn`` /
  ``load_messages`` calls (caller-observed latency),
* the SQLite writer task's batches (writes per batch, statements = aiosqlite
  thread round trips per batch, batch duration),
* every aiosqlite thread round trip of the writer connection,
* event-loop lag (how late a 1 ms timer fires: the time one loop iteration takes).

The load comes from ``bench/_load.py`` in a separate process (1 and C streams,
turns back to back, a new conversation each). Only samples inside the
client's measurement window are counted. Not part of ``run.py``; run it when
``stream_overhead.py`` shows a miss:

    python bench/turn_phases.py [--streams 100] [--seconds 4] [--coalesce-ms 0]
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

from _common import (  # noqa: E402
    BENCH_DIR,
    HOLD_DELAY_MS,
    PYTHON,
    STREAM_MODEL,
    Table,
    free_port,
    percentile,
    print_tables,
    stream_text,
)


class Recorder:
    def __init__(self) -> None:
        self.samples: dict[str, list[tuple[float, float]]] = defaultdict(list)  # name -> (end, value)

    def add(self, name: str, value: float) -> None:
        self.samples[name].append((time.monotonic(), value))

    def window(self, name: str, t0: float, t1: float) -> list[float]:
        return [v for t, v in self.samples.get(name, []) if t0 <= t <= t1]

    def clear(self) -> None:
        self.samples.clear()


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

    writer_db = store._writer_db
    hops = {"n": 0}
    original_execute = writer_db._execute

    async def counted_execute(fn: Any, *args: Any, **kwargs: Any) -> Any:
        hops["n"] += 1
        start = time.monotonic()
        try:
            return await original_execute(fn, *args, **kwargs)
        finally:
            rec.add("writer.hop", time.monotonic() - start)

    writer_db._execute = counted_execute
    original_batch = store._apply_batch

    async def counted_batch(batch: list[Any]) -> None:
        before = hops["n"]
        start = time.monotonic()
        try:
            await original_batch(batch)
        finally:
            rec.add("writer.batch_s", time.monotonic() - start)
            rec.add("writer.batch_writes", len(batch))
            rec.add("writer.batch_hops", hops["n"] - before)

    store._apply_batch = counted_batch

    engine = sidecar.engine
    original_start = engine.start

    def timed_start(request: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        handle = original_start(request, **kwargs)
        handle.task.add_done_callback(lambda _t: rec.add("turn.wall", time.monotonic() - started))
        return handle

    engine.start = timed_start


async def loop_lag(rec: Recorder, stop: asyncio.Event) -> None:
    while not stop.is_set():
        start = time.monotonic()
        await asyncio.sleep(0.001)
        rec.add("loop.lag", time.monotonic() - start - 0.001)


async def run(streams_list: list[int], seconds: float, deltas: int, chunk_size: int, coalesce_ms: float) -> list[Table]:
    from server.app import start
    from server.config import Settings

    tables = []
    with tempfile.TemporaryDirectory(prefix="turnwire-phases-") as tmp:
        port = free_port()
        settings = Settings(
            listen=f"127.0.0.1:{port}",
            default_model=STREAM_MODEL,
            log_level="warning",
            store={"url": f"sqlite:///{Path(tmp) / 'turnwire.db'}"},
            providers={"scripted": {"scripts": {
                "bench": [{"text": stream_text(deltas, chunk_size), "chunk_size": chunk_size}],
                "hold": [{"text": "held", "delay_ms": HOLD_DELAY_MS}],
            }}},
            tools={"demo": False},
            events={"text_coalesce_ms": coalesce_ms},
            limits={"shutdown_grace_seconds": 1},
        )
        sidecar = await start(settings)
        rec = Recorder()
        instrument(sidecar, rec)
        stop = asyncio.Event()
        lag_task = asyncio.create_task(loop_lag(rec, stop))
        try:
            for streams in streams_list:
                rec.clear()
                proc = await asyncio.create_subprocess_exec(
                    PYTHON, str(BENCH_DIR / "_load.py"), "--target", f"127.0.0.1:{port}",
                    "--streams", str(streams), "--warm", "1", "--seconds", str(seconds),
                    "--tag", f"ph{streams}", stdout=asyncio.subprocess.PIPE,
                )
                out, _ = await proc.communicate()
                result = json.loads(out.decode().strip().splitlines()[-1])
                t0, t1 = result["window_start"], result["window_end"]
                table = Table(
                    f"Turn phases, {streams} stream(s): {result['events_per_s']:,.0f} events/s, "
                    f"{result['turns_per_s']:.1f} turns/s, client TTFE p50 "
                    f"{result['ttfe_p50_ms']:.2f} ms / p99 {result['ttfe_p99_ms']:.2f} ms",
                    ["what", "count", "p50", "p90", "p99", "mean", "unit"],
                )
                for name, unit, scale in (
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
                ):
                    values = rec.window(name, t0, t1)
                    if not values:
                        continue
                    mean = sum(values) / len(values)
                    table.add(
                        name, len(values), f"{percentile(values, 50) * scale:.3f}",
                        f"{percentile(values, 90) * scale:.3f}", f"{percentile(values, 99) * scale:.3f}",
                        f"{mean * scale:.3f}", unit,
                    )
                table.notes.append(
                    "store.* = latency seen by the turn (queueing for the single writer task "
                    "included); writer.hop = one aiosqlite thread round trip of the writer "
                    "connection; loop.lag = how late a 1 ms timer fires."
                )
                tables.append(table)
        finally:
            stop.set()
            await lag_task
            await sidecar.stop()
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--chunk-size", type=int, default=4)
    parser.add_argument("--coalesce-ms", type=float, default=0.0)
    args = parser.parse_args()
    tables = asyncio.run(run([1, args.streams], args.seconds, args.deltas, args.chunk_size, args.coalesce_ms))
    print_tables(tables)


if __name__ == "__main__":
    main()
