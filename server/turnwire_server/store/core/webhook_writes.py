"""The webhook outbox's statements, once for both drivers (docs/webhooks.md; core programs as
:mod:`turnwire_server.store.core.sql` describes them).

* :func:`deliveries_on_end`: appended to every write that ends a submission, in its
  transaction; it copies the ended submission's target and end into a delivery row (nothing for
  a submission without a target, nothing twice: one row per submission).
* :func:`claim_deliveries` / :func:`finish_attempt`: the sender's lease-and-record cycle.
* :func:`delivery_page_query` / :func:`attempts_query`: the listing.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
from collections.abc import Sequence
from typing import Any, Final, get_args

from turnwire_server.store.core.page_tokens import decode_delivery_token, encode_delivery_token
from turnwire_server.store.core.rows import time_from_us, to_us
from turnwire_server.store.core.sql import Dialect, Program, Statement, in_marks
from turnwire_server.store.core.submission_rows import PREFIX_FILTER
from turnwire_server.store.webhooks import (
    AttemptResult,
    WebhookAttemptRecord,
    WebhookDeliveryRecord,
    WebhookDeliveryState,
)

__all__ = [
    "DELIVERY_COLUMNS",
    "attempts_from_rows",
    "attempts_query",
    "claim_deliveries",
    "delete_ended_deliveries",
    "deliveries_on_end",
    "delivery_from_row",
    "delivery_id_of",
    "delivery_page",
    "delivery_page_query",
    "finish_attempt",
]

_STATES: Final[frozenset[str]] = frozenset(get_args(WebhookDeliveryState))

DELIVERY_COLUMNS: Final = (
    "id, submission_id, conversation_id, endpoint, url, event_type, submission_state, error,"
    " create_time, state, attempt_count, next_attempt_time, end_time"
)
"""The columns :func:`delivery_from_row` reads, in its order."""

_ON_END: Final = (
    "INSERT INTO webhook_deliveries (id, submission_id, conversation_id, endpoint, url, event_type,"
    " submission_state, error, create_time, next_attempt_time)"
    " SELECT ?, id, conversation_id, webhook_endpoint, webhook_url,"
    " CASE state WHEN 'completed' THEN 'turn.completed' WHEN 'aborted' THEN 'turn.cancelled'"
    " WHEN 'skipped' THEN 'turn.skipped' ELSE 'turn.failed' END,"
    " state, error, end_time, end_time FROM submissions"
    " WHERE id = ? AND state IN ('completed', 'error', 'aborted', 'skipped')"
    " AND (webhook_endpoint IS NOT NULL OR webhook_url IS NOT NULL)"
    " ON CONFLICT DO NOTHING"
)


def delivery_id_of(submission_id: str) -> str:
    """The delivery id (``webhook-id``) of a submission's end: ``msg_`` and 26 base32
    characters of its key's BLAKE2b digest. Derived, so a write that ends the same submission
    twice makes one row; holds no tenant name (keys of two tenants differ, so do their ids)."""
    digest = hashlib.blake2b(submission_id.encode(), digest_size=16).digest()
    return "msg_" + base64.b32encode(digest).decode("ascii").rstrip("=").lower()[:26]


def deliveries_on_end(submission_ids: Sequence[str]) -> list[Statement]:
    """The statement that writes the delivery row of each of ``submission_ids`` that ended with
    a webhook target (run after the statement that ended them, in its transaction)."""
    if not submission_ids:
        return []
    return [Statement(_ON_END, [(delivery_id_of(s), s) for s in submission_ids], many=True)]


def delivery_from_row(row: Any, attempts: Sequence[WebhookAttemptRecord] = ()) -> WebhookDeliveryRecord:
    """A row of :data:`DELIVERY_COLUMNS` as a record."""
    create = time_from_us(row[8])
    assert create is not None  # NOT NULL column
    state = row[9]
    if state not in _STATES:
        raise ValueError(f"webhook delivery {row[0]!r} has unknown state {state!r} in the database")
    return WebhookDeliveryRecord(
        delivery_id=row[0],
        submission_id=row[1],
        conversation_id=row[2],
        endpoint=row[3],
        url=row[4],
        event_type=row[5],
        submission_state=row[6],
        error=None if row[7] is None else bytes(row[7]),
        create_time=create,
        state=state,
        attempt_count=row[10],
        next_attempt_time=time_from_us(row[11]),
        end_time=time_from_us(row[12]),
        attempts=tuple(attempts),
    )


def claim_deliveries(
    owner: str, now_us: int, until_us: int, limit: int, *, single_process: bool, dialect: Dialect
) -> Program[list[WebhookDeliveryRecord]]:
    """``WebhookStore.claim_webhook_deliveries``: the due rows no live owner holds, oldest due
    first; each gets ``owner`` until ``until_us``, its attempt count raised and its attempt row
    started. ``single_process``: every other owner is dead (a store one process serves), so only
    this owner's own leases count."""
    held = "(owner IS NULL OR lease_until < ?" + (" OR owner <> ?)" if single_process else ")")
    held_params: tuple[Any, ...] = (now_us, owner) if single_process else (now_us,)
    found = yield [
        Statement(
            f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries"
            f" WHERE state = 'pending' AND next_attempt_time <= ? AND {held}"
            " ORDER BY next_attempt_time, id LIMIT ?" + dialect.claim_rows,
            (now_us, *held_params, limit),
            fetch=True,
        )
    ]
    rows = found[0]
    if not rows:
        return []
    yield [
        Statement(
            "UPDATE webhook_deliveries SET owner = ?, lease_until = ?, attempt_count = attempt_count + 1"
            " WHERE id = ?",
            [(owner, until_us, row[0]) for row in rows],
            many=True,
        ),
        Statement(
            "INSERT INTO webhook_attempts (delivery_id, attempt, start_time) VALUES (?, ?, ?)"
            " ON CONFLICT DO NOTHING",
            [(row[0], row[10] + 1, now_us) for row in rows],
            many=True,
        ),
    ]
    return [dataclasses.replace(delivery_from_row(row), attempt_count=row[10] + 1) for row in rows]


