"""What a call to another thread costs the event loop (issue 33): the SQLite store's writer and
checkpoint threads (``store/sqlite/worker_thread.py``) against ``loop.run_in_executor`` with a
one-worker ``ThreadPoolExecutor`` (what they used before), and a whole no-op write through
``SqliteWriter.submit`` (its task, the batch's transaction on the thread, the callers' futures).

Each row runs ``--calls`` sequential calls of a function that does nothing, on uvloop (the
server's loop) and times the event loop thread's CPU (``thread_time``) and the process's
(``process_time``: the worker thread's too), per call; medians over ``--rounds``.

    .venv/bin/python bench/thread_hops.py [--calls 4000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import uvloop
from rich.console import Console
from rich.table import Table

from turnwire_server.store.sqlite.worker_thread import WorkerThread
from turnwire_server.store.sqlite.writer import SqliteWriter


def _nothing() -> None:
    return None


async def _timed(call: Callable[[], Awaitable[object]], calls: int) -> tuple[float, float]:
    """µs of loop CPU and of process CPU per ``call()``, after a warm-up."""
    for _ in range(200):
        await call()
    loop0, process0 = time.thread_time(), time.process_time()
    for _ in range(calls):
        await call()
    return (
        1e6 * (time.thread_time() - loop0) / calls,
        1e6 * (time.process_time() - process0) / calls,
    )


async def _round(calls: int) -> dict[str, tuple[float, float]]:
    loop = asyncio.get_running_loop()
    results: dict[str, tuple[float, float]] = {}
    executor = ThreadPoolExecutor(max_workers=1)
    try:
        results["run_in_executor, awaited"] = await _timed(
            lambda: loop.run_in_executor(executor, _nothing), calls
        )
        results["run_in_executor, asyncio.wait"] = await _timed(
            lambda: asyncio.wait((loop.run_in_executor(executor, _nothing),)), calls
        )
    finally:
        executor.shutdown()
    thread = WorkerThread("bench-hops")
    try:
        results["WorkerThread.run, awaited"] = await _timed(lambda: thread.run(_nothing), calls)
        results["WorkerThread.run, asyncio.shield"] = await _timed(
            lambda: asyncio.shield(thread.run(_nothing)), calls
        )
    finally:
        thread.stop()
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-hops-") as tmp:
        writer = SqliteWriter(Path(tmp) / "hops.db", batch_s=0)
        await writer.open([])
        try:
            results["SqliteWriter.submit (a no-op write)"] = await _timed(
                lambda: writer.submit(lambda conn, now_us: None, "bench", urgent=True), calls
            )
        finally:
            await writer.close()
    return results


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    rounds = [await _round(args.calls) for _ in range(args.rounds)]
    table = Table(
        title=f"A call to another thread, {args.calls} sequential calls, median of {args.rounds} rounds"
    )
    table.add_column("call")
    table.add_column("loop CPU µs/call", justify="right")
    table.add_column("process CPU µs/call", justify="right")
    for name in rounds[0]:
        table.add_row(
            name,
            f"{statistics.median(r[name][0] for r in rounds):.1f}",
            f"{statistics.median(r[name][1] for r in rounds):.1f}",
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    uvloop.run(main())
