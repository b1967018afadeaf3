"""Builds a turn's stream of ``TurnEvent``s: ids, sequence numbers, text coalescing.

Events are written straight into the RPC's response message (``ChatResponse``,
``SaveMessagesResponse`` …, all of which wrap ``TurnEvent`` in field
``event``), so an event is built once and never copied.

Coalescing (``coalesce_ms`` > 0, off by default): consecutive deltas of the
same text or reasoning block that arrive within the window are sent as one
delta. The concatenated text is identical, so what the client reconstructs
does not change; only the number of messages does.

Merging (always, when coalescing is off; issues 17 and 33): a delta whose block's previous
delta is still unread in the channel (the RPC's writer has not taken it: the server read both
in one piece, or the writer is behind, busy writing earlier events) is appended to that one
instead of becoming an event of its own, up to :data:`MERGE_LIMIT` characters and
:data:`MERGE_BUDGET` merged deltas per turn: one message and one gRPC write instead of
several (a gRPC message costs the sidecar more CPU than the rest of a chunk's path, bench/ttft.md).
Nothing waits for it: a delta the writer can take at once is sent as it came.
Numbering stays gap-free, and the stream log stores the merged event, never a version a
reader was sent before it grew (:meth:`StreamLog.amendable`), so a resume from its
sequence number continues exactly after it (docs/semantics.md §10, §8).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from turnwire_client.v1 import event_pb2
from turnwire_server.engine.channel import EventChannel
from turnwire_server.engine.stream_log import StreamLog

MERGE_LIMIT = 1024
"""Characters a merged delta may reach (:class:`EventWriter`): bounds the copying of an
in-place append and what one queued event holds."""

MERGE_BUDGET = 4096
"""Deltas a turn's stream may merge into earlier ones, in all. gRPC takes a fixed number of
bytes from a client that reads nothing (~56,000 small deltas) before writes wait; merged deltas
pack more text into those bytes, so without a bound a reply of that size would pass below a
stopped reader unnoticed instead of backing up and being stopped (SLOW_CONSUMER, docs/semantics.md
§5). With it, merging moves that point by at most this many deltas."""


class TurnResponse(Protocol):
    """Any response message whose field ``event`` is a ``TurnEvent``."""

    @property
    def event(self) -> event_pb2.TurnEvent:
        """The wrapped event."""
        ...


class DetachedResponse:
    """The response wrapper of a turn no RPC streams (a submission, a recovery): only ``event``."""

    __slots__ = ("event",)

    def __init__(self) -> None:
        self.event = event_pb2.TurnEvent()


class EventWriter:
    """Numbers and sends one turn's events to its :class:`EventChannel`.

    ``response_type`` is the RPC's response class; ``log`` (when given) gets every event
    too (resumable streams). Every method that sends an
    event returns the ``TurnEvent`` inside it (already queued) so the caller
    can fill its payload in place before the consumer runs.
    """

    __slots__ = (
        "_coalesce",
        "_flush_handle",
        "_last_delta",
        "_last_delta_id",
        "_merge_budget",
        "_pending",
        "_pending_id",
        "_pending_kind",
        "_pending_start",
        "_response_type",
        "channel",
        "conversation_id",
        "log",
        "request_id",
        "sequence_number",
    )

    def __init__(
        self,
        conversation_id: str,
        request_id: str,
        response_type: Callable[[], Any],
        channel: EventChannel[Any],
        coalesce_ms: float = 0.0,
        *,
        log: StreamLog | None = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.log = log
        self.request_id = request_id
        self._response_type = response_type
        self.channel = channel
        self.sequence_number = 0
        self._coalesce = coalesce_ms / 1000.0
        self._pending: list[str] = []
        self._pending_id = ""
        self._pending_kind = ""
        self._pending_start = 0.0
        self._flush_handle: asyncio.TimerHandle | None = None
        self._last_delta: Any = None  # the response of the last text or reasoning delta sent
        self._last_delta_id = ""
        self._merge_budget = MERGE_BUDGET

    def new(self) -> event_pb2.TurnEvent:
        """Queue a new event with ids and the next sequence number; fill its payload in place."""
        if self._pending:
            self._flush()
        return self._emit()

    def prepare(self) -> Any:
        """A new response with ids and the next sequence number, not sent: the turn's TurnEnd,
        stored before it is sent (docs/semantics.md §8). Fill its payload, then :meth:`send` it;
        nothing else may be sent in between (:meth:`send` raises ``RuntimeError`` then)."""
        if self._pending:
            self._flush()
        return self._made()

    def _made(self) -> Any:
        response = self._response_type()
        event: event_pb2.TurnEvent = response.event
        event.conversation_id = self.conversation_id
        event.request_id = self.request_id
        event.sequence_number = self.sequence_number + 1
        return response

    def send(self, response: Any) -> None:
        """Send a response :meth:`prepare` made (to the channel and the stream log)."""
        number = response.event.sequence_number
        if number != self.sequence_number + 1:
            raise RuntimeError(f"event {number} was prepared before event {self.sequence_number} was sent")
        self.sequence_number = number
        self.channel.put(response)
        if self.log is not None:
            self.log.record(response)

    def _emit(self) -> event_pb2.TurnEvent:
        response = self._made()
        self.send(response)
        event: event_pb2.TurnEvent = response.event
        return event

    def text_delta(self, block_id: str, delta: str) -> None:
        """Send (or coalesce, or merge: see the module docstring) a text delta of block ``block_id``."""
        if self._coalesce:
            self._coalesced("text", block_id, delta)
            return
        last = self._last_delta
        if last is not None and self._merged(last, "text_delta", block_id, delta):
            return
        payload = self._delta(block_id).text_delta
        payload.id = block_id
        payload.delta = delta

    def reasoning_delta(self, block_id: str, delta: str) -> None:
        """Send (or coalesce, or merge: see the module docstring) a reasoning delta of block ``block_id``."""
        if self._coalesce:
            self._coalesced("reasoning", block_id, delta)
            return
        last = self._last_delta
        if last is not None and self._merged(last, "reasoning_delta", block_id, delta):
            return
        payload = self._delta(block_id).reasoning_delta
        payload.id = block_id
        payload.delta = delta

    def _delta(self, block_id: str) -> event_pb2.TurnEvent:
        """Queue a new event for a delta of ``block_id`` (nothing coalesced is pending: a writer
        coalesces all its deltas or none) and keep it as the one the next delta may merge into;
        fill its payload in place."""
        event = self._emit()
        self._last_delta = self.channel.last_unread()  # the delta's response (None: nobody reads it)
        self._last_delta_id = block_id
        return event

    def _merged(self, last: Any, kind: str, block_id: str, delta: str) -> bool:
        """Append ``delta`` to ``last`` (the response of the last delta sent) when it is a delta of
        ``kind`` (``text_delta``, ``reasoning_delta``) of the same block, still unread, not yet
        stored, and within :data:`MERGE_LIMIT` and :data:`MERGE_BUDGET`."""
        event = last.event
        if (
            self._last_delta_id != block_id
            or not self._merge_budget
            or self.channel.last_unread() is not last
            or event.WhichOneof("event") != kind
            or (self.log is not None and not self.log.amendable(last))
        ):
            return False
        payload = getattr(event, kind)
        merged = payload.delta + delta
        if len(merged) > MERGE_LIMIT:
            return False
        payload.delta = merged
        self._merge_budget -= 1
        self.channel.grew()
        return True

    def _coalesced(self, kind: str, block_id: str, delta: str) -> None:
        now = time.monotonic()
        if self._pending:
            if (
                self._pending_kind == kind
                and self._pending_id == block_id
                and now - self._pending_start < self._coalesce
            ):
                self._pending.append(delta)
                return
            self._flush()
        self._pending = [delta]
        self._pending_kind = kind
        self._pending_id = block_id
        self._pending_start = now
        # A timer sends the buffer when no further delta comes within the window.
        self._flush_handle = asyncio.get_running_loop().call_later(self._coalesce, self._flush)

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        if not self._pending:
            return
        text = "".join(self._pending)
        self._pending = []
        event = self._emit()
        if self._pending_kind == "text":
            event.text_delta.id = self._pending_id
            event.text_delta.delta = text
        else:
            event.reasoning_delta.id = self._pending_id
            event.reasoning_delta.delta = text

    @property
    def backlogged(self) -> bool:
        """True when the client is ``high_water`` events behind (see :class:`EventChannel`)."""
        return self.channel.backlogged

    async def drained(self, timeout_seconds: float) -> bool:
        """Wait for the client to catch up with a backlog; False when it read nothing that
        brought the backlog down within ``timeout_seconds``."""
        try:
            async with asyncio.timeout(timeout_seconds):
                await self.channel.drained()
        except TimeoutError:
            return False
        return True

    def close(self) -> None:
        """Send anything coalesced and end the stream (its live readers too)."""
        self._flush()
        self.channel.close()
        if self.log is not None:
            self.log.end_live()
