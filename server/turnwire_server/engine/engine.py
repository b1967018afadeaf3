"""The turn engine: admission, the running-turn registry, cancellation, drain, recovery.

It knows only interfaces: a :class:`~turnwire_server.store.base.Store`, a
:class:`~turnwire_server.providers.registry.ProviderRegistry`,
:class:`~turnwire.tools.Tool`s and a
:class:`~turnwire_server.hooks.chain.MiddlewareChain`. It raises domain errors
(:mod:`turnwire_server.engine.errors`); the API layer maps them to statuses.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import datetime as dt
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any

from turnwire.tools import Tool
from turnwire_server.engine.channel import EventChannel
from turnwire_server.engine.errors import (
    ConversationDeleted,
    NestedTurn,
    QueueFull,
    RequestIdInUse,
    ShuttingDown,
)
from turnwire_server.engine.events import EventWriter
from turnwire_server.engine.request import EngineSettings, TurnRequest
from turnwire_server.engine.transcript import repair_unresolved_tool_calls
from turnwire_server.engine.turn import ErrorStatus, TurnRun
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.base import Store

log = logging.getLogger("turnwire.engine")

_current_turn: contextvars.ContextVar[TurnRun | None] = contextvars.ContextVar(
    "turnwire_current_turn", default=None
)


class TurnHandle:
    """A started turn: iterate it for its responses (each wraps a ``TurnEvent``)."""

    def __init__(self, run: TurnRun, channel: EventChannel[Any], task: asyncio.Task[None]) -> None:
        self.run = run
        self.channel = channel
        self.task = task
        self.request_id = run.request.request_id
        self.conversation_id = run.request.conversation_id

    def __aiter__(self) -> AsyncIterator[Any]:
        return self.channel.__aiter__()

    def cancel(self) -> bool:
        """Cancel the turn; it stores its partial reply and ends with TURN_STATUS_ABORTED.

        False when that changes nothing (already stopped, or the reply is being stored).
        """
        return self.run.cancel()


class TurnEngine:
    """Starts, tracks and cancels turns.

    :meth:`start` raises a domain error when a turn cannot be admitted:
    :class:`~turnwire_server.engine.errors.ShuttingDown`,
    :class:`~turnwire_server.engine.errors.RequestIdInUse`,
    :class:`~turnwire_server.engine.errors.QueueFull`,
    :class:`~turnwire_server.engine.errors.NestedTurn` (a blocking turn inside
    an active turn of the same conversation), or
    :class:`~turnwire_server.providers.registry.UnknownModel`.
    ``error_status`` maps a turn's error to the status in its TurnEnd event.
    """

    def __init__(
        self,
        *,
        store: Store,
        providers: ProviderRegistry,
        tools: Mapping[str, Tool],
        chain: MiddlewareChain,
        settings: EngineSettings,
        error_status: ErrorStatus,
    ) -> None:
        self.store = store
        self.error_status = error_status
        self.providers = providers
        self.tools = dict(tools)
        self.chain = chain
        self.settings = settings
        self._turns: dict[str, TurnHandle] = {}
        self._queued: Counter[str] = Counter()
        self._accepting = True

    @property
    def running(self) -> int:
        """Turns started and not yet ended (queued ones included)."""
        return len(self._turns)

    def start(self, request: TurnRequest, *, parent_request_id: str = "") -> TurnHandle:
        """Admit ``request`` and start its turn in a new task (it queues for the conversation's lock)."""
        self._admit(request, parent_request_id)
        channel: EventChannel[Any] = EventChannel(self.settings.stream_buffer_events)
        writer = EventWriter(
            request.conversation_id,
            request.request_id,
            request.response_type,
            channel,
            self.settings.text_coalesce_ms,
        )
        conversation_id = request.conversation_id
        self._queued[conversation_id] += 1
        acquired = False

        def on_lock_acquired() -> None:
            nonlocal acquired
            acquired = True
            self._dequeue(conversation_id)

        run = TurnRun(
            request,
            store=self.store,
            providers=self.providers,
            tools=self.tools,
            chain=self.chain,
            settings=self.settings,
            writer=writer,
            error_status=self.error_status,
            on_lock_acquired=on_lock_acquired,
        )

        async def main() -> None:
            _current_turn.set(run)
            try:
                await run.run()
            finally:
                if not acquired:
                    self._dequeue(conversation_id)
                self._turns.pop(request.request_id, None)

        task = asyncio.create_task(main(), name=f"turn {request.request_id}")
        handle = TurnHandle(run, channel, task)
        self._turns[request.request_id] = handle
        return handle

    def _dequeue(self, conversation_id: str) -> None:
        self._queued[conversation_id] -= 1
        if self._queued[conversation_id] <= 0:
            del self._queued[conversation_id]

    def _admit(self, request: TurnRequest, parent_request_id: str) -> None:
        if not self._accepting:
            raise ShuttingDown()
        if request.request_id in self._turns:
            raise RequestIdInUse(request.request_id)
        current = _current_turn.get()
        parent = self._turns.get(parent_request_id) if parent_request_id else None
        for active in (current, parent.run if parent is not None else None):
            if (
                active is not None
                and not active.lock_released
                and active.request.conversation_id == request.conversation_id
            ):
                raise NestedTurn(active.request.request_id)
        limit = self.settings.max_queued_turns_per_conversation
        if self._queued[request.conversation_id] >= limit:
            raise QueueFull(request.conversation_id, limit)
        self.providers.resolve(request.model)  # UnknownModel before anything is stored

    def cancel(self, request_id: str) -> bool:
        """Cancel a running or queued turn; False when none has that id (a no-op)."""
        handle = self._turns.get(request_id)
        return handle is not None and handle.cancel()

    def active_turns(self, conversation_id: str) -> int:
        """How many turns of ``conversation_id`` are started and not yet ended (queued included)."""
        return sum(1 for handle in self._turns.values() if handle.conversation_id == conversation_id)

    async def cancel_conversation(self, conversation_id: str) -> int:
        """Stop every running or queued turn of ``conversation_id`` and wait until each has ended.

        For deleting the conversation (docs/semantics.md §12, deleting): each turn ends
        ``ABORTED`` with reason ``CONVERSATION_DELETED`` (or ``INPUT_NOT_STORED`` when its input
        was not stored yet), after its final write, so nothing of it is written once this
        returns. Turns admitted while it waits are stopped too. Returns how many turns it waited
        for (0: none was active).
        """
        ended = 0
        while handles := [h for h in self._turns.values() if h.conversation_id == conversation_id]:
            for handle in handles:
                handle.run.cancel(ConversationDeleted(conversation_id))
            await asyncio.wait([handle.task for handle in handles])
            ended += len(handles)
        return ended

    async def drain(self, grace_seconds: float) -> None:
        """Stop admitting; let running turns finish for ``grace_seconds``, then cancel the rest
        (they store their partial replies) and wait for them to end."""
        self._accepting = False
        handles = {h.task: h for h in self._turns.values()}
        if not handles:
            return
        _, pending = await asyncio.wait(handles, timeout=grace_seconds)
        for task in pending:
            handles[task].cancel()
        if pending:
            log.warning(
                "shutdown: cancelled %d turn(s) still running after %.1f s",
                len(pending),
                grace_seconds,
            )
            await asyncio.wait(pending)

    async def recover(self) -> int:
        """After a crash: end every turn still recorded as running as ``interrupted``.

        Its checkpointed reply stays stored, with tool calls that have no result
        given an errored one. Returns how many turns were recovered.
        """
        turns = await self.store.running_turns()
        for turn in turns:
            messages = await self.store.load_messages(turn.conversation_id)
            reply = next((m for m in messages if m.id == turn.assistant_message_id), None)
            if reply is not None:
                repair_unresolved_tool_calls([reply])
            record = dataclasses.replace(
                turn,
                state="interrupted",
                end_time=dt.datetime.now(dt.UTC),
                recovery_count=turn.recovery_count + 1,
            )
            await self.store.finish_turn(record, reply)
            log.warning(
                "recovered turn %s of conversation %s as interrupted (reply %s)",
                turn.request_id,
                turn.conversation_id,
                "kept" if reply is not None else "none",
            )
        return len(turns)
