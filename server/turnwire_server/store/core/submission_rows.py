"""How both stores encode submissions in rows, and the submission listing's statement, pages and
page tokens (docs/semantics.md §7)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import struct
from typing import Any, Final, get_args

from turnwire_server.store.base import SubmissionRecord, SubmissionState
from turnwire_server.store.core.rows import time_from_us
from turnwire_server.store.errors import InvalidPageToken

__all__ = [
    "PREFIX_FILTER",
    "SUBMISSION_COLUMNS",
    "decode_submission_token",
    "encode_submission_token",
    "submission_from_row",
    "submission_page",
    "submission_page_query",
]

_SUBMISSION_STATES: Final[frozenset[str]] = frozenset(get_args(SubmissionState))

SUBMISSION_COLUMNS: Final = (
    "id, conversation_id, idempotency_key, state, request, create_time, start_time, end_time, error, seq,"
    " owner, lease_until"
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
