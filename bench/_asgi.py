"""One HTTP request through an ASGI app in process (no socket, no HTTP parsing): what the door
benchmarks (``http_door.py``, ``openai_door.py``) time as the door's own cost."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any


async def asgi_post(
    app: Any,
    path: str,
    body: bytes,
    *,
    content_type: str = "application/json",
    token: str = "x",
    headers: Sequence[tuple[str, str]] = (),
) -> int:
    """POST ``body`` to ``path`` of the ASGI ``app`` (HTTP/1.1, bearer ``token``, and ``headers``);
    returns the response body's size in bytes. The request body comes in one message; the app's later
    ``receive`` waits (no disconnect), as a client holding the stream open would."""
    sent: list[bytes] = []
    done = False

    async def receive() -> dict[str, Any]:
        nonlocal done
        if done:
            await asyncio.Event().wait()
        done = True
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            sent.append(message.get("body", b""))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", content_type.encode()),
            (b"authorization", f"Bearer {token}".encode()),
            *((name.encode(), value.encode()) for name, value in headers),
        ],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8080),
        "extensions": {},
    }
    await app(scope, receive, send)
    return sum(len(chunk) for chunk in sent)
