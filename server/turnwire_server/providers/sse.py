"""A lean server-sent events reader for model streams.

Follows the WHATWG ``text/event-stream`` rules that model APIs use: lines end
with LF, CRLF or CR; ``event:`` names the event; ``data:`` lines (several are
joined with LF) hold the payload; ``:`` starts a comment (keep-alives); a blank
line dispatches the event; ``id:`` and ``retry:`` are ignored (no reconnects
here). Unlike the spec, an event still pending at end of stream is dispatched,
because some OpenAI-compatible servers omit the final blank line.

Input is the decoded HTTP body as byte chunks of any size
(``httpx2.Response.aiter_bytes()``); output is ``(event, data)`` byte pairs,
``event`` being ``b""`` when the server sent none. Parsing the JSON is left to
the adapter (orjson on the bytes, no str decode). Measured here: ~1 µs per
event, versus ~60-250 µs for the SDKs' typed stream helpers (bench/provider_adapters.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator


async def iter_sse(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[bytes, bytes]]:
    """Yield ``(event, data)`` for every dispatched event in ``chunks``."""
    pending = b""
    event = b""
    data: list[bytes] = []
    async for chunk in chunks:
        buffer = pending + chunk if pending else chunk
        if b"\r" in buffer:
            # A CR at the very end may be the first half of a CRLF split across reads: keep it pending.
            held = buffer.endswith(b"\r")
            buffer = buffer[:-1] if held else buffer
            buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
            if held:
                buffer += b"\r"
        lines = buffer.split(b"\n")
        pending = lines.pop()
        for line in lines:
            if not line:
                if data:
                    yield event, data[0] if len(data) == 1 else b"\n".join(data)
                    data = []
                event = b""
            elif line[0] != 58:  # ':' starts a comment
                event = _field(line, event, data)
    # End of stream: finish a last unterminated line and dispatch what is pending.
    for line in pending.replace(b"\r", b"\n").split(b"\n"):
        if line and line[0] != 58:
            event = _field(line, event, data)
    if data:
        yield event, data[0] if len(data) == 1 else b"\n".join(data)


def _field(line: bytes, event: bytes, data: list[bytes]) -> bytes:
    """Apply one field line; returns the (possibly new) event name."""
    name, _, value = line.partition(b":")
    if value[:1] == b" ":
        value = value[1:]
    if name == b"data":
        data.append(value)
    elif name == b"event":
        return value
    return event
