"""A turn's final write waits out a store outage (issue 34, docs/operate/outages.md).

Events and checkpoints already survive a store that fails for a while (kept in memory, retried
by the next batch); the final write (the reply, the turn's end, its last events) is the one a
turn cannot go on without. When it fails because the store is unavailable (a retryable
:class:`~turnwire_server.store.errors.StoreError`: the database restarting or cut off, a full
disk), it is retried with backoff for up to ``durability.store_outage_seconds``; the turn ends
once it is stored, so its caller gets the turn's real end instead of an error that leaves the
turn running in the store. A refusal (:class:`~turnwire_server.store.errors.StoreRefusal`) and a
longer outage are raised as they are: a refusal answers the write itself, and the same write gets
the same answer. That holds for the refusals a *client* may retry too (``LeaseLost``: the turn
went on elsewhere, and a lost lease does not come back; retried, the caller would wait out the
whole patience before hearing so).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from turnwire_server.event_waits import set_within
from turnwire_server.store.errors import StoreError, StoreRefusal

__all__ = ["until_stored"]

log = logging.getLogger("turnwire.engine")

T = TypeVar("T")

_BACKOFF_SECONDS: Final = (0.2, 0.5, 1.0, 2.0)
"""Waits between attempts (the last one repeats): the store refuses at once while it knows the
database is gone, so an attempt costs a log line, not a connection timeout."""


async def until_stored(
    write: Callable[[], Awaitable[T]],
    *,
    patience_seconds: float,
    what: str,
    retry_on: type[StoreError] = StoreError,
    give_up: asyncio.Event | None = None,
) -> T:
    """``await write()``, retried while it raises a retryable ``retry_on`` (a
    :class:`StoreError` kind) that is not a :class:`StoreRefusal`, and less than
    ``patience_seconds`` (seconds, >= 0; 0: one attempt) passed since the first failure, and
    ``give_up`` is not set (it ends the wait between attempts at once: a stop signal during a
    start that waits for the database). ``what`` names the write in the log. Raises the last
    error otherwise (and any other error at once)."""
    started: float | None = None
    attempt = 0
    while True:
        try:
            return await write()
        except StoreError as error:
            if not error.retryable or not isinstance(error, retry_on) or isinstance(error, StoreRefusal):
                raise
            now = time.monotonic()
            if started is None:
                started = now
                log.warning("%s failed (%s); retrying for up to %.0f s", what, error, patience_seconds)
            if now - started >= patience_seconds or (give_up is not None and give_up.is_set()):
                raise
            delay = _BACKOFF_SECONDS[min(attempt, len(_BACKOFF_SECONDS) - 1)]
            if give_up is None:
                await asyncio.sleep(delay)
            elif await set_within(give_up, delay):
                raise
            attempt += 1
