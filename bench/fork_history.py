"""A turn's history read on a forked conversation against a plain one (issue 41, docs/forks.md):
``Store.load_messages`` (one statement, on the per-turn hot path) on SQLite and PostgreSQL.

Three conversations of ``--history`` prior turns (a user and an assistant message each): ``plain``,
``source``, and ``fork``, forked from ``source`` at its last message (so it shares all of them).
Each measured turn appends a user message to ``plain`` and to ``fork`` (untimed), reads each
one's history, then appends the reply, as the engine does; plain and fork alternate, so load
drifts hit both. Two reads: **warm** (the reader's cache holds the conversation: the delta read,
what a turn pays after the first) and **cold** (the cache dropped first: the whole read, what the
first turn after a restart or an eviction pays, where the fork's shared messages come from the
source's rows). µs per read, median of ``--turns`` turns: this process's CPU for SQLite (its
reads run in this process's threads), wall time for PostgreSQL (the server's time is in it). Printed, never
asserted. Compare with another code version (plain only) by putting it first on ``PYTHONPATH``.

    .venv/bin/python bench/fork_history.py [--history 1000] [--turns 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _stores import both_stores

from turnwire_client.v1 import message_pb2


def _message(message_id: str, role: int, text: str) -> message_pb2.Message:
    message = message_pb2.Message(id=message_id, role=message_pb2.Role.ValueType(role))
    message.parts.add().text.text = text
    return message


def _turn(i: int) -> list[message_pb2.Message]:
    return [
        _message(f"u{i}", message_pb2.ROLE_USER, f"Question {i}: what is the weather like in Paris today?"),
        _message(f"a{i}", message_pb2.ROLE_ASSISTANT, "The quick brown fox jumps over the lazy dog."),
    ]


async def _seed(store: Any, conversation_id: str, history: int) -> None:
    for start in range(0, history, 250):
        batch = [m for i in range(start, min(history, start + 250)) for m in _turn(i)]
        await store.add_messages(conversation_id, batch, mode="append", allow_missing=True)


async def _read(store: Any, conversation_id: str, *, cold: bool, cpu: bool) -> float:
    """µs for one ``load_messages`` (the cache dropped first when ``cold``): this process's CPU
    (all its threads: SQLite's reader too) with ``cpu``, else wall time."""
    if cold:
        store._decoded.region.discard(conversation_id)
    clock = time.process_time if cpu else time.perf_counter
    start = clock()
    await store.load_messages(conversation_id)
    return (clock() - start) * 1e6


async def measure(store: Any, history: int, turns: int, *, cpu: bool) -> dict[str, dict[str, float]]:
    """Median µs per read: ``{"plain"|"fork": {"warm": …, "cold": …}}``."""
    await _seed(store, "plain", history)
    await _seed(store, "source", history)
    forks = hasattr(store, "fork_conversation")
    if forks:
        await store.fork_conversation("source", f"a{history - 1}", "fork")
    names = ["plain", "fork"] if forks else ["plain"]
    spent: dict[str, dict[str, list[float]]] = {n: {"warm": [], "cold": []} for n in names}
    for n in names:
        await store.load_messages(n)
    for i in range(history, history + turns):
        for name in names:
            await store.add_messages(name, [_turn(i)[0]], mode="append", allow_missing=False)
            spent[name]["warm"].append(await _read(store, name, cold=False, cpu=cpu))
            spent[name]["cold"].append(await _read(store, name, cold=True, cpu=cpu))
            await store.add_messages(name, [_turn(i)[1]], mode="append", allow_missing=False)
    return {n: {k: statistics.median(v) for k, v in kinds.items()} for n, kinds in spent.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--history", type=int, default=1000, help="prior turns (2 messages each)")
    parser.add_argument("--turns", type=int, default=40, help="measured turns")
    args = parser.parse_args()
    async with both_stores() as (lite, pg, _):
        print(f"history: {args.history} prior turns ({2 * args.history} messages), {args.turns} turns")
        print("| store | conversation | clock | warm read µs (delta) | cold read µs (whole) |")
        print("|---|---|---|---|---|")
        for name, store, cpu in (("sqlite", lite, True), ("postgres", pg, False)):
            figures_of = await measure(store, args.history, args.turns, cpu=cpu)
            for conversation, figures in figures_of.items():
                warm, cold = figures["warm"], figures["cold"]
                print(f"| {name} | {conversation} | {'CPU' if cpu else 'wall'} | {warm:.0f} | {cold:.0f} |")


if __name__ == "__main__":
    asyncio.run(main())
