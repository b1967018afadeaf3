"""Checkpoints of a streaming reply: at least every ``interval`` while output arrives.

A crash loses at most about one interval of output (docs/semantics.md
§8). Writes never block the stream: one checkpoint is in flight at a
time; progress made meanwhile is written as soon as it lands, and a trailing
timer catches output followed by a pause. :meth:`Checkpointer.close` stops all
of it before the final write, so no late checkpoint can overwrite it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from turnwire_client.v1 import message_pb2
from turnwire_server.store.errors import LeaseLost

log = logging.getLogger("turnwire.checkpoints")


class Checkpointer:
    """Schedules ``save(snapshot())`` calls for one turn.

    ``snapshot`` returns a copy of the reply so far, or None when there is
    nothing to store yet; ``interval`` is in seconds. ``lost`` is told when a write
    was refused because another replica took the turn over (``LeaseLost``,
    docs/semantics.md §5, "Fencing"); checkpointing stops then.
    """

    def __init__(
        self,
        save: Callable[[message_pb2.Message], Awaitable[None]],
        snapshot: Callable[[], message_pb2.Message | None],
        interval: float,
        name: str,
        lost: Callable[[LeaseLost], None] | None = None,
    ) -> None:
        self._save = save
        self._lost = lost
        self._snapshot = snapshot
        self._interval = interval
        self._name = name
        self._last = time.monotonic()
        self._in_flight: asyncio.Task[None] | None = None
        self._dirty = False
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False

    def progress(self) -> None:
        """The reply changed: write it now if the interval has passed, else arm the trailing timer.

        Cheap enough to call per chunk: one clock read unless a write is due.
        """
        elapsed = time.monotonic() - self._last
        if elapsed >= self._interval:
            self.now()
        elif self._timer is None and not self._closed:
            self._timer = asyncio.get_running_loop().call_later(self._interval - elapsed, self.now)

    def now(self) -> None:
        """Write the current state without waiting (coalesced with a write in flight)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._closed:
            return
        self._last = time.monotonic()
        if self._in_flight is not None and not self._in_flight.done():
            self._dirty = True
            return
        snapshot = self._snapshot()
        if snapshot is None:
            return
        self._dirty = False
        # The save function goes with the write: a detach before the task runs does not stop it.
        write = self._write(self._save, snapshot)
        self._in_flight = asyncio.create_task(write, name=f"checkpoint {self._name}")

    async def take(self) -> message_pb2.Message | None:
        """The reply so far, for another write of the turn to store as this checkpoint (a
        step's budget charge), once the checkpoint in flight (if any) is stored, so the other
        write lands after it (grouped and other writes are not ordered among themselves on
        PostgreSQL): counts as a checkpoint written now. None when there is nothing to store or
        checkpointing stopped."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._dirty = False  # the write in flight is not followed by another: the caller's is
        while self._in_flight is not None and not self._in_flight.done():
            await asyncio.shield(self._in_flight)
        if self._closed:
            return None
        self._last = time.monotonic()
        return self._snapshot()

    async def store_now(self) -> bool:
        """Store the reply as it is now and return once it is stored: the checkpoint that carries
        a step's tool calls marked ``started`` before they run (docs/semantics.md §8, "Tool
        effects"); it counts as the interval's checkpoint (one write for all the step's calls).
        False when nothing was stored because checkpointing stopped (the turn is ending, or
        another replica took it over: ``lost`` is told). Raises what the store raised."""
        snapshot = await self.take()
        if snapshot is None:
            return False
        try:
            await self._save(snapshot)
        except LeaseLost as error:
            self._closed = True
            if self._lost is not None:
                self._lost(error)
            return False
        return True

    async def _write(
        self, save: Callable[[message_pb2.Message], Awaitable[None]], snapshot: message_pb2.Message
    ) -> None:
        try:
            await save(snapshot)
        except LeaseLost as error:  # another replica runs the turn: nothing more of it here
            self._closed = True
            if self._lost is not None:
                self._lost(error)
            return
        except Exception as error:  # the final write reports store failures
            log.warning("checkpoint of %s failed: %s", self._name, error)
        if self._dirty and not self._closed:
            self._in_flight = None
            self.now()

    async def close(self) -> None:
        """Stop checkpointing and wait for the write in flight (its errors are logged, not raised);
        then :meth:`detach`."""
        self._stop()
        while self._in_flight is not None and not self._in_flight.done():
            await asyncio.shield(self._in_flight)
        self.detach()

    def detach(self) -> None:
        """Stop checkpointing without waiting (a write already started finishes; a refusal of it
        is reported to no one) and drop the callbacks: they lead back to the turn that holds this
        checkpointer, and kept, the turn's objects would wait for the cycle collector instead of
        going when it ends (docs/architecture.md, "A turn's objects"). The turn calls it as it
        ends, whichever way it ended."""
        self._stop()
        self._save, self._snapshot, self._lost = _closed_save, _nothing, None

    def _stop(self) -> None:
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def _closed_save(message: message_pb2.Message) -> None:
    raise RuntimeError("a closed Checkpointer saves nothing")


def _nothing() -> None:
    return None
