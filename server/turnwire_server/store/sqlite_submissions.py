"""The SQLite store's writes and rows for submissions (docs/semantics.md §7).

Same conventions as :mod:`turnwire_server.store.sqlite_writes`: each ``*_write`` validates in
the caller's task and returns a :data:`WriteFn` the writer thread runs inside its batch
transaction.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import sqlite3
import struct
from collections.abc import Callable, Sequence
from typing import Any, Final, get_args

from turnwire_server.store.base import SubmissionRecord, SubmissionState
from turnwire_server.store.errors import InvalidPageToken, SubmissionNotPending, TooManySubmissions
from turnwire_server.store.sqlite_rows import WriteFn, time_from_us, to_us
from turnwire_server.store.submission_rules import repeated_submission

__all__ = [
    "PREFIX_FILTER",
    "SUBMISSION_COLUMNS",
    "claim_submissions_write",
    "create_submission_write",
    "decode_submission_token",
    "encode_submission_token",
    "end_submission_write",
    "expire_submissions_write",
    "finish_submission",
    "start_submission",
    "submission_from_row",
    "submission_page",
    "submission_page_query",
]

_SUBMISSION_STATES: Final[frozenset[str]] = frozenset(get_args(SubmissionState))
_OPEN: Final = ("pending", "running")

SUBMISSION_COLUMNS: Final = (
    "id, conversation_id, idempotency_key, state, request, create_time, start_time, end_time, error, seq,"
    " owner, lease_until"
)
"""The columns :func:`submission_from_row` reads, in its order."""


# --------------------------------------------------------------------------- submissions


def submission_from_row(row: Any) -> SubmissionRecord:
    """A row of :data:`SUBMISSION_COLUMNS` as a :class:`SubmissionRecord`."""
    create = time_from_us(row[5])
    assert create is not None  # NOT NULL column
    state = row[3]
    if state not in _SUBMISSION_STATES:
        raise ValueError(f"submission {row[0]!r} has unknown state {state!r} in the database")
    return SubmissionRecord(
        submission_id=row[0],
        conversation_id=row[1],
        idempotency_key=row[2],
        state=state,
        request=bytes(row[4]),
        create_time=create,
        start_time=time_from_us(row[6]),
        end_time=time_from_us(row[7]),
        error=None if row[8] is None else bytes(row[8]),
        seq=row[9],
        owner=row[10] or "",
        lease_until=time_from_us(row[11]),
    )


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


def start_submission(conn: sqlite3.Connection, request_id: str, now_us: int) -> None:
    """Inside ``start_turn``: mark the submission whose id is ``request_id`` (if any) running.

    Raises :class:`SubmissionNotPending` when it is no longer pending or running (cancelled
    while it waited): the turn must not store its input then.
    """
    found = conn.execute("SELECT state FROM submissions WHERE id = ?", (request_id,)).fetchone()
    if found is None:
        return
    if found[0] not in _OPEN:
        raise SubmissionNotPending(request_id, found[0])
    conn.execute(
        "UPDATE submissions SET state = 'running', start_time = COALESCE(start_time, ?) WHERE id = ?",
        (now_us, request_id),
    )


_FROM_TURN: Final[dict[str, str]] = {
    "completed": "completed",
    "error": "error",
    "aborted": "aborted",
    "interrupted": "error",
    "skipped": "skipped",
}


def finish_submission(
    conn: sqlite3.Connection, request_id: str, turn_state: str, error: bytes | None, now_us: int
) -> None:
    """Inside ``finish_turn``: end the running submission of ``request_id`` (if any) with its
    turn's state. Only a ``running`` one changes, so a late completion never overwrites
    ``aborted`` (docs/semantics.md §7)."""
    state = _FROM_TURN.get(turn_state)
    if state is None:
        return  # still running (a recovery counted): nothing ends
    conn.execute(
        "UPDATE submissions SET state = ?, end_time = ?, error = ? WHERE id = ? AND state = 'running'",
        (state, now_us, error, request_id),
    )


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


PREFIX_FILTER: Final = "substr({column}, 1, {mark}) = {mark}"
"""A condition that ``column`` starts with a prefix, for either backend (parameters: the prefix's
length, the prefix): no LIKE, so no character of the prefix needs escaping. ``substr`` counts
characters in both SQLite and PostgreSQL, as ``len`` does."""


def submission_page_query(
    page_size: int, page_token: str, conversation_id: str, state: str, *, mark: str, id_prefix: str = ""
) -> tuple[str, list[Any]]:
    """``Store.list_submissions``' statement and parameters, for either backend (``mark`` is its
    placeholder, ``?`` or ``%s``): one row more than ``page_size``, to know whether a page
    follows. Raises :class:`ValueError` for ``page_size`` < 1 and :class:`InvalidPageToken` for
    a token not issued for these filters."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    after = decode_submission_token(page_token, conversation_id, state, id_prefix) if page_token else 0
    where, params = [f"seq > {mark}"], list[Any]([after])
    if conversation_id:
        where.append(f"conversation_id = {mark}")
        params.append(conversation_id)
    if id_prefix:
        where.append(PREFIX_FILTER.format(column="conversation_id", mark=mark))
        params.extend((len(id_prefix), id_prefix))
    if state:
        where.append(f"state = {mark}")
        params.append(state)
    sql = (
        f"SELECT {SUBMISSION_COLUMNS} FROM submissions WHERE {' AND '.join(where)} ORDER BY seq LIMIT {mark}"
    )
    return sql, [*params, page_size + 1]


