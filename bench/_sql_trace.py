"""Bench-only instrumentation of a sidecar's SQLite connections (``sqlite_write_ledger.py``),
loaded in the sidecar by a generated ``sitecustomize`` when ``BENCH_SQL_TRACE`` names an output
path (the sidecar's environment drops ``TURNWIRE_*`` variables).

It wraps ``sqlite3.connect``: each connection's thread id goes to ``<path>.tids`` (``writer`` for
the store's writer thread, ``reader`` otherwise), so the driver reads each thread's CPU from
``/proc``. With ``BENCH_SQL_STATEMENTS=1`` the writer's connection also gets a trace callback
that charges the writer thread's CPU from one traced statement to the next (a trigger's
sub-program is traced as ``-- TRIGGER name``) to the earlier one, by statement shape, and writes
the totals as JSON to ``<path>`` at most every 0.2 s, at a COMMIT.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
import time
from typing import Any

_LITERALS = re.compile(r"'(?:[^']|'')*'|X'[0-9A-Fa-f]*'|\b\d+\b")


def _shape(sql: str) -> str:
    """The statement without its values, whitespace folded, cut to 90 characters."""
    return " ".join(_LITERALS.sub("?", sql).split())[:90]


class _Ledger:
    def __init__(self, path: str) -> None:
        self.path = path
        self.totals: dict[str, list[int]] = {}
        self.last: str | None = None
        self.last_ns = 0
        self.dumped = 0.0

    def trace(self, sql: str) -> None:
        now = time.thread_time_ns()
        if self.last is not None:
            entry = self.totals.setdefault(self.last, [0, 0])
            entry[0] += 1
            entry[1] += now - self.last_ns
        key = _shape(sql)
        if key == "COMMIT" and time.monotonic() - self.dumped > 0.2:
            self.dumped = time.monotonic()
            with open(self.path + ".tmp", "w") as out:
                json.dump(self.totals, out)
            os.replace(self.path + ".tmp", self.path)
        self.last, self.last_ns = key, time.thread_time_ns()


def install() -> None:
    """Wrap ``sqlite3.connect`` as the module docstring says (nothing without ``BENCH_SQL_TRACE``)."""
    path = os.environ.get("BENCH_SQL_TRACE")
    if not path:
        return
    statements = os.environ.get("BENCH_SQL_STATEMENTS") == "1"
    connect = sqlite3.connect

    def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        role = "writer" if threading.current_thread().name.startswith("sqlite-store-writer") else "reader"
        with open(path + ".tids", "a") as out:
            out.write(f"{role} {threading.get_native_id()}\n")
        if statements and role == "writer":
            conn.set_trace_callback(_Ledger(path).trace)
        return conn

    sqlite3.connect = traced  # type: ignore[assignment]
