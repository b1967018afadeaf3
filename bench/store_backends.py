"""Benchmark: the store's cost on the hot path, SQLite vs PostgreSQL vs no store (issue 11).

For each variant the sidecar runs in this process (``turnwire_server.app.start``) and the load
in a separate process (``_load.py``):

* **user-message commit** p50 / p99: ``Store.admit_turn`` as the turn waits for it (the turn
  lock and the one commit before the model is called; with PostgreSQL the ticket, the input's
  writes, the history read and the commit in one flight), sampled during the 1-stream run;
* **time to first token** p50 / p99: from the call to the first text delta, one turn at a time,
  twice: back to back with a model that streams without yielding (the next call lands while the
  last turn's trailing writes run, and the whole reply is produced before its first delta
  leaves), and as users meet it: a model whose every chunk is its own await, as a provider's
  network reads are, and turns 30 ms apart. The second is the issue-11 target's measure (added
  time to first token = the one commit);
* **events/s at 100 streams**.

``none`` is the null-store bound (every per-turn store call returns at once, the turn lock
included: nothing is taken, nothing written): not a product setting, the floor any store is
measured against. PostgreSQL runs on
``TURNWIRE_TEST_POSTGRES_URL``'s server (default ``postgresql://postgres@127.0.0.1:5432/test``),
in a fresh database dropped afterwards.

    .venv/bin/python bench/store_backends.py [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_DIR, PYTHON, STREAM_MODEL, Table, free_port, percentile, print_tables, stream_text

from turnwire_server.store.records import TurnAdmission

POSTGRES_URL = os.environ.get("TURNWIRE_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
VARIANTS = ("sqlite", "postgres", "none")
PACED_MODEL = "scripted:bench-paced"
PAUSE_MS = 30.0
"""Think time between the spaced run's turns: long enough for a turn's trailing writes (its end,
its events, its queue ticket) to finish before the next call, as between a user's messages."""


def _null_store(store: Any) -> None:
    async def nothing(*_args: Any, **_kwargs: Any) -> None:
        return None

    @contextlib.asynccontextmanager
    async def admitted(*_args: Any, **_kwargs: Any) -> AsyncIterator[TurnAdmission]:
        yield TurnAdmission(history=[], compaction_read=True)

    for name in ("start_turn", "save_message", "finish_turn", "append_events"):
        setattr(store, name, nothing)
    store.admit_turn = admitted


