"""Reuse of decoded messages between reads of a conversation (issue 17: a turn's cost should not
grow with its history).

Every turn reads its conversation's whole transcript (``LOAD_MESSAGES_SQL``, both backends).
Decoding the rows into ``Message`` protos (a message per row group, a ``MergeFromString`` per
part) was the largest history-dependent cost of a turn. :class:`DecodedMessages` keeps the
decoded messages of recently read conversations keyed by their stored columns: a read still
fetches every row, so the database stays the only truth (another replica's writes, a checkpoint
rewriting a reply, a deletion or a rollback are seen at once), and only a message whose stored
bytes equal the cached ones reuses its decoded form. Callers get copies (the engine repairs tool
calls in place), which ``CopyFrom`` makes in C, several times cheaper than decoding.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from google.protobuf.message import DecodeError

from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import StoreCorrupted
from turnwire_server.store.sqlite_rows import build_message

DEFAULT_MAX_MESSAGES = 200_000
"""How many decoded messages are kept across conversations (least recently read dropped first);
at a few hundred bytes each, tens of MB at most."""

_Key = tuple[int, Any, int, bytes | None, tuple[bytes, ...]]
_Entry = tuple[_Key, message_pb2.Message]


class DecodedMessages:
    """A bounded, least-recently-read cache of decoded messages per conversation.

    ``backend`` names the store in errors; ``max_messages`` bounds the messages kept (a
    conversation larger than that is decoded without the cache). Not thread-safe: call it from
    the event loop (the store's readers), not from a writer thread.
    """

    def __init__(self, backend: str, *, max_messages: int = DEFAULT_MAX_MESSAGES) -> None:
        self.backend = backend
        self.max_messages = max_messages
        self._conversations: collections.OrderedDict[str, dict[str, _Entry]] = collections.OrderedDict()
        self._size = 0

    def messages(self, conversation_id: str, rows: Iterable[Any]) -> list[message_pb2.Message]:
        """The messages of ``LOAD_MESSAGES_SQL``'s ``rows`` (``(id, role, create_time_us,
        create_time_nanos, metadata, part)``, by message then part), in order, each a fresh copy.
        Raises :class:`StoreCorrupted` for a message that cannot be decoded."""
        known = self._conversations.pop(conversation_id, None)
        if known is not None:
            self._size -= len(known)
        fresh: dict[str, _Entry] = {}
        out: list[message_pb2.Message] = []
        try:
            for message_id, role, create_us, create_nanos, metadata, parts in _grouped(rows):
                key: _Key = (role, create_us, create_nanos, metadata, parts)
                entry = known.get(message_id) if known is not None else None
                if entry is None or entry[0] != key:
                    entry = (key, _decode(message_id, key))
                fresh[message_id] = entry
                copy = message_pb2.Message()
                copy.CopyFrom(entry[1])
                out.append(copy)
        except (DecodeError, RecursionError) as exc:
            raise StoreCorrupted(
                f"{self.backend} store: conversation {conversation_id!r} has a message that cannot be "
                f"decoded: {exc}"
            ) from exc
        if len(fresh) <= self.max_messages:
            self._conversations[conversation_id] = fresh
            self._size += len(fresh)
            while self._size > self.max_messages:
                _, dropped = self._conversations.popitem(last=False)
                self._size -= len(dropped)
        return out


def _grouped(rows: Iterable[Any]) -> Iterable[tuple[str, int, Any, int, bytes | None, tuple[bytes, ...]]]:
    """The rows grouped by message (PostgreSQL's bytea columns come back as memoryview: bytes)."""
    current: list[Any] | None = None
    parts: list[bytes] = []
    for message_id, role, create_us, create_nanos, metadata, part in rows:
        if current is None or current[0] != message_id:
            if current is not None:
                yield (*current, tuple(parts))
            current = [
                message_id,
                role,
                create_us,
                create_nanos,
                None if metadata is None else bytes(metadata),
            ]
            parts = []
        if part is not None:
            parts.append(bytes(part))
    if current is not None:
        yield (*current, tuple(parts))


def _decode(message_id: str, key: _Key) -> message_pb2.Message:
    role, create_us, create_nanos, metadata, parts = key
    message = build_message(message_id, role, create_us, create_nanos, metadata)
    for part in parts:
        message.parts.add().MergeFromString(part)
    return message