def finish_attempt(
    delivery_id: str, owner: str, attempt: int, result: AttemptResult, *, now_us: int, dialect: Dialect
) -> Program[bool]:
    """``WebhookStore.finish_webhook_attempt``: the attempt row completed; the delivery moved
    only while ``owner`` still holds it at ``attempt`` (else False)."""
    next_us = None
    if result.state == "pending":
        if result.next_attempt_time is None:
            raise ValueError("a pending delivery needs next_attempt_time")
        next_us = to_us(result.next_attempt_time, "next_attempt_time")
    found = yield [
        Statement(
            "UPDATE webhook_attempts SET duration_us = ?, http_status = ?, error = ?"
            " WHERE delivery_id = ? AND attempt = ? AND duration_us IS NULL",  # recorded once
            (result.duration_us, result.http_status, result.error, delivery_id, attempt),
        ),
        Statement(
            "SELECT owner, attempt_count, state FROM webhook_deliveries WHERE id = ?" + dialect.lock_rows,
            (delivery_id,),
            fetch=True,
        ),
    ]
    rows = found[1]
    if not rows or rows[0][0] != owner or rows[0][1] != attempt or rows[0][2] != "pending":
        return False
    yield [
        Statement(
            "UPDATE webhook_deliveries SET state = ?, next_attempt_time = ?, end_time = ?, owner = NULL,"
            " lease_until = NULL WHERE id = ?",
            (result.state, next_us, None if result.state == "pending" else now_us, delivery_id),
        )
    ]
    return True


