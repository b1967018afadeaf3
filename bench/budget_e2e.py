"""What budgets (issue 37, docs/cost.md "Budgets") add to a request end to end: the server CPU of a
real ``turnwire serve`` per Chat turn, budgets off against budgets on.

``budget_cost.py`` runs the store programs and the engine's budget functions in process; this
runs the whole server, so the engine's part around them is in (``TurnEngine.start`` waiting for
the admission's answer, ``StepBudgets`` in the step loop, the settlement in the final write).
Sidecars on one local upstream (``_upstream.py``, the official SDKs' wire), each SQLite in its
own directory, demo tools off, no middleware (``ttft.py``'s sidecar), 4-delta answers:

- **off**: no budget configured;
- **tenant**: the tenant's day, in tokens and US dollars;
- **all**: the turn's, the conversation's and the tenant's day, in tokens and US dollars.

The models are priced in the config (a dollar budget needs a price). Each request is a Chat turn
on a new conversation from a gRPC client in this process, sequential; blocks of ``--block``
requests per arm, each on a sidecar process of its own (started for the block, warmed by 20
turns), ``--rounds`` rounds, each round in another order of arms. A figure is the
median over the blocks of the sidecar's CPU (``/proc``'s schedstat, in ns: every thread; and its
main thread's, the event loop, apart: the rest is the SQLite writer's and reader's threads and
gRPC's) per request; the added CPU of an arm is its figure minus off's, PASS when at most 0.3 ms
(the allowance). Sidecar processes running the same code differ by up to ~8 % a request on a
shared VM (bench/budget_cost.md, 2026-12-05): read differences of tens of µs from
``budget_cost.py``'s in-process arms, not from this.

    .venv/bin/python bench/budget_e2e.py [--rounds 12] [--block 50] [--api openai]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ServerProcess, thread_cpu_ns
from _ttft_clients import SidecarClient, Upstream, new_conversation_id, upstream_sidecar

ALLOWANCE_US = 300.0
MODEL = "burst-4"
PRICES = "pricing:\n  models:\n" + "".join(
    f"    {api}:{MODEL}: {{input_mtok: 3.0, output_mtok: 15.0}}\n" for api in ("openai", "anthropic")
)
BIG = "{tokens: 1000000000000, usd: 1000000000.0}"
ARMS: dict[str, str] = {
    "off": "",
    "tenant": f"budgets:\n  tenant:\n    day: {BIG}\n",
    "all": f"budgets:\n  turn: {BIG}\n  conversation: {BIG}\n  tenant:\n    day: {BIG}\n",
}


def _cpu(server: ServerProcess) -> tuple[float, float]:
    """CPU seconds of the sidecar's threads alive now, and of its main thread (its event loop),
    from ``/proc/<pid>/task/<tid>/schedstat`` (time on a CPU, counted in ns): ``/proc``'s user
    and system times count 10 ms ticks, 67 µs a request over a block of 150, too coarse for the
    differences measured here. The threads live as long as the process (the store's,
    gRPC's), so none ends within a block."""
    assert server.ps is not None
    threads = thread_cpu_ns(server.ps.pid)
    return sum(threads.values()) / 1e9, threads.get(server.ps.pid, 0) / 1e9


async def _block(
    server: ServerProcess, client: SidecarClient, model: str, requests: int
) -> tuple[float, float]:
    """µs of the sidecar's CPU per request over ``requests`` sequential turns: all its threads',
    and its event loop's."""
    before, loop_before = _cpu(server)
    for _ in range(requests):
        await client.turn(new_conversation_id(), model)
    after, loop_after = _cpu(server)
    return (after - before) / requests * 1e6, (loop_after - loop_before) / requests * 1e6


async def _sidecar_block(
    home: Path, upstream: Upstream, arm: str, model: str, args: argparse.Namespace
) -> tuple[float, float]:
    """One block of ``arm`` on a sidecar of its own (a new process each block, so one process's
    luck, its memory layout or its threads' placement, falls on every arm alike), after a warm-up
    (connections, first calls, the estimates of a step sent)."""
    home.mkdir()  # noqa: ASYNC240 (a bench's setup, outside the measured block)
    server, _ = upstream_sidecar(home, upstream.url, model, PRICES + ARMS[arm], f"budget-{arm}")
    await server.start(startup_seconds=600)
    client = SidecarClient(server.target)
    try:
        await _block(server, client, model, 20)
        return await _block(server, client, model, args.block)
    finally:
        await client.close()
        server.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=int, default=50, help="requests per arm in a row")
    parser.add_argument("--api", choices=("openai", "anthropic"), default="openai")
    args = parser.parse_args()
    model = f"{args.api}:{MODEL}"
    upstream = Upstream()
    samples: dict[str, list[float]] = {arm: [] for arm in ARMS}
    loops: dict[str, list[float]] = {arm: [] for arm in ARMS}
    names = list(ARMS)
    try:
        with tempfile.TemporaryDirectory(prefix="turnwire-budget-e2e-") as tmp:
            for r in range(args.rounds):
                for arm in names[r % len(names) :] + names[: r % len(names)]:
                    home = Path(tmp) / f"{arm}-{r}"
                    total, loop = await _sidecar_block(home, upstream, arm, model, args)
                    samples[arm].append(total)
                    loops[arm].append(loop)
    finally:
        upstream.close()
    off, off_loop = statistics.median(samples["off"]), statistics.median(loops["off"])
    print(
        "| budgets | server CPU µs/request | added µs/request | of it, event loop | of it, other threads "
        "| ≤ 300 µs |"
    )
    print("|---|---|---|---|---|---|")
    for arm in ARMS:
        value, loop = statistics.median(samples[arm]), statistics.median(loops[arm])
        if arm == "off":
            print(f"| off | {value:,.0f} (loop {loop:,.0f}) | – | – | – | – |")
            continue
        added, loop_added = value - off, loop - off_loop
        verdict = "PASS" if added <= ALLOWANCE_US else "MISS"
        print(
            f"| {arm} | {value:,.0f} | {added:,.0f} | {loop_added:,.0f} | {added - loop_added:,.0f} "
            f"| {verdict} |"
        )
    print(
        f"\n{args.api}, {MODEL} answers, a new conversation per request, sequential; medians of "
        f"{args.rounds} interleaved blocks of {args.block} requests per arm; load average "
        f"{os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