def submission_page(
    rows: list[Any], page_size: int, conversation_id: str, state: str, id_prefix: str = ""
) -> tuple[list[SubmissionRecord], str]:
    """The records of :func:`submission_page_query`'s rows and the next page token ("" when none)."""
    records = [submission_from_row(row) for row in rows[:page_size]]
    token = (
        encode_submission_token(records[-1].seq, conversation_id, state, id_prefix)
        if len(rows) > page_size
        else ""
    )
    return records, token


# --------------------------------------------------------------------------- page tokens

_TOKEN: Final = struct.Struct(">B8sq")  # version, filter digest, last seq
_TOKEN_VERSION: Final = 1


def _filter_digest(conversation_id: str, state: str, id_prefix: str) -> bytes:
    # Without a prefix the digest is the one tokens had before prefixes existed: they stay valid.
    scope = f"\0{id_prefix}" if id_prefix else ""
    return hashlib.blake2b(f"{conversation_id}\0{state}{scope}".encode(), digest_size=8).digest()


def encode_submission_token(seq: int, conversation_id: str, state: str, id_prefix: str = "") -> str:
    """The token of the page after the submission ``seq`` for these filters: base64url of a
    version byte, a digest of the filters (a token is only valid with the same filters) and
    ``seq``."""
    payload = _TOKEN.pack(_TOKEN_VERSION, _filter_digest(conversation_id, state, id_prefix), seq)
    return base64.urlsafe_b64encode(payload).decode("ascii").rstrip("=")


def decode_submission_token(token: str, conversation_id: str, state: str, id_prefix: str = "") -> int:
    """The ``seq`` in ``token``; raises :class:`InvalidPageToken` (and nothing else) for a token not
    issued by :func:`encode_submission_token` for these filters."""
    invalid = InvalidPageToken(f"invalid page token {token[:64]!r}")
    if len(token) > 64:
        raise invalid
    try:
        payload = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    except (binascii.Error, ValueError) as exc:
        raise invalid from exc
    if len(payload) != _TOKEN.size:
        raise invalid
    version, digest, seq = _TOKEN.unpack(payload)
    if version != _TOKEN_VERSION or digest != _filter_digest(conversation_id, state, id_prefix) or seq < 0:
        raise invalid
    if encode_submission_token(seq, conversation_id, state, id_prefix) != token:
        raise invalid
    return int(seq)
