"""A single-consumer event channel between a turn's task and the RPC streaming it.

Cheaper than :class:`asyncio.Queue` on the hot path: ``put`` is a deque append
plus, at most, one future wake-up, and never blocks (events are filled in place
right after). Bounded by cooperation instead: past ``high_water`` items the
channel is :attr:`~EventChannel.backlogged`, and the producer awaits
:meth:`~EventChannel.drained` at its next safe point (the next model chunk or
tool result), which returns once the consumer has taken the backlog down to half
(docs/semantics.md §5, backpressure). A client that stops reading therefore holds
at most about ``high_water`` events in the server, not the whole reply.

The backlog counts events as the producer made them: an item the producer grew in place
while it was still unread (:meth:`~EventChannel.last_unread`, :meth:`~EventChannel.grew`:
text deltas merged for a writer that is behind) counts once per event merged into it, so
merging never lets a reader that stopped hold more than before.

A consumer that sends several items in one message takes every item ready at once
(:meth:`~EventChannel.batches`: event batches, docs/semantics.md §10).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class EventChannel(Generic[T]):
    """FIFO of items from one producer to one consumer; :meth:`close` ends iteration.

    ``high_water`` (items; 0: unbounded) is the backlog past which the producer should wait.
    """

    __slots__ = (
        "_backlog",
        "_closed",
        "_detached",
        "_drain_waiter",
        "_high_water",
        "_items",
        "_low_water",
        "_merged",
        "_take",
        "_waiter",
        "_watch",
        "detached_by",
    )

    def __init__(self, high_water: int = 0) -> None:
        self._items: deque[T] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._drain_waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._detached = False
        self.detached_by: BaseException | None = None
        self._high_water = high_water
        self._low_water = high_water // 2
        self._watch: tuple[T, Callable[[], None]] | None = None
        self._take: tuple[T, asyncio.Future[None]] | None = None
        self._backlog = 0  # events the unread items stand for (merged ones included)
        self._merged: dict[int, int] = {}  # id(unread item) -> events merged into it

    @property
    def backlogged(self) -> bool:
        """True when the consumer is ``high_water`` events or more behind."""
        return 0 < self._high_water <= self._backlog

    def last_unread(self) -> T | None:
        """The item put last, while the consumer has not taken it yet (else None): the one item the
        producer may still grow in place (then it calls :meth:`grew`)."""
        items = self._items
        return items[-1] if items else None

    def grew(self) -> None:
        """The producer merged one more event into :meth:`last_unread`'s item (it counts in the
        backlog until that item is taken)."""
        key = id(self._items[-1])
        self._merged[key] = self._merged.get(key, 0) + 1
        self._backlog += 1

    async def drained(self) -> None:
        """Wait until the backlog is down to half of ``high_water`` (at once when it is)."""
        if self._backlog <= self._low_water:
            return
        self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await self._drain_waiter
        finally:
            self._drain_waiter = None

    async def taken(self, timeout_seconds: float) -> None:
        """Wait until the consumer has taken the item put last, for at most ``timeout_seconds``
        (at once when nothing is queued; on :meth:`detach` or :meth:`close`). For an RPC, its
        write has then started: a producer that would go on working without awaiting anything
        lets the item reach the wire first (a turn's first token, step_stream.py)."""
        items = self._items
        if not items:
            return
        loop = asyncio.get_running_loop()
        take = self._take = (items[-1], loop.create_future())
        handle = loop.call_later(timeout_seconds, _release, take[1])
        try:
            await take[1]
        finally:
            handle.cancel()
            self._take = None

    def detach(self, reason: BaseException | None = None) -> None:
        """Let the consumer go for good (disconnect policy CONTINUE): drop what is queued and every
        later item, never report a backlog, release a producer waiting for the drain, and end the
        consumer's iteration. ``reason`` (kept in :attr:`detached_by`) says why when the
        producer let a consumer that is still there go (it read too slowly)."""
        self._detached = True
        self.detached_by = reason
        self._items.clear()
        self._merged.clear()
        self._backlog = 0
        waiter = self._drain_waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        self.close()

    def put(self, item: T) -> None:
        """Append ``item`` and wake the consumer if it waits (dropped once detached)."""
        if self._detached:
            return
        self._items.append(item)
        self._backlog += 1
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def when_taken(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the event loop's next round once the consumer has taken the last
        item queued now and comes back for more (for an RPC: that item was sent), at once when
        nothing is queued; never when the consumer does not come back (detached, gone). One
        callback at a time: a later one replaces it."""
        if self._items:
            self._watch = (self._items[-1], callback)
        else:
            asyncio.get_running_loop().call_soon(callback)

    def close(self) -> None:
        """No more items; the consumer's iteration ends after the pending ones."""
        self._closed = True
        if self._take is not None:
            _release(self._take[1])
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def __aiter__(self) -> AsyncIterator[T]:
        items = self._items
        while True:
            while items:
                item = self._took(items.popleft())
                yield item
                watch = self._watch
                if watch is not None and watch[0] is item:
                    self._watch = None
                    asyncio.get_running_loop().call_soon(watch[1])
            if self._closed:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    async def batches(
        self, max_items: int, max_bytes: int, size: Callable[[T], int]
    ) -> AsyncIterator[list[T]]:
        """Iterate as ``async for`` does, but take every item that is ready at once, in order, as
        one list: for a consumer that sends several items in one message (event batches,
        docs/semantics.md §10). A list holds at least one item, at most ``max_items``, and more
        than one only while their ``size`` (bytes) adds up to at most ``max_bytes``."""
        items = self._items
        while True:
            while items:
                batch = [self._took(items.popleft())]
                if items and max_items > 1:  # sizes only when a second item could join
                    total = size(batch[0])
                    while items and len(batch) < max_items:
                        total += size(items[0])
                        if total > max_bytes:
                            break
                        batch.append(self._took(items.popleft()))
                yield batch
                watch = self._watch
                if watch is not None and any(item is watch[0] for item in batch):
                    self._watch = None
                    asyncio.get_running_loop().call_soon(watch[1])
            if self._closed:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter

    def _took(self, item: T) -> T:
        """Bookkeeping of ``item`` taken by the consumer: the backlog, a producer waiting for the
        drain or for this item (:meth:`taken`)."""
        merged = self._merged
        self._backlog -= merged.pop(id(item), 0) + 1 if merged else 1
        drain_waiter = self._drain_waiter
        if drain_waiter is not None and self._backlog <= self._low_water and not drain_waiter.done():
            drain_waiter.set_result(None)
        take = self._take
        if take is not None and take[0] is item:
            _release(take[1])
        return item


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
