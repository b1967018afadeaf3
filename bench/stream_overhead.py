"""Streaming overhead of Turnwire over a bare grpc.aio floor, measured in the same run.

Workload: the scripted provider streams one text block of N deltas (default
200 deltas of 4 characters, no delay), so a turn is N + 6 events: TurnStart,
StepStart, TextStart, N x TextDelta, TextEnd, StepFinish, TurnEnd (with the
stored message). The floor (``bench/floor_server.py``) streams the same N + 6
pre-built ``ChatResponse`` messages, of the same shapes and sizes, from a
bare grpc.aio server.

Every server runs in its own process (Turnwire as ``python -m turnwire_server serve
--config ...`` with SQLite in a temp dir); this process is the client. The
servers under test are started together and measured in turn, interleaved
round by round (floor, Turnwire, Turnwire+coalescing, floor, ...), so drift
and other load on the machine hit them alike; while one is measured the
others are idle. The client does not deserialize responses in the timing
runs (raw bytes; the same client for the floor and Turnwire); the
correctness runs parse every event and check the reconstructed text.

Measured:
  (a) time to first event (call start -> first message), sequential turns, a
      new conversation per turn; p50/p99 floor vs Turnwire and the difference;
  (b) events/s with 1, 10 and C concurrent streams (each stream runs turns
      back to back, each turn on its own new conversation), with the server's
      CPU time per event (psutil), the client's and the rest of the machine's
      CPU use, and the time to first event under that load;
  (c) server RSS per open stream: S concurrent Chat calls held open by a
      script with a one-hour delay_ms, measured on a fresh server process;
      the floor holding S calls gives gRPC's own share; the streams are then
      closed and opened again (a leak would show as growth);
  (d) the throughput rows with ``events.text_coalesce_ms: 2``, and the
      reconstructed text checked against the script's text, also with a paced
      script (0.5 ms between deltas) where only some deltas merge.

Run alone (``python bench/stream_overhead.py [--quick] [--streams N]``) or via
``bench/run.py``. This module runs the servers and the measurements in order;
the measurements themselves are in ``_stream_measure.py``, the tables in
``_stream_tables.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BENCH_DIR,
    PACED_DELAY_MS,
    PACED_MODEL,
    QuietGate,
    ServerProcess,
    Table,
    machine_summary,
    print_tables,
    stream_text,
    write_markdown,
)
from _stream_measure import (
    FLOOR,
    TURNWIRE,
    Options,
    Results,
    check_streams,
    memory_per_stream,
    throughput,
    time_to_first_event,
)
from _stream_tables import tables


async def run(opts: Options) -> list[Table]:
    """Run every measurement; return the result tables."""
    started = time.perf_counter()
    res = Results(opts)
    expected = stream_text(opts.deltas, opts.chunk_size)
    coalesced = f"turnwire coalesce {opts.coalesce_ms:g} ms"
    factories: dict[str, Callable[[Path], ServerProcess]] = {
        FLOOR: lambda d: ServerProcess.floor(d, deltas=opts.deltas, chunk_size=opts.chunk_size),
        TURNWIRE: lambda d: ServerProcess.turnwire(d, deltas=opts.deltas, chunk_size=opts.chunk_size),
        coalesced: lambda d: ServerProcess.turnwire(
            d, deltas=opts.deltas, chunk_size=opts.chunk_size, coalesce_ms=opts.coalesce_ms
        ),
    }
    quiet = QuietGate(opts.quiet_budget)
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-") as tmp:
        root = Path(tmp)
        servers: dict[str, ServerProcess] = {}
        try:
            for index, (name, make) in enumerate(factories.items()):
                workdir = root / f"s{index}"
                workdir.mkdir()
                servers[name] = make(workdir)
                _log(f"starting {name}: {' '.join(servers[name].argv[1:])}")
                await servers[name].start()
                process = servers[name].ps
                assert process is not None
                quiet.exclude.append(process)
            # (a) interleaved: floor, turnwire, floor, turnwire ...
            per_round = max(1, opts.ttfe_turns // opts.rounds)
            ttfe_servers = [FLOOR, TURNWIRE]
            for r in range(opts.rounds):
                for name in ttfe_servers:
                    _log(f"(a) {name}: time to first event, {per_round} sequential turns, round {r + 1}")
                    warmup = opts.warmup_turns if r == 0 else 5
                    await quiet()
                    res.ttfe.setdefault(name, []).extend(
                        await time_to_first_event(servers[name].target, per_round, warmup, f"a{r}")
                    )
            # (b)/(d) interleaved by round and concurrency level
            for r in range(opts.rounds):
                for streams in opts.levels:
                    for name, server in servers.items():
                        _log(f"(b) {name}: {streams} stream(s), {opts.window:g} s window, round {r + 1}")
                        await quiet()
                        res.tput.setdefault((name, streams), []).append(
                            await throughput(server, streams, opts, f"b{r}", coalesced=name == coalesced)
                        )
            res.quiet_waited, res.noisy = quiet.waited, quiet.noisy
            res.measurements = opts.rounds * (len(ttfe_servers) + len(opts.levels) * len(servers))
            # correctness
            _log("checking the streams")
            res.checks[FLOOR] = await check_streams(
                servers[FLOOR].target, expected, turns=20, concurrency=10, tag="c"
            )
            for name in (TURNWIRE, coalesced):
                target = servers[name].target
                res.checks[name] = await check_streams(
                    target, expected, turns=opts.verify_turns, concurrency=opts.concurrency, tag="c"
                )
                res.checks[f"{name}, paced {PACED_DELAY_MS:g} ms"] = await check_streams(
                    target,
                    expected,
                    turns=opts.verify_turns,
                    concurrency=opts.concurrency,
                    tag="p",
                    model=PACED_MODEL,
                )
        finally:
            for server in servers.values():
                server.stop()
        # (c) on fresh processes, one at a time
        if not opts.skip_memory:
            for index, name in enumerate((FLOOR, TURNWIRE)):
                workdir = root / f"m{index}"
                workdir.mkdir()
                server = factories[name](workdir)
                await server.start()
                try:
                    _log(f"(c) {name}: memory, {opts.streams} open streams")
                    res.mem[name] = await memory_per_stream(server, opts.streams, name)
                finally:
                    server.stop()
    res.seconds = time.perf_counter() - started
    return tables(res, coalesced)


def _log(message: str) -> None:
    print(f"[stream_overhead] {message}", file=sys.stderr, flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: fewer turns, 1 s windows, 1,000 held streams"
    )
    parser.add_argument("--streams", type=int, help="open streams for (c) (default 5000, quick 1000)")
    parser.add_argument("--deltas", type=int, help="text deltas per turn (default 200)")
    parser.add_argument("--chunk-size", type=int, help="characters per delta (default 4)")
    parser.add_argument("--levels", help="concurrent streams for (b), comma-separated (default 1,10,100)")
    parser.add_argument("--ttfe-turns", type=int, help="sequential turns for (a) (default 200)")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 2)")
    parser.add_argument("--window", type=float, help="seconds measured per throughput row and round")
    parser.add_argument("--skip-memory", action="store_true", help="skip (c)")


def options_from_args(args: argparse.Namespace) -> Options:
    opts = Options.quick() if args.quick else Options()
    for key in ("streams", "deltas", "chunk_size", "ttfe_turns", "rounds", "window"):
        value = getattr(args, key, None)
        if value is not None:
            setattr(opts, key, value)
    if getattr(args, "levels", None):
        opts.levels = tuple(int(x) for x in args.levels.split(","))
    opts.skip_memory = bool(getattr(args, "skip_memory", False))
    return opts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    opts = options_from_args(parser.parse_args())
    result_tables = asyncio.run(run(opts))
    print_tables(result_tables)
    header = (
        "# stream_overhead results\n\n"
        f"`python bench/stream_overhead.py` ({opts.describe()}); {machine_summary()}."
    )
    write_markdown(BENCH_DIR / "results.md", header, result_tables)


if __name__ == "__main__":
    main()
