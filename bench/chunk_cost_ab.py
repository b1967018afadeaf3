"""Server CPU per request and per streamed chunk of two sidecar builds, interleaved (an A/B).

Issue 33's per-chunk figures, for comparing a change with the code before it on a shared, loaded
machine: two ``ttft.py`` sidecars (no middleware, SQLite, a new conversation per request) on one
local upstream (``_upstream.py``), A started with ``--base`` (a source tree's ``server/``
directory, e.g. a ``git archive`` of ``main``) first on ``PYTHONPATH``, B with this checkout.
Each round runs, per API and for each build in turn (the order alternating from round to round),
``--requests`` sequential turns of ``burst-4`` and of ``burst-N`` (``--deltas``) answers, and a
``--window`` of 16 streams of ``burst-64`` answers. Measured: the sidecar's CPU (all its threads,
``/proc/<pid>/task/*/schedstat``, ns) per request, the slope between the two answer lengths (CPU
per extra chunk: the turn's fixed cost is not divided into it) and, at 16 streams, the CPU per
delta and deltas/s. Medians over the rounds and the median of the rounds' B-A differences (each
round measures both builds within seconds, so a drift of the machine's load falls on both).

    .venv/bin/python bench/chunk_cost_ab.py --base /tmp/main-snapshot/server [--rounds 6]
        [--requests 30] [--deltas 200] [--window 2] [--apis openai,anthropic]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import tempfile
from pathlib import Path

from _common import ServerProcess, Table, cpu_seconds_of, print_tables
from _ttft_budget import _arm, _rate
from _ttft_clients import SidecarClient, Upstream, new_conversation_id, sidecar

SHORT = 4
STREAMS = 16
RATE_DELTAS = 64
BUILDS = ("A", "B")


async def _start(workdir: Path, upstream: str, name: str, pythonpath: str | None) -> ServerProcess:
    """A ``ttft.py`` sidecar in ``workdir/name`` started with ``pythonpath`` first on PYTHONPATH."""
    home = workdir / name
    home.mkdir()
    saved = os.environ.get("PYTHONPATH")
    if pythonpath:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, saved]))
    try:
        server = sidecar(home, upstream, 0)
        await server.start()
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    return server


Rows = dict[str, dict[str, dict[str, list[float]]]]
"""figure -> API -> build -> one value per round."""


async def _measure(
    rows: Rows,
    build: str,
    api: str,
    server: ServerProcess,
    *,
    client: SidecarClient,
    args: argparse.Namespace,
) -> None:
    """One build's figures for one API in one round, added to ``rows``."""
    assert server.popen is not None
    cpu = functools.partial(cpu_seconds_of, server.popen.pid)

    async def turn(model: str) -> tuple[float, int]:
        return await client.turn(new_conversation_id(), f"{api}:{model}")

    def add(figure: str, value: float) -> None:
        rows.setdefault(figure, {}).setdefault(api, {b: [] for b in BUILDS})[build].append(value)

    short = await _arm(turn, f"burst-{SHORT}", args.requests, cpu)
    long = await _arm(turn, f"burst-{args.deltas}", args.requests, cpu)
    rate, per_delta = await _rate(turn, f"burst-{RATE_DELTAS}", STREAMS, args.window, cpu)
    add("CPU ms/request, 4 deltas", short.cpu_per_request * 1e3)
    add(f"CPU ms/request, {args.deltas} deltas", long.cpu_per_request * 1e3)
    add("CPU µs/chunk (slope)", (long.cpu_per_request - short.cpu_per_request) / (args.deltas - SHORT) * 1e6)
    add("CPU µs/delta at 16 streams", per_delta * 1e6)
    add("deltas/s at 16 streams", rate)


async def _rounds(args: argparse.Namespace, upstream: str, workdir: Path) -> Rows:
    rows: Rows = {}
    apis = args.apis.split(",")
    servers = {
        "A": await _start(workdir, upstream, "a", args.base),
        "B": await _start(workdir, upstream, "b", None),
    }
    clients = {build: SidecarClient(server.target) for build, server in servers.items()}
    try:
        for build in BUILDS:  # warm-up: connections, first-call costs
            for api in apis:
                for deltas in (SHORT, args.deltas, RATE_DELTAS):
                    for _ in range(5):
                        await clients[build].turn(new_conversation_id(), f"{api}:burst-{deltas}")
        for number in range(args.rounds):
            order = BUILDS if number % 2 == 0 else BUILDS[::-1]
            for api in apis:
                for build in order:
                    await _measure(rows, build, api, servers[build], client=clients[build], args=args)
            print(f"  [round {number + 1}/{args.rounds} done]", file=sys.stderr, flush=True)
    finally:
        for client in clients.values():
            await client.close()
        for server in servers.values():
            server.stop()
    return rows


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the A build's server/ directory (first on PYTHONPATH)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--window", type=float, default=2.0)
    parser.add_argument("--apis", default="openai,anthropic")
    args = parser.parse_args()
    # A whole tree's packages: "OLD/server:OLD/middleware:OLD/clients/python/src" (os.pathsep-separated).
    args.base = os.pathsep.join(str(Path(part).resolve()) for part in args.base.split(os.pathsep))
    return args


async def main(args: argparse.Namespace) -> None:
    """Run the rounds, print the table (and its markdown)."""
    upstream = Upstream()
    try:
        with tempfile.TemporaryDirectory(prefix="turnwire-bench-ab-") as tmp:
            rows = await _rounds(args, upstream.url, Path(tmp))
    finally:
        upstream.close()
    table = Table(
        f"A/B, {args.rounds} interleaved rounds: A = {args.base}, B = this checkout (medians)",
        ["API", "figure", "A", "B", "B-A (median of rounds)", "B/A"],
    )
    for figure, per_api in rows.items():
        for api, values in per_api.items():
            a, b = statistics.median(values["A"]), statistics.median(values["B"])
            diff = statistics.median(vb - va for va, vb in zip(values["A"], values["B"], strict=True))
            table.add(api, figure, f"{a:,.2f}", f"{b:,.2f}", f"{diff:+,.2f}", f"{b / a:.2f}x" if a else "")
    print_tables([table])
    print(table.to_markdown())


if __name__ == "__main__":
    asyncio.run(main(_options()))
