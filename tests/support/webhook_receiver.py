"""A webhook receiver on loopback for the webhook tests (docs/webhooks.md): records every call
(headers and body) and answers with the statuses it is told, in order; a ``None`` status holds
the call open until :meth:`WebhookReceiver.release` (a replica killed mid-attempt)."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web

__all__ = ["ReceivedCall", "WebhookReceiver", "new_secret", "webhook_receiver"]


def new_secret() -> str:
    """A fresh Standard Webhooks secret: ``whsec_`` and base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode()


@dataclass(frozen=True)
class ReceivedCall:
    """One call as received: its headers (lower-case names) and its body."""

    headers: dict[str, str]
    body: bytes


class WebhookReceiver:
    """See the module docstring. ``statuses``: the answers to the first calls, in order; later
    calls get 200."""

    def __init__(self, statuses: list[int | None]) -> None:
        self.calls: list[ReceivedCall] = []
        self._statuses = list(statuses)
        self._released = asyncio.Event()
        self.url = ""

    def release(self) -> None:
        """Let held calls end (their callers may be gone)."""
        self._released.set()

    async def _handle(self, request: web.Request) -> web.Response:
        self.calls.append(
            ReceivedCall({k.lower(): v for k, v in request.headers.items()}, await request.read())
        )
        status = self._statuses.pop(0) if self._statuses else 200
        if status is None:
            await self._released.wait()
            status = 200
        return web.Response(status=status, text="ok")


@asynccontextmanager
async def webhook_receiver(statuses: list[int | None] | None = None) -> AsyncIterator[WebhookReceiver]:
    """A :class:`WebhookReceiver` listening on 127.0.0.1 (a free port), its URL in ``url``."""
    receiver = WebhookReceiver(statuses or [])
    app = web.Application()
    app.router.add_post("/hook", receiver._handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    receiver.url = f"http://127.0.0.1:{port}/hook"
    try:
        yield receiver
    finally:
        receiver.release()
        await runner.cleanup()
