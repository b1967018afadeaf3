"""Run the Turnwire benchmarks, print their tables and write them to bench/results.md.

    .venv/bin/python bench/run.py            # full run, about 2-3 minutes on 2 cores
    .venv/bin/python bench/run.py --quick    # smoke run, about 30 s
    .venv/bin/python bench/run.py --streams 2000 --skip-memory ...

Today the suite is ``stream_overhead.py`` (Turnwire vs a bare grpc.aio floor:
time to first event, throughput, memory per open stream, text coalescing);
its options are accepted here too (``--help``). Diagnostics that are not part
of the timed suite (``turn_phases.py``) and benchmarks with their own report
(``middleware_chain.py``) run on their own; see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stream_overhead
from _common import BENCH_DIR, Table, machine_summary, print_tables, write_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stream_overhead.add_arguments(parser)
    parser.add_argument(
        "--output", type=Path, default=BENCH_DIR / "results.md", help="markdown file to (over)write"
    )
    args = parser.parse_args()
    opts = stream_overhead.options_from_args(args)
    summary = machine_summary()
    started = time.perf_counter()
    tables: list[Table] = asyncio.run(stream_overhead.run(opts))
    elapsed = time.perf_counter() - started
    print()
    print_tables(tables)
    command = "bench/run.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    header = (
        "# Turnwire benchmark results\n\n"
        f"`{command}` on {time.strftime('%Y-%m-%d %H:%M')}, {summary}; took {elapsed:.0f} s.\n\n"
        f"stream_overhead options: {opts.describe()}.\n\n"
        "Targets: added time to first event <= 1 ms p50 and <= 3 ms p99; events/s at "
        f"{opts.concurrency} concurrent streams >= 70 % of the floor; memory <= 64 KB per open "
        "stream at 5,000 streams. PASS/MISS are reported, not asserted. How to read the "
        "tables: bench/README.md."
    )
    write_markdown(args.output, header, tables)
    print(f"took {elapsed:.0f} s; wrote {args.output}")


if __name__ == "__main__":
    main()
