"""What storing turn timelines (issue 39, docs/inspector.md) adds to a turn, against issue 33's
allowance of 0.3 ms CPU per request.

Two parts, each measured with the feature and without it, interleaved round by round:

* **recording** (in process, ``time.process_time``): a turn's :class:`TurnTimeline` as the engine
  fills it for a two-step turn with two tool calls (queue, attempt, two steps, two model streams
  with the first token, two tool calls, ``--hooks`` hook calls through the hook-span wrapper)
  and its serialization at the end; "without" runs the same hook calls unwrapped.
* **the final write** (``Store.finish_turn``): the turn's end with its serialized timeline in
  the same UPDATE (one more parameter, ~0.5 KB) against the end without it, on SQLite and
  PostgreSQL (this process's CPU, and the PostgreSQL backends' from ``/proc``).

Run: ``.venv/bin/python bench/timeline_cost.py [--turns 2000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import os
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stores import backend_cpu_s, both_stores
from support.store_turns import started_turn

from turnwire_server.engine.turn_timeline import ATTEMPT, MODEL, QUEUE, STEP, TOOL, TurnTimeline
from turnwire_server.store import Store, TurnRecord

ALLOWANCE_US = 300.0


async def _hook() -> None:
    """A middleware hook that does nothing."""


def _one_turn(hooks: int, *, recorded: bool) -> bytes:
    """The engine's calls for one two-step turn with two tool calls; the serialized timeline."""
    if not recorded:
        for _ in range(hooks):
            coroutine = _hook()
            with contextlib.suppress(StopIteration):
                coroutine.send(None)
        return b""
    timeline = TurnTimeline(time.perf_counter())
    wrap = timeline.hook_spans(None)
    timeline.end(timeline.begin(QUEUE, "queue"))
    with timeline.span(ATTEMPT, "attempt 1"):
        for step in range(2):
            timeline.step = step
            handle = timeline.begin(STEP, f"step {step}")
            with timeline.span(MODEL, "openai:gpt-4.1"):
                if step == 0:
                    timeline.first_token()
            if step == 0:
                for call in ("c1", "c2"):
                    with timeline.span(TOOL, "calculator", tool_call_id=call) as tool:
                        timeline.end(tool, "executed")
            timeline.end(handle, "stop")
    for _ in range(hooks):
        with wrap("Guard", "before_step"):
            coroutine = _hook()
            with contextlib.suppress(StopIteration):
                coroutine.send(None)
    return timeline.serialize()


def _recording(turns: int, hooks: int, *, recorded: bool) -> float:
    before = time.process_time()
    for _ in range(turns):
        _one_turn(hooks, recorded=recorded)
    return (time.process_time() - before) / turns * 1e6


async def _finishes(
    store: Store, turns: list[TurnRecord], timeline: bytes | None, url: str | None
) -> tuple[float, float]:
    server = backend_cpu_s(url) if url else 0.0
    before = time.process_time()
    for turn in turns:
        await store.finish_turn(
            dataclasses.replace(turn, state="completed", end_time=dt.datetime.now(dt.UTC), timeline=timeline),
            None,
        )
    cpu = (time.process_time() - before) / len(turns) * 1e6
    return cpu, ((backend_cpu_s(url) - server) / len(turns) * 1e6) if url else 0.0


@contextlib.asynccontextmanager
async def _stores() -> AsyncIterator[list[tuple[str, Store, str | None]]]:
    async with both_stores() as (lite, pg, url):
        yield [("SQLite", lite, None), ("PostgreSQL", pg, url)]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000, help="turns per round")
    parser.add_argument("--writes", type=int, default=300, help="final writes per round and arm")
    parser.add_argument("--hooks", type=int, default=6, help="hook calls per turn")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    _recording(200, args.hooks, recorded=True)  # warm
    timeline = _one_turn(args.hooks, recorded=True)
    print(f"recording, per turn ({args.hooks} hook calls; timeline {len(timeline)} bytes serialized)\n")
    print("| round | without µs CPU | with µs CPU | added µs | allowance | |")
    print("|---|---|---|---|---|---|")
    for n in range(args.rounds):
        without = _recording(args.turns, args.hooks, recorded=False)
        with_ = _recording(args.turns, args.hooks, recorded=True)
        added = with_ - without
        verdict = "PASS" if added <= ALLOWANCE_US else "MISS"
        print(f"| {n + 1} | {without:.1f} | {with_:.1f} | {added:.1f} | {ALLOWANCE_US:.0f} | {verdict} |")
    print("\nthe final write (finish_turn), per turn\n")
    print("| store | round | without µs CPU | with µs CPU | added µs CPU | PG server added µs | |")
    print("|---|---|---|---|---|---|---|")
    async with _stores() as stores:
        counter = 0
        for name, store, url in stores:
            for n in range(args.rounds):
                arms = {}
                for arm, blob in (("without", None), ("with", timeline)):
                    turns = []
                    for _ in range(args.writes):
                        counter += 1
                        turns.append(await started_turn(store, f"tl-{os.getpid()}", counter))
                    arms[arm] = await _finishes(store, turns, blob, url)
                added = arms["with"][0] - arms["without"][0]
                server = arms["with"][1] - arms["without"][1]
                verdict = "PASS" if added + max(0.0, server) <= ALLOWANCE_US else "MISS"
                print(
                    f"| {name} | {n + 1} | {arms['without'][0]:.0f} | {arms['with'][0]:.0f} | {added:.0f} | "
                    f"{server:.0f} | {verdict} |"
                )
    print(f"\nload average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
