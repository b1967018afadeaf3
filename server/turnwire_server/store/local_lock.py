"""In-process per-conversation turn locks for single-process store backends."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager


class _Entry:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        # Holder plus waiters; asyncio.Lock does not expose its waiter count.
        self.users = 0


class LocalTurnLocks:
    """One :class:`asyncio.Lock` per key (conversation id), created on demand.

    Waiters acquire in arrival order (``asyncio.Lock`` wakes them FIFO). A
    key's lock is dropped as soon as nobody holds or waits for it, so the
    table holds only conversations with a turn running or queued. Locks are
    bound to the running event loop and protect nothing across processes.
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def __len__(self) -> int:
        """The number of keys currently held or waited for."""
        return len(self._entries)

    def hold(self, key: str) -> AbstractAsyncContextManager[None]:
        """Async context manager holding ``key``'s lock for the ``async with`` body.

        Waits (FIFO) while another task holds it. Cancelling a waiting task
        leaves the queue cleanly. Not reentrant: a task holding ``key`` that
        enters ``hold(key)`` again deadlocks.
        """
        return self._hold(key)

    @asynccontextmanager
    async def _hold(self, key: str) -> AsyncIterator[None]:
        entry = self._entries.get(key)
        if entry is None:
            entry = self._entries[key] = _Entry()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0:
                del self._entries[key]
