"""The maintenance loop: retention of conversations and stored turn events, and expiry hooks.

docs/semantics.md §12 (deleting, retention). Every ``interval_seconds`` one sweep:

a. deletes conversations not updated for ``conversation_retention_seconds`` that have no
   running turn, the way ``DeleteConversation`` does
   (:func:`~turnwire_server.engine.deletion.delete_conversation`);
b. expires stored turn events: the events of streams that ended more than
   ``event_retention_seconds`` ago are deleted and the streams marked ``events_expired`` (the
   stream row stays, so a resume can say it is past retention);
c. runs the registered sweep hooks (:data:`SweepHook`), which other features use to expire
   their own pending data (client tool calls, approvals, submissions).

A retention of 0 turns that part off. Work per sweep is bounded: at most ``batch_size``
conversations (each deleted in its own transaction) and ``max_event_batches`` transactions of
at most ``batch_size`` streams each, so a sweep never holds the store's writer for long. What a
sweep removed is logged at info when nonzero; a part that fails is logged and the others run.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable

from turnwire_server.engine.deletion import delete_conversation
from turnwire_server.engine.engine import TurnEngine
from turnwire_server.engine.subagents import is_child
from turnwire_server.event_waits import cancelled

log = logging.getLogger("turnwire.maintenance")

SweepHook = Callable[[dt.datetime], Awaitable[int]]
"""``hook(now) -> int``: expire what is due at ``now`` (tz-aware UTC); returns how many items it
removed or expired (logged when nonzero)."""

CONVERSATIONS = "conversations"
"""The sweep's name for deleted conversations (a key of :meth:`Maintenance.sweep`'s result)."""
EVENT_STREAMS = "event_streams"
"""The sweep's name for turn streams whose events expired."""


class Maintenance:
    """Runs retention and the registered expiry hooks every ``interval_seconds`` in a background
    task (:meth:`start`, :meth:`stop`), or once with :meth:`sweep`.

    Times are in seconds; a retention of 0 is off. ``batch_size`` (>= 1) bounds the rows of one
    transaction, ``max_event_batches`` (>= 1) the event transactions of one sweep. Raises
    :class:`ValueError` for a non-positive interval, batch size or batch count, or a negative
    retention.
    """

    def __init__(
        self,
        engine: TurnEngine,
        *,
        interval_seconds: float,
        conversation_retention_seconds: float,
        event_retention_seconds: float,
        hooks: dict[str, SweepHook] | None = None,
        batch_size: int = 500,
        max_event_batches: int = 10,
    ) -> None:
        if interval_seconds <= 0 or batch_size < 1 or max_event_batches < 1:
            raise ValueError("interval_seconds, batch_size and max_event_batches must be positive")
        if conversation_retention_seconds < 0 or event_retention_seconds < 0:
            raise ValueError("retention times must be >= 0 (0: off)")
        self.engine = engine
        self.interval_seconds = interval_seconds
        self.conversation_retention_seconds = conversation_retention_seconds
        self.event_retention_seconds = event_retention_seconds
        self.batch_size = batch_size
        self.max_event_batches = max_event_batches
        self._hooks: dict[str, SweepHook] = dict(hooks or {})
        self._task: asyncio.Task[None] | None = None

    def add_hook(self, name: str, hook: SweepHook) -> None:
        """Run ``hook`` in every sweep after retention, under ``name`` (in logs and in the result
        of :meth:`sweep`). Raises :class:`ValueError` when ``name`` is taken."""
        if name in self._hooks or name in (CONVERSATIONS, EVENT_STREAMS):
            raise ValueError(f"a sweep hook named {name!r} is already registered")
        self._hooks[name] = hook

    def start(self) -> None:
        """Start the background loop: a sweep now, then one every ``interval_seconds``. Idempotent."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="turnwire maintenance")

    async def stop(self) -> None:
        """Stop the loop; a sweep in progress is cancelled between (or inside) its writes, each of
        which is its own transaction. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            await cancelled(task)

    async def _run(self) -> None:
        while True:
            await self.sweep()
            await asyncio.sleep(self.interval_seconds)

    async def sweep(self, now: dt.datetime | None = None) -> dict[str, int]:
        """One sweep at ``now`` (default: the current time, tz-aware UTC). Returns how many items
        each part removed, by name (``conversations``, ``event_streams``, then each hook's name);
        a part that failed is left out (its error is logged)."""
        now = now or dt.datetime.now(dt.UTC)
        parts: list[tuple[str, Callable[[], Awaitable[int]]]] = []
        if self.conversation_retention_seconds > 0:
            parts.append((CONVERSATIONS, lambda: self._expire_conversations(now)))
        if self.event_retention_seconds > 0:
            parts.append((EVENT_STREAMS, lambda: self._expire_events(now)))
        for name, hook in list(self._hooks.items()):
            parts.append((name, functools.partial(hook, now)))
        removed: dict[str, int] = {}
        for name, part in parts:
            try:
                removed[name] = await part()
            except Exception:
                log.exception("maintenance: %s failed; the next sweep tries again", name)
        if any(removed.values()):
            log.info(
                "maintenance sweep removed %s",
                ", ".join(f"{count} {name}" for name, count in removed.items() if count),
            )
        return removed

    async def _expire_conversations(self, now: dt.datetime) -> int:
        before = now - dt.timedelta(seconds=self.conversation_retention_seconds)
        candidates = await self.engine.store.expired_conversations(before, self.batch_size)
        deleted = 0
        for conversation_id in candidates:
            if is_child(conversation_id):  # a sub-agent's: it goes with its parent (docs/subagents.md)
                continue
            if await delete_conversation(self.engine, conversation_id, updated_before=before):
                deleted += 1
        return deleted

    async def _expire_events(self, now: dt.datetime) -> int:
        before = now - dt.timedelta(seconds=self.event_retention_seconds)
        expired = 0
        for _ in range(self.max_event_batches):
            count = await self.engine.store.expire_events(before, self.batch_size)
            expired += count
            if count < self.batch_size:
                break
        return expired
