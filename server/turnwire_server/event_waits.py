"""Waiting for an :class:`asyncio.Event` for a bounded time, the one way every floor does it."""

from __future__ import annotations

import asyncio

__all__ = ["set_within"]


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
