"""The SQLite store's writes for submissions (docs/semantics.md §7).

Same conventions as :mod:`turnwire_server.store.sqlite.writes`: each ``*_write`` validates in
the caller's task and returns a :data:`WriteFn` the writer thread runs inside its batch
transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, Final, get_args

from turnwire_server.store.base import SubmissionRecord, SubmissionState
from turnwire_server.store.core.rows import to_us
from turnwire_server.store.core.submission_rows import SUBMISSION_COLUMNS, submission_from_row
from turnwire_server.store.core.submission_rules import repeated_submission
from turnwire_server.store.errors import TooManySubmissions
from turnwire_server.store.sqlite.db import WriteFn

__all__ = [
    "claim_submissions_write",
    "create_submission_write",
    "end_submission_write",
    "expire_submissions_write",
]

_SUBMISSION_STATES: Final[frozenset[str]] = frozenset(get_args(SubmissionState))
_OPEN: Final = ("pending", "running")


def _select(conn: sqlite3.Connection, where: str, params: tuple[Any, ...]) -> SubmissionRecord | None:
    row = conn.execute(f"SELECT {SUBMISSION_COLUMNS} FROM submissions WHERE {where}", params).fetchone()
    return None if row is None else submission_from_row(row)


def create_submission_write(
    submission: SubmissionRecord, max_open: int, result: Callable[[SubmissionRecord, bool], None]
) -> WriteFn:
    """The write of ``Store.create_submission``; hands ``(record, created)`` to ``result`` on
    the writer thread (the caller reads it once the write committed).

    Idempotency (docs/semantics.md §7): the same id, or the same (conversation, key), with the
    same request returns the stored record; the id and the key naming different submissions,
    or the id with another request or conversation, raises :class:`SubmissionConflict`.
    """
    if submission.state != "pending":
        raise ValueError(f"a new submission is pending, not {submission.state!r}")
    create_us = to_us(submission.create_time, "create_time")

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        by_id = _select(conn, "id = ?", (submission.submission_id,))
        by_key = (
            _select(
                conn,
                "conversation_id = ? AND idempotency_key = ?",
                (submission.conversation_id, submission.idempotency_key),
            )
            if submission.idempotency_key
            else None
        )
        existing = repeated_submission(submission, by_id, by_key)
        if existing is not None:
            result(existing, False)
            return
        waiting = conn.execute(
            "SELECT COUNT(*) FROM submissions WHERE conversation_id = ? AND state IN ('pending', 'running')",
            (submission.conversation_id,),
        ).fetchone()[0]
        if waiting >= max_open:
            raise TooManySubmissions(submission.conversation_id, max_open)
        seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM submissions").fetchone()[0]
        conn.execute(
            "INSERT INTO submissions (id, conversation_id, idempotency_key, state, request, seq, create_time,"
            " owner, lease_until) VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?)",
            (
                submission.submission_id,
                submission.conversation_id,
                submission.idempotency_key or None,
                submission.request,
                seq,
                create_us,
                submission.owner or None,
                None if submission.lease_until is None else to_us(submission.lease_until, "lease_until"),
            ),
        )
        stored = _select(conn, "id = ?", (submission.submission_id,))
        assert stored is not None
        result(stored, True)

    return apply


def end_submission_write(
    submission_id: str,
    state: SubmissionState,
    error: bytes | None,
    only_from: Sequence[str],
    result: Callable[[SubmissionRecord | None], None],
) -> WriteFn:
    """The write of ``Store.end_submission``; hands the record as stored afterwards to ``result``."""
    if state not in _SUBMISSION_STATES:
        raise ValueError(f"unknown submission state {state!r}")
    allowed = tuple(only_from)
    marks = ", ".join("?" * len(allowed)) or "NULL"

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        conn.execute(
            f"UPDATE submissions SET state = ?, end_time = ?, error = ? WHERE id = ? AND state IN ({marks})",
            (state, now_us, error, submission_id, *allowed),
        )
        result(_select(conn, "id = ?", (submission_id,)))

    return apply


def expire_submissions_write(
    before_us: int, limit: int, error: bytes, result: Callable[[list[str]], None]
) -> WriteFn:
    """The write of ``Store.expire_submissions``: up to ``limit`` pending submissions accepted
    before ``before_us`` end ``error`` with ``error``; hands their ids to ``result``."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")

    def apply(conn: sqlite3.Connection, now_us: int) -> None:
        ids = [
            row[0]
            for row in conn.execute(
                "SELECT id FROM submissions WHERE state = 'pending' AND create_time < ? ORDER BY seq LIMIT ?",
                (before_us, limit),
            )
        ]
        conn.executemany(
            "UPDATE submissions SET state = 'error', end_time = ?, error = ?"
            " WHERE id = ? AND state = 'pending'",
            [(now_us, error, submission_id) for submission_id in ids],
        )
        result(ids)

    return apply


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
