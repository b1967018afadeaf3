"""Pages of a conversation's messages for GetConversation (AIP-158), each small enough to read.

A page holds at most ``page_size`` messages and at most :data:`PAGE_BUDGET_BYTES` of them, so a
client with gRPC's default 4 MiB receive limit can always read it (docs/semantics.md §11:
readable back, always); one message is always returned, and a stored reply is bounded
(``turnwire_server.engine.assistant_message.REPLY_BUDGET_BYTES``).

Page tokens: version byte 1, the index of the page's first message (8 bytes) and 4 bytes of a
SHA-256 of the conversation id (a token is for one conversation), base64url without padding.
Messages are only appended or replaced in place, so an index stays a valid position. Any other
token is :class:`~turnwire_server.store.errors.InvalidPageToken`.

A turn without a stored reply (``Conversation.turns_without_reply``) is placed among the messages
by its start time (:func:`turnwire_server.turn_places.turn_places`, which ``turnwire history``
uses too) and listed on the page of its place (:func:`on_page`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import struct
from collections.abc import Sequence

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


def message_index(messages: Sequence[message_pb2.Message], message_id: str) -> int:
    """The index of message ``message_id`` in ``messages``, looked for from the last message back
    (a reader starting at a message mostly names a recent one: the cost is the messages after it);
    ``len(messages)`` when there is none, so the page from there is empty and has no next one."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].id == message_id:
            return index
    return len(messages)


def on_page(place: int, start: int, end: int) -> bool:
    """Whether a turn at ``place`` (:func:`~turnwire_server.turn_places.turn_places`) is listed
    on the page of messages ``[start, end)``: the page holding message ``place - 1``, or the
    first page for a turn before every message."""
    return start < place <= end or place == start == 0
