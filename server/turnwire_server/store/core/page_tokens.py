"""The page tokens of both listings (``list_conversations``, ``list_submissions``; AIP-158).

A token says where a listing continues, and carries nothing but the caller's own data (issue 32
item 6): the last item of the page it follows, named by its id *within the listing's scope* (the
key without ``id_prefix``, the caller's tenant) and its time, and a digest of the listing's
filters and scope. So a token holds no store-wide sequence number (tokens once carried the
submission's ``seq``, from which one tenant read how many submissions all the others made),
and a token issued in one scope or for other filters is refused, not reinterpreted: another
tenant's token is :class:`InvalidPageToken` like any forged one.

Layout, base64url without padding: a version byte, the 8-byte BLAKE2b digest of the filters and
scope, a signed 64-bit big-endian time in microseconds, then the id in UTF-8. The layout is
fixed binary, so nothing in a crafted token reaches a parser that could fail other than with
:class:`InvalidPageToken`, and decoding is strict (one spelling per position: the token must be
exactly what encoding its parts gives). Not signed: a token that passes only moves where the
caller's own listing starts, among rows the caller may list whole from the first page; a
signature would need a secret kept per database (a schema migration) or void every token at
each restart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from typing import Final

from turnwire_server.store.errors import InvalidPageToken

__all__ = [
    "decode_delivery_token",
    "decode_page_token",
    "decode_schedule_token",
    "decode_submission_token",
    "decode_turn_token",
    "encode_delivery_token",
    "encode_page_token",
    "encode_schedule_token",
    "encode_submission_token",
    "encode_turn_token",
]

_HEAD: Final = struct.Struct(">B8sq")  # version, digest of the filters and scope, time (µs)
_MAX_TOKEN_CHARS: Final = 4096
"""Far above any real token (the API's ids have at most 128 characters); a longer one is refused unread."""
_ALPHABET: Final = re.compile(r"[A-Za-z0-9_-]+")
_MIN_US: Final = -62_135_596_800 * 1_000_000
"""The earliest time ``google.protobuf.Timestamp`` holds (0001-01-01), in microseconds."""
_MAX_US: Final = 253_402_300_800 * 1_000_000 - 1
"""The latest (9999-12-31T23:59:59.999999)."""

_CONVERSATIONS: Final = 3
"""Version 1 was JSON, version 2 the same binary layout with the whole key and no scope digest."""
_SUBMISSIONS: Final = 2
"""Version 1 carried the submission's store-wide ``seq``."""
_TURNS: Final = 4
"""The turn listing's (``list_turns``): its own version, so no other listing's token passes."""
_DELIVERIES: Final = 5
"""The webhook delivery listing's (``list_webhook_deliveries``)."""


def _digest(*filters: str) -> bytes:
    return hashlib.blake2b("\0".join(filters).encode(), digest_size=8).digest()


def _encode(version: int, digest: bytes, time_us: int, local_id: str) -> str:
    payload = _HEAD.pack(version, digest, time_us) + local_id.encode()
    return base64.urlsafe_b64encode(payload).decode("ascii").rstrip("=")


def _decode(token: str, version: int, digest: bytes) -> tuple[int, str]:
    """``(time_us, local_id)`` of a token :func:`_encode` made with ``version`` and ``digest``;
    :class:`InvalidPageToken` for any other string."""
    invalid = InvalidPageToken(f"invalid page token {token[:64]!r}")
    if len(token) > _MAX_TOKEN_CHARS or not _ALPHABET.fullmatch(token):
        raise invalid
    try:
        payload = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        local_id = payload[_HEAD.size :].decode()
    except (binascii.Error, UnicodeDecodeError) as exc:
        raise invalid from exc
    if len(payload) <= _HEAD.size:
        raise invalid
    found_version, found_digest, time_us = _HEAD.unpack_from(payload)
    if found_version != version or found_digest != digest or not _MIN_US <= time_us <= _MAX_US:
        raise invalid
    if _encode(version, digest, time_us, local_id) != token:  # another spelling of the same bytes
        raise invalid
    return time_us, local_id


def encode_page_token(update_us: int, conversation_id: str, id_prefix: str = "") -> str:
    """The token of the conversation listing's page after the conversation ``conversation_id``
    (a key starting with ``id_prefix``) updated at ``update_us``, in the listing of
    ``id_prefix``."""
    return _encode(_CONVERSATIONS, _digest(id_prefix), update_us, conversation_id.removeprefix(id_prefix))


def decode_page_token(token: str, id_prefix: str = "") -> tuple[int, str]:
    """``(update_us, conversation_id)`` (the key, ``id_prefix`` included) of a token
    :func:`encode_page_token` made for the listing of ``id_prefix``. Raises
    :class:`InvalidPageToken`, and nothing else, for any other string."""
    update_us, local_id = _decode(token, _CONVERSATIONS, _digest(id_prefix))
    return update_us, id_prefix + local_id


def encode_submission_token(
    create_us: int, submission_id: str, conversation_id: str, state: str, id_prefix: str = ""
) -> str:
    """The token of the submission listing's page after the submission ``submission_id`` (a key
    starting with ``id_prefix``) created at ``create_us``, for these filters."""
    digest = _digest(conversation_id, state, id_prefix)
    return _encode(_SUBMISSIONS, digest, create_us, submission_id.removeprefix(id_prefix))


def decode_submission_token(
    token: str, conversation_id: str, state: str, id_prefix: str = ""
) -> tuple[int, str]:
    """``(create_us, submission_id)`` (the key) of a token :func:`encode_submission_token` made
    for these filters. Raises :class:`InvalidPageToken`, and nothing else, for any other string,
    and for an id holding NUL (no submission id does; PostgreSQL's text cannot)."""
    create_us, local_id = _decode(token, _SUBMISSIONS, _digest(conversation_id, state, id_prefix))
    if "\0" in local_id:
        raise InvalidPageToken(f"invalid page token {token[:64]!r}")
    return create_us, id_prefix + local_id


def encode_delivery_token(
    create_us: int, delivery_id: str, *, submission_id: str, conversation_id: str, state: str, id_prefix: str
) -> str:
    """The token of the delivery listing's page after the delivery ``delivery_id`` (an id without
    a tenant prefix) created at ``create_us``, for these filters in the scope ``id_prefix``."""
    digest = _digest(submission_id, conversation_id, state, id_prefix)
    return _encode(_DELIVERIES, digest, create_us, delivery_id)


def decode_delivery_token(
    token: str, submission_id: str, conversation_id: str, state: str, id_prefix: str
) -> tuple[int, str]:
    """``(create_us, delivery_id)`` of a token :func:`encode_delivery_token` made for these
    filters. Raises :class:`InvalidPageToken`, and nothing else, for any other string."""
    digest = _digest(submission_id, conversation_id, state, id_prefix)
    create_us, delivery_id = _decode(token, _DELIVERIES, digest)
    if "\0" in delivery_id:
        raise InvalidPageToken(f"invalid page token {token[:64]!r}")
    return create_us, delivery_id


def encode_turn_token(start_us: int, request_id: str, conversation_id: str, failed_only: bool) -> str:
    """The token of the turn listing's page after the turn ``request_id`` (a key) started at
    ``start_us``, in the listing of ``conversation_id``'s turns (``failed_only`` or all). The id
    is kept without the conversation's tenant prefix, as the other listings keep theirs."""
    prefix = _tenant_prefix(conversation_id)
    digest = _digest(conversation_id, "failed" if failed_only else "")
    return _encode(_TURNS, digest, start_us, request_id.removeprefix(prefix))


def decode_turn_token(token: str, conversation_id: str, failed_only: bool) -> tuple[int, str]:
    """``(start_us, request_id)`` (the key) of a token :func:`encode_turn_token` made for this
    listing. Raises :class:`InvalidPageToken`, and nothing else, for any other string."""
    digest = _digest(conversation_id, "failed" if failed_only else "")
    start_us, local_id = _decode(token, _TURNS, digest)
    if "\0" in local_id:
        raise InvalidPageToken(f"invalid page token {token[:64]!r}")
    return start_us, _tenant_prefix(conversation_id) + local_id


_SCHEDULES: Final = 5
"""The schedule listing's (``list_schedules``)."""


def encode_schedule_token(schedule_id: str, id_prefix: str = "") -> str:
    """The token of the schedule listing's page after the schedule ``schedule_id`` (a key starting
    with ``id_prefix``), in the listing of ``id_prefix``. The listing is by id: no time (0)."""
    return _encode(_SCHEDULES, _digest(id_prefix), 0, schedule_id.removeprefix(id_prefix))


def decode_schedule_token(token: str, id_prefix: str = "") -> str:
    """The schedule id (the key) of a token :func:`encode_schedule_token` made for the listing of
    ``id_prefix``. Raises :class:`InvalidPageToken`, and nothing else, for any other string."""
    _, local_id = _decode(token, _SCHEDULES, _digest(id_prefix))
    if "\0" in local_id:
        raise InvalidPageToken(f"invalid page token {token[:64]!r}")
    return id_prefix + local_id


def _tenant_prefix(key: str) -> str:
    """``"<tenant>/"`` of a store key, "" for the default tenant's (tenant_keys.py)."""
    tenant, separator, _ = key.partition("/")
    return tenant + separator if separator else ""
