"""What fencing (issue 34) adds to a running turn's hot writes: checkpoints (``save_message``) and
event batches (``append_events``), on SQLite and PostgreSQL.

Fencing adds no statement and no round trip: each write already read ``SELECT 1 FROM turns WHERE
request_id = ?`` in its read batch; it now reads ``SELECT owner, lease_epoch … FOR UPDATE`` (the
row lock only on PostgreSQL) and compares. This script runs the same writes with the statement of
before (``--arm before``, patched in) and of now, interleaved, and prints CPU per write: this
process's (``time.process_time``) and, on PostgreSQL, the server backends' (``/proc/<pid>/stat``
of the database's sessions). Run: ``.venv/bin/python bench/fencing_cost.py [--writes 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from _stores import analyzed, backend_cpu_s, both_stores

from turnwire_client.v1 import message_pb2
from turnwire_server.store import TurnRecord
from turnwire_server.store.core import fencing, message_writes, stream_writes
from turnwire_server.store.core.sql import Statement

_NOW = fencing.lease_read


def _before(request_id: str, dialect: object) -> Statement:
    """The read of before, as far as the statement goes: the turn's row, no row lock."""
    return Statement("SELECT owner, lease_epoch FROM turns WHERE request_id = ?", (request_id,), fetch=True)


async def _round(store: object, arm: str, writes: int, n: int, url: str | None) -> tuple[float, float]:
    for module in (message_writes, stream_writes):
        setattr(module, "lease_read", _before if arm == "before" else _NOW)  # noqa: B010
    turn = TurnRecord(
        request_id=f"r{n}-{arm}",
        conversation_id=f"c{n}-{arm}",
        assistant_message_id=f"a{n}-{arm}",
        continuation=False,
        model="scripted:x",
        state="running",
        start_time=dt.datetime.now(dt.UTC),
        owner="bench",
    )
    user = message_pb2.Message(id=f"u{n}-{arm}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    await store.start_turn(turn, [user])  # type: ignore[attr-defined]
    reply = message_pb2.Message(id=turn.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
    text = reply.parts.add().text
    server_before = backend_cpu_s(url) if url else 0.0
    started = time.process_time()
    for i in range(writes):
        text.text += " word"
        await store.save_message(turn.conversation_id, reply, lease=turn.lease)  # type: ignore[attr-defined]
        await store.append_events(  # type: ignore[attr-defined]
            turn.conversation_id, turn.request_id, [(i + 1, b"event")], ended=False, lease=turn.lease
        )
    client = (time.process_time() - started) / (2 * writes) * 1e6
    server = ((backend_cpu_s(url) - server_before) / (2 * writes) * 1e6) if url else 0.0
    return client, server


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--writes", type=int, default=1000, help="checkpoints (and as many event batches) per round"
    )
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    async with both_stores() as (lite, pg, url):
        for n in range(args.rounds):
            analyzed(url)  # as autovacuum keeps a growing server's statistics
            for arm in ("before", "now") if n % 2 == 0 else ("now", "before"):
                sc, _ = await _round(lite, arm, args.writes, n, None)
                pc, ps = await _round(pg, arm, args.writes, n, url)
                rows.append((n + 1, arm, sc, pc, ps))
    load = os.getloadavg()[0]
    print("| round | statement | SQLite CPU µs/write | PG client CPU µs/write | PG server CPU µs/write |")
    print("|---|---|---|---|---|")
    for n, arm, sc, pc, ps in rows:
        print(f"| {n} | {arm} | {sc:.0f} | {pc:.0f} | {ps:.0f} |")
    print(f"\n{args.writes} checkpoints + {args.writes} event batches per round; load average {load:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
