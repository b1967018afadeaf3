"""What a turn's SQLite writes cost in the sidecar (issue 33): each thread's CPU per turn, and the
writer's statements per turn with their CPU (diagnostic, not in the suite; bench/ttft.md, stop 49).

Runs ``ttft.py``'s upstream and sidecar (SQLite, no middleware) with ``_sql_trace.py`` loaded in
the sidecar, then ``--turns`` turns of ``--deltas`` deltas over ``--streams`` concurrent workers,
each turn a new conversation (``ttft.py --budget``'s load). Two passes: one untraced, for the CPU
per turn of the event loop (the main thread), the SQLite writer, the reader(s) and the rest
(``/proc/<pid>/task/*/schedstat``); one with the writer's statements traced (the trace's own
cost is left out of each statement's, not out of the thread totals, so that pass gives only the
statement table). ``--tree DIR`` runs the sidecar on another checkout's code (its ``server``,
``middleware`` and ``clients/python/src`` first on ``PYTHONPATH``), for a before/after.

    .venv/bin/python bench/sqlite_write_ledger.py [--api anthropic] [--turns 800] [--deltas 64]
        [--streams 16] [--tree /work/main] [--top 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent

import sys  # noqa: E402

sys.path.insert(0, str(BENCH))

from _common import thread_cpu_ns  # noqa: E402
from _ttft_clients import SidecarClient, Upstream, sidecar  # noqa: E402
from _ttft_clients import new_conversation_id as _new_id  # noqa: E402


def _roles(tids: Path, pid: int) -> dict[int, str]:
    roles = {pid: "event loop"}
    for line in tids.read_text().splitlines():
        role, tid = line.split()
        roles.setdefault(int(tid), f"sqlite {role}")
    return roles


async def _load(client: SidecarClient, model: str, turns: int, streams: int) -> None:
    async def worker(count: int) -> None:
        for _ in range(count):
            await client.turn(_new_id(), model)

    await asyncio.gather(*(worker(turns // streams) for _ in range(streams)))


async def _pass(args: argparse.Namespace, upstream: Upstream, traced: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-sqlledger-") as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text("import _sql_trace\n_sql_trace.install()\n")
        out = Path(tmp) / "ledger.json"
        path = [str(site), str(BENCH)]
        if args.tree:
            path += [str(args.tree / sub) for sub in ("server", "middleware", "clients/python/src")]
        os.environ["PYTHONPATH"] = os.pathsep.join(path)
        os.environ["BENCH_SQL_TRACE"] = str(out)
        os.environ["BENCH_SQL_STATEMENTS"] = "1" if traced else "0"
        server = sidecar(Path(tmp), upstream.url, 0)
        await server.start()
        client = SidecarClient(server.target)
        model = f"{args.api}:burst-{args.deltas}"
        try:
            await _load(client, model, 4 * args.streams, args.streams)  # warm-up
            assert server.popen is not None
            pid = server.popen.pid
            before_ns, before = thread_cpu_ns(pid), json.loads(out.read_text()) if traced else {}
            await _load(client, model, args.turns, args.streams)
            await asyncio.sleep(0.3)  # the ledger's next dump is due
            await client.turn(_new_id(), model)  # one more COMMIT: the dump (one turn in ~800)
            after_ns, after = thread_cpu_ns(pid), json.loads(out.read_text()) if traced else {}
            roles = _roles(Path(str(out) + ".tids"), pid)
        finally:
            await client.close()
            server.stop()
    turns = args.turns - args.turns % args.streams
    threads: dict[str, float] = {}
    for tid, ns in after_ns.items():
        role = roles.get(tid, "other threads")
        threads[role] = threads.get(role, 0.0) + (ns - before_ns.get(tid, 0)) / 1e6 / turns
    statements = {
        shape: (
            (count - before.get(shape, [0, 0])[0]) / turns,
            (ns - before.get(shape, [0, 0])[1]) / 1e3 / turns,
        )
        for shape, (count, ns) in after.items()
    }
    return {"threads": threads, "statements": statements, "turns": turns}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=("openai", "anthropic"), default="anthropic")
    parser.add_argument("--turns", type=int, default=800)
    parser.add_argument("--deltas", type=int, default=64)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--tree", type=Path, help="run the sidecar on this checkout's code")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    upstream = Upstream()
    try:
        cpu = await _pass(args, upstream, traced=False)
        trace = await _pass(args, upstream, traced=True)
    finally:
        upstream.close()
    print(
        f"{args.api}, {cpu['turns']} turns of {args.deltas} deltas over {args.streams} stream(s),"
        f" code: {args.tree or 'this checkout'}\n"
    )
    print("| thread | CPU ms per turn |\n|---|---|")
    threads = cpu["threads"]
    assert isinstance(threads, dict)
    for role, ms in sorted(threads.items(), key=lambda item: -item[1]):
        print(f"| {role} | {ms:.3f} |")
    print(f"| all | {sum(threads.values()):.3f} |\n")
    statements = trace["statements"]
    assert isinstance(statements, dict)
    total_count = sum(count for count, _ in statements.values())
    total_us = sum(us for _, us in statements.values())
    print(f"writer statements per turn: {total_count:.1f}, {total_us:.0f} µs (traced pass)\n")
    print("| per turn | µs per turn | statement (to the next one traced) |\n|---|---|---|")
    for shape, (count, us) in sorted(statements.items(), key=lambda item: -item[1][1])[: args.top]:
        if count:
            print(f"| {count:.2f} | {us:.1f} | `{shape}` |")


if __name__ == "__main__":
    asyncio.run(main())
