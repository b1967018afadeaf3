"""PostgreSQL's one-flight admission with a budget (issue 37; docs/cost.md, "What it costs per
request"): this checkout's flight against another checkout's, A/B in one process.

Each admission is ``Store.admit_turn`` on a new conversation (idle: the one flight) carrying a
first reservation on the tenant's day and the admission check on it, entered and left (the
ticket released), as the engine's. The two arms' flights (``budget_cost._charges_of``: each
checkout's ``one_flight.py``, charge programs and, from stop 62 on, ``budget_flight.py``, loaded
alike) alternate in blocks on one store, their order reversed every other round; per block the
client CPU (this process's ``time.process_time``), the server CPU of the database's backends
(``_stores.backend_cpu_s``) and the wall time per admission, and the medians of the rounds' paired
differences (this - base). Run::

    git worktree add /tmp/base <rev>
    .venv/bin/python bench/admission_flight.py --base /tmp/base [--rounds 200] [--block 25]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stores import analyzed, backend_cpu_s, both_stores
from budget_cost import REPO, _charges_of, _use
from support.stores import leased_turn

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store
from turnwire_server.store.records import BudgetAsk, BudgetCharge, BudgetKey, BudgetLimits

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
DAY = BudgetLimits(BudgetKey("tenant/day", "t", "2026-01-02"), tokens=10**12, usd=1e6)
ASK = BudgetAsk(500, 500 * 3e-6, 1.5e-5, 4_096)


def _input(request_id: str) -> list[message_pb2.Message]:
    user = message_pb2.Message(id=f"u-{request_id}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    return [user]


async def _block(store: Store, url: str, tag: str, first: int, count: int) -> tuple[float, float, float]:
    """``count`` admissions of ids ``tag<first>`` on: client CPU, server CPU, wall, µs each."""
    cpu, server, wall = time.process_time(), backend_cpu_s(url), time.perf_counter()
    for n in range(first, first + count):
        turn = leased_turn(f"{tag}{n}", f"{tag}c{n}", "a", start_time=T0)
        charge = BudgetCharge(turn.request_id, turn.conversation_id, turn.lease, (DAY,), ask=ASK)
        async with store.admit_turn(
            turn,
            _input(turn.request_id),
            lease_seconds=30,
            read_compaction=False,
            queued=lambda _: None,
            budget=charge,
            refuse=(DAY,),
        ) as admission:
            assert admission.budget is not None and admission.budget.refused is None
    return (
        (time.process_time() - cpu) / count * 1e6,
        (backend_cpu_s(url) - server) / count * 1e6,
        (time.perf_counter() - wall) / count * 1e6,
    )


async def main(base: Path, rounds: int, block: int) -> None:
    arms: dict[str, Any] = {"this": _charges_of(REPO), "base": _charges_of(base)}
    results: dict[str, list[tuple[float, float, float]]] = {arm: [] for arm in arms}
    async with both_stores() as (_, pg, url):
        for arm, charges in arms.items():  # warm: the statement cache, each flight's first runs
            _use(charges)
            await _block(pg, url, f"w{arm}", 0, 30)
        for r in range(rounds):
            if r % 10 == 0:  # as autovacuum keeps a growing server's statistics (rounds are short)
                analyzed(url)
            for arm in list(arms)[:: -1 if r % 2 else 1]:
                _use(arms[arm])
                results[arm].append(await _block(pg, url, arm, r * block, block))
    print("| arm | client CPU µs/admission | server CPU µs/admission | wall µs/admission |")
    print("|---|---|---|---|")
    for arm, rows in results.items():
        client, server, wall = (statistics.median(column) for column in zip(*rows, strict=True))
        print(f"| {arm} | {client:.0f} | {server:.0f} | {wall:.0f} |")
    paired = [
        tuple(a - b for a, b in zip(this, other, strict=True))
        for this, other in zip(results["this"], results["base"], strict=True)
    ]
    print("\n| this - base (median of rounds' differences) | client CPU µs | server CPU µs | wall µs |")
    print("|---|---|---|---|")
    medians = [statistics.median(column) for column in zip(*paired, strict=True)]
    quartiles = [statistics.quantiles(column, n=4) for column in zip(*paired, strict=True)]
    print("| median | " + " | ".join(f"{m:+.0f}" for m in medians) + " |")
    print("| 25th–75th percentile | " + " | ".join(f"{q[0]:+.0f} to {q[2]:+.0f}" for q in quartiles) + " |")
    print(f"\n{rounds} rounds of {block} admissions per arm, a new conversation each, tenant/day budget")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--base", type=Path, required=True, help="another checkout (a git worktree)")
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--block", type=int, default=25)
    args = parser.parse_args()
    asyncio.run(main(args.base.resolve(), args.rounds, args.block))