def _timed_admission(samples: list[float], admit: Callable[..., Any]) -> Callable[..., Any]:
    """``admit`` (``Store.admit_turn``), recording how long entering it took."""

    @contextlib.asynccontextmanager
    async def wrapper(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        started = time.perf_counter()
        async with admit(*args, **kwargs) as admission:
            samples.append(time.perf_counter() - started)
            yield admission

    return wrapper


async def _load(
    port: int, streams: int, seconds: float, tag: str, *, model: str = STREAM_MODEL, pause_ms: float = 0.0
) -> dict[str, float]:
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
        tag,
        "--count-text",
        "--model",
        model,
        "--pause-ms",
        str(pause_ms),
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    return json.loads(out.decode().strip().splitlines()[-1])  # type: ignore[no-any-return]


async def run_variant(variant: str, seconds: float, store_url: str) -> dict[str, float]:
    from turnwire_server.app import start
    from turnwire_server.collector import tune_collector
    from turnwire_server.config import Settings

    port = free_port()
    settings = Settings(
        listen=f"127.0.0.1:{port}",
        default_model=STREAM_MODEL,
        logging={"level": "warning"},
        store={"url": store_url, "pool_size": 20} if variant == "postgres" else {"url": store_url},
        providers={
            "scripted": {
                "scripts": {
                    "bench": [{"text": stream_text(200, 4), "chunk_size": 4}],
                    # As a provider's stream: each chunk arrives by its own read (an await).
                    "bench-paced": [{"text": stream_text(200, 4), "chunk_size": 4, "delay_ms": 0.001}],
                }
            }
        },
        tools={"demo": False},
        limits={"shutdown_grace_seconds": 1},
    )
    sidecar = await start(settings)
    tune_collector()  # as `turnwire serve` runs
    commits: list[float] = []
    if variant == "none":
        _null_store(sidecar.store)
    else:
        sidecar.store.admit_turn = _timed_admission(commits, sidecar.store.admit_turn)  # type: ignore[method-assign]
    try:
        one = await _load(port, 1, seconds, f"{variant}-1")
        alone = list(commits)  # the commits of the 1-stream run: no other turn waits on the store
        spaced = await _load(port, 1, seconds, f"{variant}-s", model=PACED_MODEL, pause_ms=PAUSE_MS)
        spaced_commits = commits[len(alone) :]
        del commits[len(alone) :]
        hundred = await _load(port, 100, seconds, f"{variant}-100")
    finally:
        await sidecar.stop()
    loaded = commits[len(alone) :]
    return {
        "commit_p50_ms": percentile(alone, 50) * 1000 if alone else float("nan"),
        "commit_p99_ms": percentile(alone, 99) * 1000 if alone else float("nan"),
        "commit100_p50_ms": percentile(loaded, 50) * 1000 if loaded else float("nan"),
        "commit100_p99_ms": percentile(loaded, 99) * 1000 if loaded else float("nan"),
        "ttft_p50_ms": one["ttft_p50_ms"],
        "ttft_p99_ms": one["ttft_p99_ms"],
        "spaced_ttft_p50_ms": spaced["ttft_p50_ms"],
        "spaced_commit_p50_ms": percentile(spaced_commits, 50) * 1000 if spaced_commits else float("nan"),
        "spaced_ttft_p99_ms": spaced["ttft_p99_ms"],
        "events_per_s_100": hundred["events_per_s"],
    }


async def main_async(seconds: float) -> Table:
    import psycopg

    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="turnwire-stores-") as tmp:
        for variant in VARIANTS:
            print(f"[store_backends] {variant} ...", file=sys.stderr, flush=True)
            if variant == "postgres":
                name = f"tw_bench_{secrets.token_hex(4)}"
                admin = await psycopg.AsyncConnection.connect(POSTGRES_URL, autocommit=True)
                await admin.execute(f"CREATE DATABASE {name}".encode())
                base = POSTGRES_URL.rsplit("/", 1)[0]
                try:
                    rows[variant] = await run_variant(variant, seconds, f"{base}/{name}")
                finally:
                    await admin.execute(f"DROP DATABASE {name} WITH (FORCE)".encode())
                    await admin.close()
            else:
                rows[variant] = await run_variant(
                    variant, seconds, f"sqlite:///{Path(tmp) / f'{variant}.db'}"
                )
    none = rows["none"]
    table = Table(
        "Store backends on the hot path (server in this process, load in another; 200 deltas/turn)",
        [
            "store",
            "user-message commit p50 / p99 ms (1 stream)",
            "... at 100 streams",
            "time to first token p50 / p99 ms",
            "added TTFT p50 vs no store ms",
            "TTFT p50 / p99 ms, paced model, turns 30 ms apart",
            "added TTFT p50 (same) ms",
            "its commit p50 ms",
            "events/s at 100 streams",
            "vs no store",
        ],
    )
    for variant in VARIANTS:
        r = rows[variant]
        table.add(
            variant,
            f"{r['commit_p50_ms']:.2f} / {r['commit_p99_ms']:.2f}",
            f"{r['commit100_p50_ms']:.2f} / {r['commit100_p99_ms']:.2f}",
            f"{r['ttft_p50_ms']:.2f} / {r['ttft_p99_ms']:.2f}",
            f"{r['ttft_p50_ms'] - none['ttft_p50_ms']:+.2f}",
            f"{r['spaced_ttft_p50_ms']:.2f} / {r['spaced_ttft_p99_ms']:.2f}",
            f"{r['spaced_ttft_p50_ms'] - none['spaced_ttft_p50_ms']:+.2f}",
            f"{r['spaced_commit_p50_ms']:.2f}",
            f"{r['events_per_s_100']:,.0f}",
            f"{r['events_per_s_100'] / none['events_per_s_100']:.0%}",
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per run")
    args = parser.parse_args()
    print_tables([asyncio.run(main_async(args.seconds))])


if __name__ == "__main__":
    main()
