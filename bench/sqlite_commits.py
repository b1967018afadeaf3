"""How long the SQLite store's commits take, and what that does to a turn's store path (issue 33's
p99 before the first token; bench/ttft.md, "the WAL's checkpoints off the commit path").

Runs ``--turns`` sequential turns through a SQLite store in a temporary directory, each a new
conversation admitted (``admit_turn``, the commit of its input) and ended (``finish_turn``), as
``budget_cost.py``'s off arm does (no budget, no model call), and times every commit of the
writer thread (``SqliteWriter._commit``, wall) and each turn's store path. Prints the
percentiles and how many commits took over 1 ms (a WAL checkpoint inside a commit shows there),
and how many background checkpoints ran. ``--inline`` gives the writer's connection SQLite's
default ``wal_autocheckpoint`` (1,000 pages) and no background checkpoints: the store before them.

    .venv/bin/python bench/sqlite_commits.py [--turns 2000] [--inline]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from budget_cost import SCOPES, _history, _turn
from rich.console import Console
from rich.table import Table

from turnwire.providers import ModelRequest
from turnwire.types import ModelSettings
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.store.sqlite import SqliteStore
from turnwire_server.store.sqlite import writer as sqlite_writer

_COMMITS_MS: list[float] = []


def _timed(commit: Any, inline: bool) -> Any:
    """``SqliteWriter._commit`` timed into :data:`_COMMITS_MS`; with ``inline``, the connection
    set back to SQLite's own checkpoints on its first commit."""

    def timed(self: Any, applies: Any) -> Any:
        if inline and self.checkpoints is not None:
            self._conn.execute("PRAGMA wal_autocheckpoint=1000")
            self.checkpoints = None  # no background checkpoints: the commit's own, as before
        started = time.perf_counter()
        try:
            return commit(self, applies)
        finally:
            _COMMITS_MS.append((time.perf_counter() - started) * 1e3)

    return timed


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--inline", action="store_true", help="SQLite's checkpoints inside commits")
    args = parser.parse_args()
    sqlite_writer.SqliteWriter._commit = _timed(  # type: ignore[method-assign]
        sqlite_writer.SqliteWriter._commit, args.inline
    )
    budgets = BudgetSettings.model_validate({"tenant": SCOPES["tenant"]})  # unused by the off arm
    request = ModelRequest(model="model", system="s", messages=_history(2), settings=ModelSettings())
    turns_ms: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "bench.db")
        await store.open()
        try:
            for n in range(args.turns):
                started = time.perf_counter()
                await _turn(store, "off", 1, request, n, budgets=budgets, read_check=False)
                turns_ms.append((time.perf_counter() - started) * 1e3)
            checkpoints = store._writer.checkpoints
            ran = checkpoints.runs if checkpoints is not None else 0
        finally:
            await store.close()
    how = "checkpoints inside commits" if args.inline else "background checkpoints"
    table = Table(title=f"SQLite store path, {args.turns} turns ({how})")
    for column in ("what", "p50 ms", "p99 ms", "p99.9 ms", "max ms", "over 1 ms"):
        table.add_column(column, justify="right")
    for name, values in (("commit", _COMMITS_MS), ("turn (admission + final write)", turns_ms)):
        table.add_row(
            name,
            *(f"{_quantile(values, q):.3f}" for q in (0.5, 0.99, 0.999)),
            f"{max(values):.3f}",
            f"{sum(1 for v in values if v > 1)} of {len(values)}",
        )
    console = Console(width=120)
    console.print(table)
    console.print(f"background checkpoints run: {ran}")


if __name__ == "__main__":
    asyncio.run(main())