def delete_ended_deliveries(before_us: int, limit: int, dialect: Dialect) -> Program[int]:
    """``WebhookStore.delete_webhook_deliveries``: up to ``limit`` delivered or failed deliveries
    ended before ``before_us`` go, attempts first."""
    found = yield [
        Statement(
            "SELECT id FROM webhook_deliveries WHERE state <> 'pending' AND end_time < ?"
            " ORDER BY end_time LIMIT ?" + dialect.claim_rows,
            (before_us, limit),
            fetch=True,
        )
    ]
    ids = [(row[0],) for row in found[0]]
    if ids:
        yield [
            Statement("DELETE FROM webhook_attempts WHERE delivery_id = ?", ids, many=True),
            Statement("DELETE FROM webhook_deliveries WHERE id = ?", ids, many=True),
        ]
    return len(ids)


def delivery_page_query(
    page_size: int,
    page_token: str,
    *,
    submission_id: str,
    conversation_id: str,
    state: str,
    id_prefix: str,
) -> tuple[str, list[Any]]:
    """The listing's statement (``?`` placeholders) and parameters: one row more than
    ``page_size``, oldest first (by create time, then id). Raises :class:`ValueError` for
    ``page_size`` < 1, :class:`InvalidPageToken` for a token not issued for these filters."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1, got {page_size}")
    filters, params = list[str](), list[Any]()
    if submission_id:
        filters.append("submission_id = ?")
        params.append(submission_id)
    if conversation_id:
        filters.append("conversation_id = ?")
        params.append(conversation_id)
    if state:
        filters.append("state = ?")
        params.append(state)
    if id_prefix:
        filters.append(PREFIX_FILTER.format(column="submission_id", mark="?"))
        params.extend((len(id_prefix), id_prefix))
    if page_token:
        create_us, delivery_id = decode_delivery_token(
            page_token, submission_id, conversation_id, state, id_prefix
        )
        filters.append("(create_time > ? OR (create_time = ? AND id > ?))")
        params.extend((create_us, create_us, delivery_id))
    where = f" WHERE {' AND '.join(filters)}" if filters else ""
    sql = f"SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries{where} ORDER BY create_time, id LIMIT ?"
    return sql, [*params, page_size + 1]


def attempts_query(delivery_ids: Sequence[str]) -> tuple[str, list[Any]]:
    """The attempts of ``delivery_ids`` (at least one), by delivery then attempt number."""
    return (
        "SELECT delivery_id, attempt, start_time, duration_us, http_status, error FROM webhook_attempts"
        f" WHERE delivery_id IN ({in_marks(len(delivery_ids))}) ORDER BY delivery_id, attempt",
        list(delivery_ids),
    )


def attempts_from_rows(rows: Sequence[Any]) -> dict[str, list[WebhookAttemptRecord]]:
    """:func:`attempts_query`'s rows by delivery id."""
    found: dict[str, list[WebhookAttemptRecord]] = {}
    for delivery_id, attempt, start_us, duration_us, http_status, error in rows:
        start = time_from_us(start_us)
        assert start is not None  # NOT NULL column
        found.setdefault(delivery_id, []).append(
            WebhookAttemptRecord(attempt, start, duration_us, http_status, error)
        )
    return found


def delivery_page(
    rows: Sequence[Any],
    attempts: dict[str, list[WebhookAttemptRecord]],
    page_size: int,
    *,
    submission_id: str,
    conversation_id: str,
    state: str,
    id_prefix: str,
) -> tuple[list[WebhookDeliveryRecord], str]:
    """The page's records and the next page's token ("" on the last page)."""
    records = [delivery_from_row(row, attempts.get(row[0], ())) for row in rows[:page_size]]
    token = ""
    if len(rows) > page_size and records:
        last = rows[page_size - 1]
        token = encode_delivery_token(
            last[8],
            last[0],
            submission_id=submission_id,
            conversation_id=conversation_id,
            state=state,
            id_prefix=id_prefix,
        )
    return records, token
