"""Pages of a conversation's messages for GetConversation (AIP-158), each small enough to read.

A page holds at most ``page_size`` messages and at most :data:`PAGE_BUDGET_BYTES` of them, so a
client with gRPC's default 4 MiB receive limit can always read it (docs/semantics.md §11:
readable back, always); one message is always returned, and a stored reply is bounded
(``turnwire_server.engine.assistant_message.REPLY_BUDGET_BYTES``).

Page tokens: version byte 1, the index of the page's first message (8 bytes) and 4 bytes of a
SHA-256 of the conversation id (a token is for one conversation), base64url without padding.
Messages are only appended or replaced in place, so an index stays a valid position. Any other
token is :class:`~turnwire_server.store.base.InvalidPageToken`.

A turn without a stored reply (``Conversation.turns_without_reply``) is placed among the messages
by its start time (:func:`turn_places`) and listed on the page of its place (:func:`on_page`);
``turnwire history`` places it the same way.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import hashlib
import itertools
import re
import struct
from collections.abc import Sequence

from google.protobuf import timestamp_pb2

from turnwire_client.v1 import message_pb2
from turnwire_server.store.errors import InvalidPageToken

PAGE_BUDGET_BYTES = 3 << 20
"""Most message bytes one page carries (the response envelope stays well under 4 MiB)."""

_VERSION = 1
_LAYOUT = struct.Struct(">BQ4s")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _binding(conversation_id: str) -> bytes:
    return hashlib.sha256(conversation_id.encode()).digest()[:4]


def encode_token(conversation_id: str, index: int) -> str:
    """The token for the page of ``conversation_id`` that starts at message ``index``."""
    raw = _LAYOUT.pack(_VERSION, index, _binding(conversation_id))
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_token(token: str, conversation_id: str) -> int:
    """The index a token starts at. Raises :class:`InvalidPageToken` for anything this server did
    not issue for ``conversation_id``."""
    if not _TOKEN.fullmatch(token):
        raise InvalidPageToken(f"page token {token[:40]!r} is not one this server issued")
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        version, index, binding = _LAYOUT.unpack(raw)
    except (binascii.Error, struct.error, ValueError):
        raise InvalidPageToken(f"page token {token[:40]!r} is not one this server issued") from None
    if (
        version != _VERSION
        or binding != _binding(conversation_id)
        or encode_token(conversation_id, index) != token
    ):
        raise InvalidPageToken(f"page token {token[:40]!r} was not issued for this conversation")
    return int(index)


def page_of(
    messages: Sequence[message_pb2.Message], start: int, page_size: int
) -> tuple[list[message_pb2.Message], int | None]:
    """The messages of the page starting at ``start`` (``page_size`` 0: no count limit) and the
    index the next page starts at (None after the last message)."""
    page: list[message_pb2.Message] = []
    size = 0
    for message in messages[start:]:
        if page_size and len(page) >= page_size:
            break
        bytes_ = message.ByteSize()
        if page and size + bytes_ > PAGE_BUDGET_BYTES:
            break
        page.append(message)
        size += bytes_
    end = start + len(page)
    return page, (end if end < len(messages) else None)


def _instant(stamp: timestamp_pb2.Timestamp) -> tuple[int, int]:
    """``(seconds, microseconds)``: the store keeps a turn's start time to the microsecond, while
    its input's ``create_time`` (the same instant) keeps every nanosecond; compared at full
    precision, the input could count as created after the turn started."""
    return (stamp.seconds, stamp.nanos // 1000)


def turn_places(
    messages: Sequence[message_pb2.Message], starts: Sequence[timestamp_pb2.Timestamp]
) -> list[int]:
    """Where each turn start time in ``starts`` sits among ``messages`` (docs/semantics.md §5,
    ``Conversation.turns_without_reply``): the index of the first message created after it
    (``len(messages)`` when none is), so the turn comes right after message ``index - 1``. Times
    are compared to the microsecond; a message without ``create_time`` counts as created at the
    epoch. Clocks of several replicas may disagree, so times need not rise with the order: the
    first message later than the start and than every message before it is meant (a running
    maximum)."""
    latest = list(itertools.accumulate((_instant(m.create_time) for m in messages), max))
    return [bisect.bisect_right(latest, _instant(start)) for start in starts]


def on_page(place: int, start: int, end: int) -> bool:
    """Whether a turn at ``place`` (:func:`turn_places`) is listed on the page of messages
    ``[start, end)``: the page holding message ``place - 1``, or the first page for a turn
    before every message."""
    return start < place <= end or place == start == 0
