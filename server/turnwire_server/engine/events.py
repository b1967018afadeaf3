"""Builds a turn's stream of ``TurnEvent``s: ids, sequence numbers, text coalescing.

Events are written straight into the RPC's response message (``ChatResponse``,
``SaveMessagesResponse`` …, all of which wrap ``TurnEvent`` in field
``event``), so an event is built once and never copied.

Coalescing (``coalesce_ms`` > 0, off by default): consecutive deltas of the
same text or reasoning block that arrive within the window are sent as one
delta. The concatenated text is identical, so what the client reconstructs
does not change; only the number of messages does.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from turnwire_client.v1 import event_pb2
from turnwire_server.engine.channel import EventChannel
from turnwire_server.engine.stream_log import StreamLog


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

    def new(self) -> event_pb2.TurnEvent:
        """Queue a new event with ids and the next sequence number; fill its payload in place."""
        if self._pending:
            self._flush()
        return self._emit()

    def _emit(self) -> event_pb2.TurnEvent:
        response = self._response_type()
        event: event_pb2.TurnEvent = response.event
        self.sequence_number += 1
        event.conversation_id = self.conversation_id
        event.request_id = self.request_id
        event.sequence_number = self.sequence_number
        self.channel.put(response)
        if self.log is not None:
            self.log.record(response)
        return event

    def text_delta(self, block_id: str, delta: str) -> None:
        """Send (or coalesce) a text delta of block ``block_id``."""
        if self._coalesce:
            self._coalesced("text", block_id, delta)
            return
        event = self.new()
        event.text_delta.id = block_id
        event.text_delta.delta = delta

    def reasoning_delta(self, block_id: str, delta: str) -> None:
        """Send (or coalesce) a reasoning delta of block ``block_id``."""
        if self._coalesce:
            self._coalesced("reasoning", block_id, delta)
            return
        event = self.new()
        event.reasoning_delta.id = block_id
        event.reasoning_delta.delta = delta

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
