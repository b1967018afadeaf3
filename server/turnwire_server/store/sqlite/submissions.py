"""The SQLite store's own write for submissions (docs/semantics.md §7): claiming those a dead
owner held (the others are :mod:`turnwire_server.store.core.submission_writes`).

Same conventions as :mod:`turnwire_server.store.sqlite.writes`: each ``*_write`` validates in
the caller's task and returns a :data:`WriteFn` the writer thread runs inside its batch
transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, Final, get_args

from turnwire_server.store.base import SubmissionRecord, SubmissionState
from turnwire_server.store.core.submission_rows import SUBMISSION_COLUMNS, submission_from_row
from turnwire_server.store.sqlite.db import WriteFn

__all__ = [
    "claim_submissions_write",
]

_SUBMISSION_STATES: Final[frozenset[str]] = frozenset(get_args(SubmissionState))
_OPEN: Final = ("pending", "running")


def _select(conn: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> SubmissionRecord | None:
    row = conn.execute(f"SELECT {SUBMISSION_COLUMNS} FROM submissions WHERE {where}", params).fetchone()
    return None if row is None else submission_from_row(row)


def claim_submissions_write(
    owner: str, lease_until_us: int, limit: int, result: Callable[[list[str]], None]
) -> WriteFn:
    """The write of ``SqliteStore.claim_pending_submissions``: pending submissions another owner
    holds get ``owner`` (one process per SQLite file: those owners are dead)."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM submissions WHERE state = 'pending' AND (owner IS NULL OR owner != ?)"
                " ORDER BY seq LIMIT ?",
                (owner, limit),
            )
        ]
        conn.executemany(
            "UPDATE submissions SET owner = ?, lease_until = ? WHERE id = ?",
            [(owner, lease_until_us, submission_id) for submission_id in ids],
        )
        result(ids)

    return apply
