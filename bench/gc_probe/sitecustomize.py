"""The cycle collector's passes in a served sidecar (issue 33; bench/ttft.md, "the collector's
passes"): a diagnostic, not in the suite.

Put this directory first on ``PYTHONPATH`` (an absolute path: the sidecars run elsewhere)
and name an output directory in ``GC_PROBE_DIR`` (not a ``TURNWIRE_`` variable, which the
benches' sidecars do not inherit), and every ``turnwire serve`` process started with that
environment (``ttft.py``'s sidecars inherit it) records each collector pass once the serving
settings are in place (``collector.tune_collector``): its generation, the CPU time of the thread
that ran it, its wall time, that thread's name and the objects it collected; the process writes
them as JSON at exit (``gc-<pid>.json``)::

    PYTHONPATH=$PWD/bench/gc_probe GC_PROBE_DIR=/tmp/gc .venv/bin/python bench/ttft.py --budget --pairs 1
    .venv/bin/python bench/gc_probe/sitecustomize.py /tmp/gc

The second command prints the passes per generation of each file. A callback per pass costs a
few microseconds; nothing else runs in the probed process.
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

_SERVING_THRESHOLD = 10_000  # collector.GC_THRESHOLDS[0], not imported: this runs before any import


def _serving_process() -> bool:
    argv = Path("/proc/self/cmdline").read_bytes().split(b"\0")
    return b"turnwire_server" in argv and b"serve" in argv


def _install(out: Path) -> None:
    passes: list[tuple[int, float, float, str, int]] = []
    started = [0.0, 0.0]
    serving = [False]

    def on_pass(phase: str, info: dict[str, Any]) -> None:
        if not serving[0]:
            if gc.get_threshold()[0] != _SERVING_THRESHOLD:
                return  # start-up's passes, before the serving settings
            serving[0] = True
        if phase == "start":
            started[0], started[1] = time.thread_time(), time.perf_counter()
        else:
            passes.append(
                (
                    int(info["generation"]),
                    time.thread_time() - started[0],
                    time.perf_counter() - started[1],
                    threading.current_thread().name,
                    int(info["collected"]),
                )
            )

    def dump() -> None:
        out.mkdir(parents=True, exist_ok=True)
        record = {"passes": passes, "process_cpu_s": time.process_time()}
        (out / f"gc-{os.getpid()}.json").write_text(json.dumps(record))

    gc.callbacks.append(on_pass)
    atexit.register(dump)


def summarize(directory: Path) -> None:
    """Print, per file of ``directory``, the passes per generation: count, CPU seconds, the
    longest wall time in ms, objects collected, and the threads they ran on."""
    for path in sorted(directory.glob("gc-*.json")):
        record = json.loads(path.read_text())
        print(f"{path.name}: process CPU {record['process_cpu_s']:.2f} s")
        for generation in (0, 1, 2):
            rows = [p for p in record["passes"] if p[0] == generation]
            if rows:
                cpu = sum(p[1] for p in rows)
                longest = max(p[2] for p in rows) * 1000
                collected = sum(p[4] for p in rows)
                threads = sorted({p[3] for p in rows})
                print(
                    f"  generation {generation}: {len(rows)} passes, {cpu:.3f} s CPU, longest "
                    f"{longest:.1f} ms, {collected} collected, on {', '.join(threads)}"
                )


if __name__ == "__main__":
    summarize(Path(sys.argv[1]))
elif (_dir := os.environ.get("GC_PROBE_DIR")) and _serving_process():
    _install(Path(_dir))
