"""A single-consumer event channel between a turn's task and the RPC streaming it.

Cheaper than :class:`asyncio.Queue` on the hot path: ``put`` is a deque append
plus, at most, one future wake-up; the consumer takes everything pending at
once. Unbounded on purpose: a turn never waits on a slow client (model output
is small), and a client that stops reading is cancelled by gRPC.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Generic, TypeVar

T = TypeVar("T")


class EventChannel(Generic[T]):
    """FIFO of items from one producer to one consumer; :meth:`close` ends iteration."""

    __slots__ = ("_closed", "_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False

    def put(self, item: T) -> None:
        """Append ``item`` and wake the consumer if it waits."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def close(self) -> None:
        """No more items; the consumer's iteration ends after the pending ones."""
        self._closed = True
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def __aiter__(self) -> AsyncIterator[T]:
        items = self._items
        while True:
            while items:
                yield items.popleft()
            if self._closed:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
