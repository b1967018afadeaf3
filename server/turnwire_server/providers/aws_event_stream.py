"""Bedrock's response stream: AWS event-stream messages read as the Messages API's events.

``InvokeModelWithResponseStream`` (https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html)
answers ``application/vnd.amazon.eventstream``: binary messages, each a prelude (total and headers
length, CRC32), headers, a payload and a CRC32 of the whole
(https://docs.aws.amazon.com/transcribe/latest/dg/streaming-setting-up.html#streaming-event-stream).
botocore's ``EventStreamBuffer`` decodes them: it checks both checksums and refuses a message whose
headers are over 128 KiB or payload over 24 MiB, so what it holds is bounded by one message.

- An event (``:message-type: event``) of type ``chunk`` holds ``{"bytes": "<base64>"}``, the JSON of
  one Messages API streaming event (the same as Anthropic's ``data:``): it becomes the pair
  ``(b"chunk", that JSON)`` for :class:`~turnwire_server.providers.anthropic_messages.AnthropicDecoder`.
  Other event types are skipped.
- An exception (``:message-type: exception``; ``:exception-type`` ``throttlingException``,
  ``modelStreamErrorException``, ``validationException`` …, payload ``{"message": …}``) raises
  :class:`ProviderError` (``in_stream``; body ``{"type": <exception type>, "message": …}``; retryable
  for throttling and service-side failures, :mod:`.errors`).
- A message whose checksum or lengths are wrong raises a retryable in-stream ProviderError, like a
  connection cut mid-stream.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import AsyncIterator
from typing import Any

import orjson
from botocore.eventstream import EventStreamBuffer, ParserError

from turnwire_server.providers import errors


async def iter_bedrock_events(
    provider: str, body: AsyncIterator[bytes]
) -> AsyncIterator[tuple[bytes, bytes]]:
    """Yield ``(b"chunk", event JSON)`` for every Messages API event in ``body`` (the 2xx
    response's byte chunks). Raises ProviderError for an exception message or a corrupt one."""
    buffer = EventStreamBuffer()
    async for chunk in body:
        buffer.add_data(chunk)
        try:
            messages = list(buffer)
        except ParserError as error:
            raise errors.corrupt_stream(
                provider, f"an AWS event-stream message is invalid ({error})"
            ) from error
        for message in messages:
            pair = _event(provider, message.headers, message.payload)
            if pair is not None:
                yield pair


def _event(provider: str, headers: dict[str, Any], payload: bytes) -> tuple[bytes, bytes] | None:
    kind = headers.get(":message-type")
    if kind in ("exception", "error"):
        # "error" messages name their code in :error-code (the event-stream spec's own errors).
        name = str(headers.get(":exception-type") or headers.get(":error-code") or "exception")
        detail = _json(payload)
        message = detail.get("message") or detail.get("Message") if isinstance(detail, dict) else None
        text = message or headers.get(":error-message") or payload.decode("utf-8", "replace")
        raise errors.from_stream_error(provider, {"type": name, "message": str(text)})
    if kind != "event" or headers.get(":event-type") != "chunk":
        return None
    data = _json(payload)
    encoded = data.get("bytes") if isinstance(data, dict) else None
    if not isinstance(encoded, str):
        raise errors.corrupt_stream(provider, "a chunk event without its base64 'bytes'")
    try:
        event = base64.b64decode(encoded, validate=True)
    except binascii.Error as error:
        raise errors.corrupt_stream(provider, "a chunk event whose 'bytes' are not base64") from error
    return b"chunk", event  # the decoder reads the event's kind from its JSON "type"


def _json(payload: bytes) -> Any:
    try:
        return orjson.loads(payload) if payload else None
    except orjson.JSONDecodeError:
        return None
