"""A started turn as its callers hold it: its responses to iterate, its cancel, and what happens
when its caller leaves (docs/semantics.md §5)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from turnwire_server.engine.channel import EventChannel
from turnwire_server.engine.stream_log import StreamLog
from turnwire_server.engine.turn import TurnRun
from turnwire_server.engine.turn_base import CancelCause
from turnwire_server.engine.turn_slots import UNCOUNTED, TurnSlots


class TurnHandle:
    """A started turn: iterate it for its responses (each wraps a ``TurnEvent``)."""

    def __init__(
        self,
        run: TurnRun,
        channel: EventChannel[Any],
        task: asyncio.Task[None],
        log: StreamLog,
        *,
        detached: bool = False,
        slots: TurnSlots = UNCOUNTED,
    ) -> None:
        self.run = run
        #: Started without a caller (a submission, a recovery): it runs again after a restart.
        self.detached = detached
        self.channel = channel
        self.task = task
        self.log = log
        self.request_id = run.request.request_id
        self.conversation_id = run.request.conversation_id
        self._slots = slots
        self._free_slot: Callable[[], None] | None = None
        if detached:
            self._hold_slot()

    def __aiter__(self) -> AsyncIterator[Any]:
        return self.channel.__aiter__()

    def cancel(self, stop: BaseException | None = None, *, cause: CancelCause | None = None) -> bool:
        """Cancel the turn; it stores its partial reply and ends with TURN_STATUS_ABORTED
        (``stop``: why, carried in its TurnEnd, e.g. :class:`CancelledByShutdown`; ``cause``: who
        asked for a plain cancel, see :data:`~.turn_base.CancelCause`).

        False when that changes nothing (already stopped, or the reply is being stored).
        """
        return self.run.cancel(stop, cause=cause)

    def detach(self) -> None:
        """The caller left and the turn goes on without it (disconnect policy CONTINUE): its
        events are no longer queued for the call, which no longer slows the turn, and it holds a
        turn slot of its own until it ends (:mod:`~turnwire_server.engine.turn_slots`)."""
        self.channel.detach()
        self._hold_slot()

    def _hold_slot(self) -> None:
        """Count the turn as running without a caller, once, unless it is over already (its
        task's end frees the slot, :meth:`free_slot`)."""
        if self._free_slot is None and not self.task.done() and not self.run.ended:
            self._free_slot = self._slots.hold_turn(self.conversation_id)

    def free_slot(self) -> None:
        """The turn ended: give back the slot :meth:`detach` or a detached start took (if any)."""
        free, self._free_slot = self._free_slot, None
        if free is not None:
            free()

    def release(self) -> None:
        """The caller's stream ended: cancel the turn, or detach it when its request asked
        the turn to continue without its caller (docs/semantics.md §5)."""
        if self.run.request.disconnect == "continue":
            self.detach()
        else:
            self.cancel(cause="caller_left")
