"""Run the Turnwire benchmarks, print their tables and write them all to bench/results.md.

    .venv/bin/python bench/run.py            # full run, about 4 minutes on 2 cores
    .venv/bin/python bench/run.py --quick    # smoke run, about 1.5 minutes
    .venv/bin/python bench/run.py --streams 2000 --skip-memory --skip-middleware ...

The suite, in this order:

* ``stream_overhead.py`` (Turnwire vs a bare grpc.aio floor: time to first
  event, throughput, CPU per event, memory per open stream, text coalescing),
  run in this process; its options are accepted here too (``--help``);
* ``middleware_chain.py`` (the middleware chain's cost per chunk and per turn),
  ``provider_adapters.py`` (provider adapters vs the bare SDKs), ``cloud_providers.py`` (Bedrock,
  Vertex AI and Gemini vs the Anthropic adapter),
  ``slow_readers.py`` (server memory per stream for readers that stop reading or
  read slowly, and the stuck turns stopped), ``remote_hooks.py`` (a remote
  hook server and tool host, the Node.js example, vs in process), ``observability.py`` (time
  to first token and events/s with traces on vs off) and ``workers.py`` (``serve --workers``: CPU
  per request and throughput with 1 and 2 workers, on PostgreSQL), ``ttft.py`` and ``memory_soak.py``
  (the server's RSS over 10,000 conversations, issue 32 item 11; ~20 min), each in its own process as when
  run alone, with their defaults (``--quick``: fewer rounds, requests and
  readers); they hand their tables back as JSON (``--json``).

The diagnostic ``turn_phases.py`` is not part of the suite; see bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import stream_overhead
from _common import (
    BENCH_DIR,
    PYTHON,
    REPO,
    Table,
    machine_summary,
    print_tables,
    read_tables_json,
    wait_for_quiet,
    write_markdown,
)


@dataclass(frozen=True)
class Suite:
    """A benchmark that runs in its own process and hands its tables back with ``--json PATH``."""

    script: str
    skip_option: str
    full: tuple[str, ...]  # its options in a full run (none: its own defaults)
    quick: tuple[str, ...]  # its options with --quick

    def argv(self, quick: bool) -> list[str]:
        return [f"bench/{self.script}", *(self.quick if quick else self.full)]


SUITES = (
    Suite(
        "middleware_chain.py",
        "--skip-middleware",
        full=(),
        quick=("--rounds", "3", "--turns", "10", "--isolated-chunks", "20000"),
    ),
    Suite("provider_adapters.py", "--skip-providers", full=(), quick=("--requests", "10")),
    Suite("cloud_providers.py", "--skip-cloud-providers", full=(), quick=("--requests", "10")),
    Suite("slow_readers.py", "--skip-slow-readers", full=(), quick=("--quick",)),
    Suite("remote_hooks.py", "--skip-remote-hooks", full=(), quick=("--rounds", "3", "--turns", "10")),
    Suite("observability.py", "--skip-observability", full=(), quick=("--quick",)),
    Suite("workers.py", "--skip-workers", full=(), quick=("--quick",)),
    Suite("ttft.py", "--skip-ttft", full=(), quick=("--quick",)),
    Suite("memory_soak.py", "--skip-memory-soak", full=(), quick=("--quick",)),
)


def run_suite(suite: Suite, quick: bool) -> tuple[list[Table], str]:
    """Run ``suite`` in its own process; its tables, and a line for the header."""
    argv = suite.argv(quick)
    asyncio.run(wait_for_quiet(max_wait=1.0 if quick else 5.0))
    print(f"[run] {' '.join(argv)}", file=sys.stderr, flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-run-") as tmp:
        out = Path(tmp) / "tables.json"
        code = subprocess.run([PYTHON, *argv, "--json", str(out)], cwd=REPO, check=False).returncode
        tables = read_tables_json(out) if code == 0 and out.exists() else []
    elapsed = time.perf_counter() - started
    options = " ".join(argv[1:]) or "its defaults"
    if not tables:
        print(f"[run] {suite.script} FAILED (exit status {code})", file=sys.stderr, flush=True)
        return [], f"`{suite.script}` ({options}) FAILED with exit status {code}: no tables."
    return tables, f"`{suite.script}` ({options}) took {elapsed:.0f} s."


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stream_overhead.add_arguments(parser)
    for suite in SUITES:
        parser.add_argument(suite.skip_option, action="store_true", help=f"do not run {suite.script}")
    parser.add_argument(
        "--output", type=Path, default=BENCH_DIR / "results.md", help="markdown file to (over)write"
    )
    args = parser.parse_args()
    opts = stream_overhead.options_from_args(args)
    summary = machine_summary()
    started = time.perf_counter()
    tables: list[Table] = asyncio.run(stream_overhead.run(opts))
    lines = [f"`stream_overhead.py` ({opts.describe()}) took {time.perf_counter() - started:.0f} s."]
    failed = False
    for suite in SUITES:
        if getattr(args, suite.skip_option.lstrip("-").replace("-", "_")):
            continue
        suite_tables, line = run_suite(suite, args.quick)
        tables += suite_tables
        lines.append(line)
        failed = failed or not suite_tables
    elapsed = time.perf_counter() - started
    print()
    print_tables(tables)
    command = "bench/run.py" + (" " + " ".join(sys.argv[1:]) if sys.argv[1:] else "")
    header = (
        "# Turnwire benchmark results\n\n"
        f"`{command}` on {time.strftime('%Y-%m-%d %H:%M')}, {summary}; took {elapsed:.0f} s.\n\n"
        + "".join(f"- {line}\n" for line in lines)
        + "\nTargets: added time to first event <= 1 ms p50 and <= 3 ms p99; events/s at "
        f"{opts.concurrency} concurrent streams >= 70 % of the floor; memory <= 64 KB per open "
        "stream at 5,000 streams; the middleware chain's, the provider adapters' and the slow "
        "readers' targets are in their tables. PASS/MISS are reported, not asserted. How to read "
        "the tables: bench/README.md."
    )
    write_markdown(args.output, header, tables)
    print(f"took {elapsed:.0f} s; wrote {args.output}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
