"""How both stores encode submissions in rows, and the submission listing's statement and pages
(docs/semantics.md §7; its page tokens are in :mod:`.page_tokens`)."""

from __future__ import annotations

from typing import Any, Final, get_args

from turnwire_server.store.core.page_tokens import decode_submission_token, encode_submission_token
from turnwire_server.store.core.rows import time_from_us, to_us
from turnwire_server.store.records import SubmissionRecord, SubmissionState

__all__ = [
    "PREFIX_FILTER",
    "SUBMISSION_COLUMNS",
    "submission_from_row",
    "submission_page",
    "submission_page_query",
]

_SUBMISSION_STATES: Final[frozenset[str]] = frozenset(get_args(SubmissionState))

SUBMISSION_COLUMNS: Final = (
    "id, conversation_id, idempotency_key, state, request, create_time, start_time, end_time, error, seq,"
    " owner, lease_until, principal"
)
"""The columns :func:`submission_from_row` reads, in its order."""


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
        principal=row[12] or "",
    )


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
    a token not issued for these filters.

    A token names the last submission of the page before (:mod:`.page_tokens`); the page goes on
    after it in acceptance order. Should that submission be gone (its conversation deleted), the
    page goes on after the caller's last submission created no later than it."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    filters, filter_params = list[str](), list[Any]()
    if conversation_id:
        filters.append(f"conversation_id = {mark}")
        filter_params.append(conversation_id)
    if id_prefix:
        filters.append(PREFIX_FILTER.format(column="conversation_id", mark=mark))
        filter_params.extend((len(id_prefix), id_prefix))
    if state:
        filters.append(f"state = {mark}")
        filter_params.append(state)
    where, params = list(filters), list(filter_params)
    if page_token:
        create_us, after_id = decode_submission_token(page_token, conversation_id, state, id_prefix)
        before = " AND ".join([f"create_time <= {mark}", *filters])
        where.insert(
            0,
            f"seq > COALESCE((SELECT seq FROM submissions WHERE id = {mark}),"
            f" (SELECT MAX(seq) FROM submissions WHERE {before}), 0)",
        )
        params = [after_id, create_us, *filter_params, *params]
    condition = f" WHERE {' AND '.join(where)}" if where else ""
    sql = f"SELECT {SUBMISSION_COLUMNS} FROM submissions{condition} ORDER BY seq LIMIT {mark}"
    return sql, [*params, page_size + 1]


def submission_page(
    rows: list[Any], page_size: int, conversation_id: str, state: str, id_prefix: str = ""
) -> tuple[list[SubmissionRecord], str]:
    """The records of :func:`submission_page_query`'s rows and the next page token ("" when none)."""
    records = [submission_from_row(row) for row in rows[:page_size]]
    if len(rows) <= page_size:
        return records, ""
    last = records[-1]
    token = encode_submission_token(
        to_us(last.create_time, "create_time"), last.submission_id, conversation_id, state, id_prefix
    )
    return records, token
