"""The writes of submissions (docs/semantics.md §7), once for both drivers (core programs,
:mod:`turnwire_server.store.core.sql`): ``Store.create_submission``, ``Store.end_submission``
and ``Store.expire_submissions``. What only PostgreSQL has (the global acceptance lock, the
cross-replica queue tickets and their notifications) is its dialect's statements in the same
transaction; SQLite's in-process places are the store's (:class:`~.writes.CoreWrites`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, get_args

from turnwire_server.store.core.rows import to_us
from turnwire_server.store.core.sql import Dialect, Program, Statement, in_marks
from turnwire_server.store.core.submission_rows import SUBMISSION_COLUMNS, submission_from_row
from turnwire_server.store.core.submission_rules import repeated_submission
from turnwire_server.store.core.webhook_writes import deliveries_on_end
from turnwire_server.store.errors import TooManySubmissions
from turnwire_server.store.records import SubmissionRecord, SubmissionState

__all__ = [
    "OPEN",
    "check_end",
    "check_new",
    "create_submission",
    "end_submission",
    "expire_submissions",
]

OPEN: Final = ("pending", "running")
"""The states of a submission that has not ended."""

_STATES: Final[frozenset[str]] = frozenset(get_args(SubmissionState))
_BY_ID: Final = f"SELECT {SUBMISSION_COLUMNS} FROM submissions WHERE id = ?"
_BY_KEY: Final = (
    f"SELECT {SUBMISSION_COLUMNS} FROM submissions WHERE conversation_id = ? AND idempotency_key = ?"
)


def _record(rows: list[tuple[object, ...]] | None) -> SubmissionRecord | None:
    return submission_from_row(rows[0]) if rows else None


def check_new(submission: SubmissionRecord) -> None:
    """``create_submission``'s checks in the caller's task: :class:`ValueError` for a submission
    that is not ``pending`` or an invalid time."""
    if submission.state != "pending":
        raise ValueError(f"a new submission is pending, not {submission.state!r}")
    to_us(submission.create_time, "create_time")


def check_end(state: SubmissionState) -> None:
    """``end_submission``'s check: :class:`ValueError` for an unknown ``state``."""
    if state not in _STATES:
        raise ValueError(f"unknown submission state {state!r}")


def create_submission(
    submission: SubmissionRecord, max_open: int, dialect: Dialect
) -> Program[tuple[SubmissionRecord, bool]]:
    """``Store.create_submission``: the stored record and whether it was created. Creations
    serialize (the dialect's ``lock_submissions``), so ``seq`` follows acceptance; a new one
    takes its place in a shared line (``submission_queued``).

    Idempotency: the same id, or the same (conversation, key), with the same request returns
    the stored record; the id and the key naming different submissions, or the id with another
    request or conversation, raises :class:`SubmissionConflict`. :class:`TooManySubmissions`
    when ``max_open`` of the conversation's are open."""
    reads = [
        Statement(_BY_ID, (submission.submission_id,), fetch=True),
        Statement(
            "SELECT COUNT(*) FROM submissions WHERE conversation_id = ? AND state IN ('pending', 'running')",
            (submission.conversation_id,),
            fetch=True,
        ),
        Statement("SELECT COALESCE(MAX(seq), 0) + 1 FROM submissions", fetch=True),
    ]
    if submission.idempotency_key:
        reads.append(Statement(_BY_KEY, (submission.conversation_id, submission.idempotency_key), fetch=True))
    locked = list(dialect.lock_submissions())
    found = (yield [*locked, *reads])[len(locked) :]
    by_key = _record(found[3]) if submission.idempotency_key else None
    existing = repeated_submission(submission, _record(found[0]), by_key)
    if existing is not None:
        return existing, False
    if found[1][0][0] >= max_open:
        raise TooManySubmissions(submission.conversation_id, max_open)
    written = yield [
        Statement(
            "INSERT INTO submissions (id, conversation_id, idempotency_key, state, request, seq, create_time,"
            " owner, lease_until, principal, webhook_endpoint, webhook_url)"
            " VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                submission.submission_id,
                submission.conversation_id,
                submission.idempotency_key or None,
                submission.request,
                found[2][0][0],
                to_us(submission.create_time, "create_time"),
                submission.owner or None,
                None if submission.lease_until is None else to_us(submission.lease_until, "lease_until"),
                submission.principal or None,
                submission.webhook_endpoint or None,
                submission.webhook_url or None,
            ),
        ),
        Statement(_BY_ID, (submission.submission_id,), fetch=True),
        *dialect.submission_queued(submission),
    ]
    stored = _record(written[1])
    assert stored is not None
    return stored, True


def end_submission(
    submission_id: str,
    state: SubmissionState,
    error: bytes | None,
    *,
    only_from: Sequence[str],
    dialect: Dialect,
    now_us: int,
) -> Program[SubmissionRecord | None]:
    """``Store.end_submission``: set the final state when the current one is in ``only_from``;
    the record as stored afterwards (None when there is none). An ended submission's place in a
    shared line goes (the dialect's ``submissions_ended``)."""
    allowed = tuple(only_from)
    marks = in_marks(len(allowed)) if allowed else "NULL"
    done = yield [
        Statement(
            f"UPDATE submissions SET state = ?, end_time = ?, error = ? WHERE id = ? AND state IN ({marks})",
            (state, now_us, error, submission_id, *allowed),
        ),
        *deliveries_on_end([submission_id]),  # the outbox row, in this transaction
        Statement(_BY_ID, (submission_id,), fetch=True),
    ]
    record = _record(done[-1])
    if record is not None and record.state not in OPEN:
        yield dialect.submissions_ended([submission_id])
    return record


def expire_submissions(
    before_us: int, limit: int, error: bytes, dialect: Dialect, now_us: int
) -> Program[list[str]]:
    """``Store.expire_submissions``: up to ``limit`` pending submissions accepted before
    ``before_us`` end ``error`` with ``error``; their ids. Submissions another writer is
    expiring at the same moment are skipped (the dialect's ``claim_rows``); their places in a
    shared line go (``submissions_ended``)."""
    found = yield [
        Statement(
            "SELECT id FROM submissions WHERE state = 'pending' AND create_time < ? ORDER BY seq LIMIT ?"
            + dialect.claim_rows,
            (before_us, limit),
            fetch=True,
        )
    ]
    ids = [row[0] for row in found[0]]
    yield [
        Statement(
            "UPDATE submissions SET state = 'error', end_time = ?, error = ?"
            " WHERE id = ? AND state = 'pending'",
            [(now_us, error, submission_id) for submission_id in ids],
            many=True,
        ),
        *deliveries_on_end(ids),  # the outbox rows, in this transaction
        *dialect.submissions_ended(ids),
    ]
    return ids
