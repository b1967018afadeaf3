"""AWS event-stream messages as Bedrock's ``InvokeModelWithResponseStream`` sends them, for replays.

botocore only decodes this framing, so the messages are built here per the format
(https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html#streaming-event-stream):
a 12-byte prelude (total length, headers length, both big-endian uint32, then the CRC32 of those 8
bytes), the headers (name length uint8, name, value type 7 = string, value length uint16, value),
the payload, and the CRC32 of everything before it.
"""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import Iterable
from typing import Any

import orjson

CONTENT_TYPE = "application/vnd.amazon.eventstream"


def message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message with string ``headers``."""
    encoded = b"".join(
        struct.pack(">B", len(name)) + name.encode() + struct.pack(">BH", 7, len(value)) + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + encoded + payload
    return head + struct.pack(">I", zlib.crc32(head))


def chunk(event: dict[str, Any]) -> bytes:
    """A ``chunk`` event carrying one Messages API event (its JSON, base64 in ``bytes``)."""
    data = {"bytes": base64.b64encode(orjson.dumps(event)).decode(), "p": "abcdefgh"}
    headers = {":event-type": "chunk", ":content-type": "application/json", ":message-type": "event"}
    return message(headers, orjson.dumps(data))


def exception(kind: str, text: str) -> bytes:
    """An exception message (``throttlingException``, ``modelStreamErrorException`` …)."""
    headers = {":exception-type": kind, ":content-type": "application/json", ":message-type": "exception"}
    return message(headers, orjson.dumps({"message": text}))


def chunks(events: Iterable[dict[str, Any]]) -> list[bytes]:
    """One ``chunk`` message per Messages API event."""
    return [chunk(event) for event in events]
