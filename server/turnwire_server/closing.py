"""The last step of a stop: closing the sidecar's connections within the stop's deadline.

docs/operate/stopping.md: a supervisor waits ``limits.drain_seconds +
limits.shutdown_grace_seconds + 5`` s before it kills the process. Once the turns have ended, the
connections (remote hook servers, tool hosts, MCP servers, the store, the providers' clients) are
closed at once, side by side, within what is left of that deadline, at least
:data:`CLOSE_FLOOR_SECONDS`: a close that outlives it (a tool host that never answers) is
cancelled and logged, and the stop goes on, so nothing another process does can hold the exit.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

log = logging.getLogger("turnwire.server")

__all__ = ["CLOSE_FLOOR_SECONDS", "close_within"]

CLOSE_FLOOR_SECONDS = 1.0
"""Seconds the closes get even when the turns used the whole deadline: a healthy connection
closes in milliseconds, and a close cut off at once would drop what it still had to send."""


async def close_within(
    closes: Sequence[tuple[str, Callable[[], Awaitable[None]]]], deadline: float
) -> list[str]:
    """Run every close of ``closes`` (pairs: what it closes, the close) at once until ``deadline`` (the
    running loop's clock, :meth:`asyncio.AbstractEventLoop.time`; at least
    :data:`CLOSE_FLOOR_SECONDS` from now). One that fails is logged; one still running then is
    cancelled (not waited for: a task that ignores the cancel cannot hold the stop) and logged.
    Returns what did not close in time, in ``closes``' order. Never raises but for the caller's
    own cancellation."""
    if not closes:
        return []
    loop = asyncio.get_running_loop()
    tasks = [(what, asyncio.ensure_future(close())) for what, close in closes]
    seconds = max(deadline - loop.time(), CLOSE_FLOOR_SECONDS)
    await asyncio.wait([task for _, task in tasks], timeout=seconds)
    late: list[str] = []
    for what, task in tasks:
        if not task.done():
            task.cancel()
            late.append(what)
            log.warning(
                "shutdown: closing %s did not end within %.1f s (the stop's deadline); cancelled it",
                what,
                seconds,
            )
        elif not task.cancelled() and (error := task.exception()) is not None:
            log.warning("shutdown: closing %s failed: %s: %s", what, type(error).__name__, error)
    return late
