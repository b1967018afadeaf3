"""What the store benches share (``fencing_cost.py``, ``budget_cost.py``, ``tool_start_cost.py``):
both stores opened side by side, the PostgreSQL server's CPU spent for a database (the backends'
own time, which the client's CPU does not show), a timed block of requests and the table of arms."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
from _common import cpu_seconds_of
from support.stores import postgres_database

from turnwire_server.store.postgres import PostgresStore
from turnwire_server.store.sqlite import SqliteStore


@asynccontextmanager
async def both_stores() -> AsyncIterator[tuple[SqliteStore, PostgresStore, str]]:
    """An open SQLite store in a temporary directory and an open PostgreSQL store on a fresh
    database of the local server (``support.stores.postgres_database``), with that database's URL;
    both closed (and the database dropped) on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        lite = SqliteStore(Path(tmp) / "bench.db")
        await lite.open()
        try:
            with postgres_database() as url:
                pg = PostgresStore(url)
                await pg.open()
                try:
                    yield lite, pg, url
                finally:
                    await pg.close()
        finally:
            await lite.close()


def backend_cpu_s(url: str) -> float:
    """Seconds on a CPU the PostgreSQL backends serving ``url``'s database have used so far, from
    ``/proc/<pid>/schedstat`` (counted in ns: ``/proc/<pid>/stat``'s 10 ms ticks are 500 µs a
    request over a block of 20, coarser than the differences measured); the backend this reading
    opens, one that ended meanwhile, and the server's own workers on the database (autovacuum's,
    whose rounds would land in one block or another) are left out."""
    with psycopg.connect(url, autocommit=True) as conn:
        pids = [
            p
            for (p,) in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
                " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            )
        ]
    return sum(cpu_seconds_of(pid) for pid in pids)


def analyzed(url: str) -> None:
    """Bring the statistics of ``url``'s database up to date (``ANALYZE``), as autovacuum's
    analyze keeps them on a server whose tables grow (at 50 rows plus 10 % changed, within its
    one-minute nap), before each round of a bench. Without it, the generic plans PostgreSQL made
    for the first requests of a bench, on near-empty tables, stay in use while the tables grow by
    thousands of rows in seconds: the budget decision joined the whole ``budget_spend`` table (a
    hash join) instead of looking up its rows, its execution ~270 µs at 500 requests and ~660 at
    3,000, which a running server's plans do not do (bench/budget_cost.md, 2026-12-07). The
    session doing it ends before the round's first reading (:func:`backend_cpu_s` leaves it out)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")


async def timed_block(
    run: Callable[[int], Awaitable[None]], *, turns: int, url: str | None, base: int
) -> tuple[list[float], list[float], float]:
    """``run(base + n)`` for ``n`` in ``range(turns)`` (one request each): each one's client CPU
    (``time.process_time``) and wall, and the PostgreSQL server's CPU per request over the block
    (``url``'s backends; 0 without a URL), in µs."""
    server_before = backend_cpu_s(url) if url else 0.0
    cpu, wall = [], []
    for n in range(turns):
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        await run(base + n)
        cpu.append((time.process_time() - cpu_before) * 1e6)
        wall.append((time.perf_counter() - wall_before) * 1e6)
    server = ((backend_cpu_s(url) - server_before) / turns * 1e6) if url else 0.0
    return cpu, wall, server


def print_arms(
    samples: Mapping[tuple[str, str], tuple[list[float], list[float], list[float]]],
    arms: Sequence[str],
    allowance_us: float,
) -> None:
    """The table of ``samples`` (``(store, arm)`` → client CPU and wall per request, server CPU
    per request per block, µs): medians, and what each arm adds to the first one's CPU (client
    plus server) against ``allowance_us`` (PASS or MISS)."""
    print(
        "| store | arm | client CPU µs/request | server CPU µs/request | wall µs/request "
        f"| added CPU µs/request (client + server) | ≤ {allowance_us:.0f} µs |"
    )
    print("|---|---|---|---|---|---|---|")
    for name in dict.fromkeys(store for store, _ in samples):
        first = samples[(name, arms[0])]
        base_total = statistics.median(first[0]) + statistics.median(first[2])
        for arm in arms:
            cpu, wall, server = (statistics.median(values) for values in samples[(name, arm)])
            row = f"| {name} | {arm} | {cpu:.0f} | {server:.0f} | {wall:.0f} "
            if arm == arms[0]:
                print(row + "| – | – |")
                continue
            added = cpu + server - base_total
            print(row + f"| {added:.0f} | {'PASS' if added <= allowance_us else 'MISS'} |")


Samples = dict[tuple[str, str], tuple[list[float], list[float], list[float]]]
"""``(store, arm)`` → client CPU and wall per request, server CPU per request per block (µs)."""


async def interleaved(
    stores: Sequence[tuple[str, object, str | None]],
    arms: Sequence[str],
    run: Callable[[Any, str], Callable[[int], Awaitable[None]]],
    *,
    rounds: int,
    block: int,
    warm: int = 10,
) -> Samples:
    """Blocks of ``block`` requests of each arm on each of ``stores`` (name, store, PostgreSQL URL
    or None), ``rounds`` times, each round in another order of the arms, so a change of load hits
    every arm alike; ``warm`` requests of each arm first (imports, caches, statement caches), not
    kept. ``run(store, arm)`` runs request ``n`` when called with ``n``."""
    samples: Samples = {}
    for _, store, url in stores:
        for arm in arms:
            await timed_block(run(store, arm), turns=warm, url=url, base=-10 * warm)
    for r in range(rounds):
        for _, _, url in stores:
            if url:
                analyzed(url)
        for name, store, url in stores:
            for arm in [*arms[r % len(arms) :], *arms[: r % len(arms)]]:
                cpu, wall, server = await timed_block(run(store, arm), turns=block, url=url, base=r * block)
                kept = samples.setdefault((name, arm), ([], [], []))
                kept[0].extend(cpu)
                kept[1].extend(wall)
                kept[2].append(server)
    return samples
