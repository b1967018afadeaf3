"""A conversation's line of turns as the engine admits into it (docs/semantics.md §5, new input
while a turn runs): which turn is busy on it, the places taken in the store's line, and the
concurrent-input strategies that decide where a new turn stands.

:class:`~turnwire_server.engine.engine.TurnEngine` owns one :class:`ConversationLine` and hands
it the turns it runs, so that a turn admitted here is seen before the store is asked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping

from turnwire.hooks import ConcurrentInput
from turnwire_server.engine.errors import RequestIdInUse, StoppedByInput, TurnInProgress
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.settings import EngineSettings
from turnwire_server.engine.turn_handle import TurnHandle
from turnwire_server.store.base import EngineStore
from turnwire_server.store.errors import StoreError

__all__ = ["ConversationLine", "LocalBusy", "stop_of", "stop_reason"]

log = logging.getLogger("turnwire.engine")

LocalBusy = Callable[[str, str], "str | None"]
"""``(conversation_id, own_id)``: the request id of a turn admitted in this process on the
conversation and not ended (the one holding its lock first), other than ``own_id``; None when
there is none (``TurnEngine._local_busy``)."""


class ConversationLine:
    """The engine's view of each conversation's line. ``turns``: the turns this process runs or
    queues, by request id (read, never changed here); ``local_busy``: the busy turn among them
    (asked at each call)."""

    def __init__(
        self,
        store: EngineStore,
        settings: EngineSettings,
        turns: Mapping[str, TurnHandle],
        local_busy: LocalBusy,
    ) -> None:
        self._store = store
        self._settings = settings
        self._turns = turns
        self._local_busy = local_busy

    async def busy_turn(self, conversation_id: str, *, own_id: str = "") -> str | None:
        """The request id of a turn running or queued on ``conversation_id`` (the one holding its
        lock when known), here or, through the store, on another replica or as a pending
        submission; None when the conversation is idle. ``own_id`` (a submission whose place is
        already reserved) heading the line counts as idle."""
        local = self._local_busy(conversation_id, own_id)
        if local is not None:
            return local
        head = await self._store.queue_head(conversation_id)
        return None if head == own_id and own_id else head

    async def apply_strategy(self, request: TurnRequest) -> tuple[ConcurrentInput, bool]:
        """Apply the request's concurrent-input strategy (docs/semantics.md §5, new input while a
        turn runs); returns what ``before_turn`` is told and whether the turn's place in line was
        taken already (``Store.reserve_place``: its lock holds from there, or the place is given
        up when the turn ends without it).

        ``enqueue`` does nothing here. ``reject`` is refused (:class:`TurnInProgress`, naming the
        turn) when a turn is admitted here and not ended, else the store takes its place only if
        the conversation is idle, in one step (with PostgreSQL one transaction under the queue's
        lock, so two replicas admitting at once never both see it idle: whichever commits second
        sees the first). ``interrupt`` and ``rollback`` look for a turn running or queued (here
        first, then in the store, which sees the other replicas' turns with PostgreSQL); on a
        busy conversation they take a place first in line *before* stopping the turn holding the
        lock (here, or on its replica through the store), so they run next, ahead of the turns
        already queued, once the stopped turn has stored or removed what it wrote. Turns only
        queued are left alone.
        """
        strategy = request.concurrent_input or self._settings.limits.concurrent_input
        if strategy == "enqueue":
            return ConcurrentInput("enqueue"), False
        conversation_id = request.conversation_id
        if strategy == "reject":
            await self.reserve_if_idle(conversation_id, request.request_id)
            return ConcurrentInput(strategy), True
        head = await self.busy_turn(conversation_id, own_id=request.request_id)
        if head is None:
            return ConcurrentInput(strategy), False
        await self._store.reserve_place(
            conversation_id,
            request.request_id,
            owner=self._settings.replica_id,
            lease_seconds=self._settings.durability.lease_seconds,
            first=True,
        )
        stop = StoppedByInput(request.request_id, rollback=strategy == "rollback")
        local = [h for h in self._turns.values() if h.conversation_id == conversation_id and not h.run.ended]
        for handle in local:
            if handle.run.holds_lock:
                handle.run.cancel(stop)
                return ConcurrentInput(strategy, handle.request_id), True
        holder = await self._store.queue_head(conversation_id)
        if holder is not None and holder != request.request_id and self._turns.get(holder) is None:
            # Held on another replica: its turn is stopped there (TurnEngine.serve_cancel_requests).
            await self._store.request_cancel(holder, stop=stop_reason(stop))
            return ConcurrentInput(strategy, holder), True
        return ConcurrentInput(strategy), True

    async def reserve_if_idle(self, conversation_id: str, request_id: str) -> None:
        """REJECT's admission (docs/semantics.md §5): take ``request_id``'s place in the
        conversation's line only when no turn is admitted here and not ended and, in the store,
        none holds, waits for or reserved the lock (``Store.reserve_place(only_if_idle=True)``:
        one step, so of two replicas admitting at once the one that commits second sees the
        first). Raises :class:`TurnInProgress` naming the turn found (nothing taken), and
        :class:`RequestIdInUse` when a turn runs here under ``request_id``. The turn
        started with ``reserved=True`` takes the place over; a caller that starts none gives it
        up with :meth:`release_place`."""
        if request_id in self._turns:
            raise RequestIdInUse(request_id)
        # No await between the local check and the store's: one step for this process.
        head = self._local_busy(conversation_id, "")
        if head is None:
            head = await self._store.reserve_place(
                conversation_id,
                request_id,
                owner=self._settings.replica_id,
                lease_seconds=self._settings.durability.lease_seconds,
                only_if_idle=True,
            )
        if head is not None:
            raise TurnInProgress(conversation_id, head)

    async def release_place(self, conversation_id: str, request_id: str) -> None:
        """Give up a place :meth:`reserve_if_idle` took for a turn that is not started after all,
        or that a turn never took over (never raises: a failure is logged)."""
        await asyncio.shield(self._release_place(conversation_id, request_id))

    async def _release_place(self, conversation_id: str, request_id: str) -> None:
        """``Store.release_place``, logged instead of raised (a turn ending must not fail on it;
        the store retries a release the database did not take)."""
        try:
            await self._store.release_place(conversation_id, request_id)
        except StoreError as error:
            log.error("giving up the place in line of %s failed: %s", request_id, error)


def stop_reason(stop: StoppedByInput) -> str:
    """``stop`` as the reason a cancel request carries to another replica (``Store.request_cancel``),
    read back by :func:`stop_of`."""
    return f"{'rollback' if stop.rollback else 'interrupt'}:{stop.interrupting_request_id}"


def stop_of(reason: str) -> StoppedByInput | None:
    """The stop a cancel request's reason names (:func:`stop_reason`); None: a plain cancel
    (``CancelChat``)."""
    kind, _, request_id = reason.partition(":")
    if kind in ("interrupt", "rollback") and request_id:
        return StoppedByInput(request_id, rollback=kind == "rollback")
    return None
