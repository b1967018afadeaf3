"""A local model upstream for ``bench/ttft.py``: the Anthropic Messages and OpenAI Chat
Completions streaming wire formats on one port, in its own process.

``POST /v1/messages`` answers as Anthropic, ``POST /v1/chat/completions`` as OpenAI (SSE,
``Transfer-Encoding: chunked``, one HTTP chunk per SSE event, HTTP/1.1 keep-alive). The
request body's ``model`` picks the answer:

- ``burst-N``: N text deltas written back to back;
- ``paced-N``: N text deltas, ``--pace-ms`` (default 2 ms) before each;
- ``hold``: one text delta, then nothing until the client hangs up (at most an hour).

The bodies are built once per (API, N) by ``provider_adapters.anthropic_body`` / ``chat_body``
(the same recorded-format events issue 3's benchmark replays). asyncio streams with no
framework: its own CPU is not what is measured, but it shares the machine, so it stays lean.

    .venv/bin/python bench/_upstream.py [--port 0] [--pace-ms 2]   # prints its base URL
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from provider_adapters import anthropic_body, chat_body

HOLD_SECONDS = 3600.0
MAX_HEADER_BYTES = 64 << 10
MAX_BODY_BYTES = 64 << 20


@functools.cache
def _events(api: str, deltas: int) -> list[bytes]:
    """The SSE events of an answer of ``deltas`` text deltas, each framed as one HTTP chunk."""
    body = (anthropic_body if api == "anthropic" else chat_body)(deltas)
    events = [part + b"\n\n" for part in body.split(b"\n\n") if part.strip()]
    return [b"%x\r\n%s\r\n" % (len(event), event) for event in events]


def _is_delta(api: str, event: bytes) -> bool:
    return (
        b'"text_delta"' in event
        if api == "anthropic"
        else b'"content":"' in event and b'"content":""' not in event
    )


_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)


async def _answer(
    api: str, model: str, writer: asyncio.StreamWriter, reader: asyncio.StreamReader, pace: float
) -> None:
    kind, _, count = model.partition("-")
    if kind == "hold":
        events = _events(api, 1)
        first = next(i for i, event in enumerate(events) if _is_delta(api, event))
        writer.write(_HEAD + b"".join(events[: first + 1]))
        await writer.drain()
        # Until the client hangs up (read returns b"" at EOF).
        with contextlib.suppress(TimeoutError, ConnectionError):
            await asyncio.wait_for(reader.read(1), HOLD_SECONDS)
        writer.close()
        return
    events = _events(api, int(count or 4))
    if kind != "paced":
        writer.write(_HEAD + b"".join(events) + b"0\r\n\r\n")
        await writer.drain()
        return
    writer.write(_HEAD)
    for event in events:
        if _is_delta(api, event):
            await asyncio.sleep(pace)
        writer.write(event)
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, pace: float) -> None:
    try:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                return
            lines = head.decode("latin-1").split("\r\n")
            path = lines[0].split(" ")[1]
            length = 0
            for line in lines[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if length > MAX_BODY_BYTES:
                return
            body = await reader.readexactly(length)
            model = str(orjson.loads(body).get("model", "burst-4")) if body else "burst-4"
            api = "anthropic" if path.rstrip("/").endswith("/messages") else "openai"
            await _answer(api, model, writer, reader, pace)
            if model == "hold":
                return
    except ConnectionError:
        return
    finally:
        writer.close()


async def main() -> None:
    """Serve until killed; print ``http://127.0.0.1:PORT`` once listening."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--pace-ms", type=float, default=2.0)
    args = parser.parse_args()
    pace = args.pace_ms / 1000
    server = await asyncio.start_server(
        lambda r, w: _serve(r, w, pace), "127.0.0.1", args.port, limit=MAX_HEADER_BYTES, backlog=1024
    )
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())
