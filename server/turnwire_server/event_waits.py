"""Waiting for an :class:`asyncio.Event` for a bounded time, and for a cancelled task to end: the
one way every floor does each."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

__all__ = ["CANCEL_AGAIN_SECONDS", "cancelled", "set_within"]

CANCEL_AGAIN_SECONDS = 1.0
"""How long :func:`cancelled` waits for a cancelled task before it cancels it again."""


async def set_within(event: asyncio.Event, seconds: float) -> bool:
    """Wait until ``event`` is set, for at most ``seconds``; whether it is set.

    ``asyncio.timeout``, not ``asyncio.wait_for``: Python 3.11's ``wait_for`` returned as if the
    wait had ended when a cancel of the waiting task landed as it ended, so the cancel was lost
    (a close then waited forever). A cancel always propagates here."""
    try:
        async with asyncio.timeout(seconds):
            await event.wait()
    except TimeoutError:
        return False
    return True


async def cancelled(task: asyncio.Task[Any], again_after: float = CANCEL_AGAIN_SECONDS) -> None:
    """Cancel ``task`` and wait until it has ended; its ``CancelledError`` is not raised, any
    other exception it ended with is.

    A cancel a library swallows leaves the task running: Python 3.11's ``asyncio.wait_for``
    (which ``psycopg_pool`` waits with) returns the awaited result when a cancel lands as the wait
    ends, so a background loop cancelled at that moment went on, and its stopper waited for it
    forever (a worker whose supervisor died kept serving). So ``task`` is cancelled again every
    ``again_after`` seconds until it ends; its own cleanup may be cut short by that, which is
    what a cancel asks anyway. Every stopper of a background task uses this."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=again_after)
    with contextlib.suppress(asyncio.CancelledError):
        task.result()
