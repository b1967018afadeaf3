"""Many concurrent turns on many conversations across three replicas with bounded connections.

Issue 11: every turn completes, and no replica holds more than its pool (``store.pool_size``
20) plus its one ``LISTEN`` connection, however many turns run or wait: a turn holds no
connection for its duration (the turn lock is a queue ticket, leases are renewed in one batch
per replica). Connections are counted in ``pg_stat_activity`` by ``application_name``
(``turnwire/<replica id>``).

Size: ``TURNWIRE_STRESS_SCALE`` (default 1: 150 turns; ``make stress``: 1,500).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import psycopg
from support.sidecar import SidecarFactory
from support.stores import postgres_database

from turnwire_client import TurnwireClient, collect

SCALE = int(os.environ.get("TURNWIRE_STRESS_SCALE", "1"))
TURNS = 150 * SCALE
POOL = 20
CONFIG = {
    "providers": {"scripted": {"scripts": {"work": [{"text": "one two three four five", "delay_ms": 20}]}}},
    "store": {"pool_size": POOL},
    "limits": {"max_concurrent_rpcs": 100_000},
}


async def test_many_turns_across_replicas_hold_bounded_connections(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    with postgres_database() as url:
        replicas = [
            sidecar_factory(CONFIG, workdir=tmp_path / f"tw-stress-{n}", store_url=url) for n in range(3)
        ]
        await asyncio.gather(*(replica.start() for replica in replicas))
        peak: dict[str, int] = {}  # by session name, turnwire/<replica id>
        done = asyncio.Event()

        async def sample() -> None:
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                while not done.is_set():
                    cur = await conn.execute(
                        "SELECT application_name, COUNT(*) FROM pg_stat_activity"
                        " WHERE datname = current_database() GROUP BY application_name"
                    )
                    for name, count in await cur.fetchall():
                        if name.startswith("turnwire/"):
                            peak[name] = max(peak.get(name, 0), int(count))
                    await asyncio.sleep(0.05)  # a sampling period, not a wait for a condition

        clients = [TurnwireClient(replica.target) for replica in replicas]
        sampler = asyncio.ensure_future(sample())
        try:
            results = await asyncio.gather(
                *(
                    collect(clients[n % 3].chat(f"conv-{n}", "go", model="scripted:work"))
                    for n in range(TURNS)
                )
            )
        finally:
            done.set()
            await sampler
            for client in clients:
                await client.close()
        assert [r.status_name for r in results] == ["COMPLETED"] * TURNS
        print(f"peak connections per replica over {TURNS} turns: {peak}")
        assert len(peak) == 3, f"sessions named for each replica: {peak}"
        assert all(count <= POOL + 1 for count in peak.values()), f"connections per replica: {peak}"
        for replica in replicas:
            assert await replica.terminate() == 0, replica.log_text()
