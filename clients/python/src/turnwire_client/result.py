"""Folding a turn's event stream into a :class:`TurnResult`."""

from __future__ import annotations

from collections.abc import AsyncIterable
from dataclasses import dataclass, field

import grpc
from google.rpc import status_pb2

from turnwire_client.errors import ProtocolError, TurnwireError
from turnwire_client.v1 import event_pb2, message_pb2

__all__ = ["TurnResult", "collect", "status_name"]


@dataclass
class TurnResult:
    """The outcome of one turn, folded from its event stream by :func:`collect`.

    Attributes:
        conversation_id: The conversation the turn ran on.
        request_id: The turn's request id (client-supplied or assigned by the server).
        status: ``TurnEnd.status``, an ``event_pb2.TurnStatus`` value such as
            ``event_pb2.TURN_STATUS_COMPLETED``.
        message: The assistant message as stored (``TurnEnd.message``), or ``None`` when
            nothing was stored.
        usage: Token usage of the whole turn (an empty ``Usage`` when the server sent none).
        error: ``TurnEnd.error`` for ``TURN_STATUS_ERROR`` turns, else ``None``.
        events: Every event of the stream, in order, the ``TurnEnd`` last.
        step_count: Number of model steps the turn ran.
    """

    conversation_id: str
    request_id: str
    status: event_pb2.TurnStatus.ValueType
    message: message_pb2.Message | None
    usage: message_pb2.Usage
    error: status_pb2.Status | None
    events: list[event_pb2.TurnEvent] = field(default_factory=list)
    step_count: int = 0

    @property
    def ok(self) -> bool:
        """True when the turn's status is ``TURN_STATUS_COMPLETED``."""
        return self.status == event_pb2.TURN_STATUS_COMPLETED

    @property
    def status_name(self) -> str:
        """The status without its prefix, e.g. ``"COMPLETED"`` or ``"ERROR"``."""
        return status_name(self.status)

    @property
    def text(self) -> str:
        """The text parts of :attr:`message` concatenated in order; ``""`` without a message."""
        if self.message is None:
            return ""
        return "".join(p.text.text for p in self.message.parts if p.WhichOneof("kind") == "text")

    @property
    def tool_calls(self) -> list[message_pb2.ToolCallPart]:
        """The tool-call parts of :attr:`message` in order (inputs with their results)."""
        if self.message is None:
            return []
        return [p.tool_call for p in self.message.parts if p.WhichOneof("kind") == "tool_call"]

    def raise_for_error(self) -> None:
        """Raise :class:`TurnwireError` built from :attr:`error` when the turn ended in error."""
        if self.status == event_pb2.TURN_STATUS_ERROR:
            if self.error is not None:
                raise TurnwireError.from_status(self.error)
            raise TurnwireError(grpc.StatusCode.UNKNOWN, "turn ended in error without details")


def status_name(status: event_pb2.TurnStatus.ValueType) -> str:
    """Name of a ``TurnStatus`` value without the ``TURN_STATUS_`` prefix (``"COMPLETED"``).

    Unknown values come back as their number.
    """
    try:
        return event_pb2.TurnStatus.Name(status).removeprefix("TURN_STATUS_")
    except ValueError:
        return str(int(status))


class _TurnCollector:
    """Validates events one at a time and builds the :class:`TurnResult`."""

    def __init__(self) -> None:
        self.events: list[event_pb2.TurnEvent] = []
        self.end: event_pb2.TurnEnd | None = None

    def add(self, event: event_pb2.TurnEvent) -> None:
        if event.HasField("progress"):
            return  # a keepalive, not part of the turn's stream
        if self.end is not None:
            raise ProtocolError(f"event {event.sequence_number} ({event.WhichOneof('event')}) after TurnEnd")
        # A resumed stream starts after the number it was asked for; an AttemptStart after a crash
        # recovery jumps past every number the lost attempt can have sent (docs/semantics.md §8).
        expected = self.events[-1].sequence_number + 1 if self.events else event.sequence_number
        jump = event.WhichOneof("event") == "attempt_start" and event.sequence_number > expected
        if event.sequence_number != expected and not jump:
            raise ProtocolError(f"expected sequence number {expected}, got {event.sequence_number}")
        if self.events:
            first = self.events[0]
            if (event.conversation_id, event.request_id) != (
                first.conversation_id,
                first.request_id,
            ):
                raise ProtocolError(
                    f"event {expected} belongs to conversation {event.conversation_id!r} "
                    f"request {event.request_id!r}, not {first.conversation_id!r} "
                    f"request {first.request_id!r}"
                )
        self.events.append(event)
        if event.WhichOneof("event") == "turn_end":
            self.end = event.turn_end

    def result(self) -> TurnResult:
        end = self.end
        if end is None:
            raise ProtocolError(f"stream ended after {len(self.events)} events without TurnEnd")
        last = self.events[-1]
        return TurnResult(
            conversation_id=last.conversation_id,
            request_id=last.request_id,
            status=end.status,
            message=end.message if end.HasField("message") else None,
            usage=end.usage,
            error=end.error if end.HasField("error") else None,
            events=list(self.events),
            step_count=end.step_count,
        )


async def collect(events: AsyncIterable[event_pb2.TurnEvent]) -> TurnResult:
    """Consume a turn's event stream and fold it into a :class:`TurnResult`.

    Args:
        events: The stream, e.g. ``client.chat(...)`` or ``client.resume_turn(...)``.

    Returns:
        The turn's result. A turn that ended in ``TURN_STATUS_ERROR`` is returned, not
        raised; call :meth:`TurnResult.raise_for_error` to turn it into an exception.

    Raises:
        ProtocolError: sequence numbers do not follow each other without gaps (the first may be
            any number, for a resumed stream; an ``AttemptStart`` after a crash recovery may jump
            ahead), events name different turns, an event follows the ``TurnEnd``, or there is
            no ``TurnEnd``.
        TurnwireError: the call itself failed (propagated from the stream).

    When ``events`` has an ``aclose`` method (async generators such as ``client.chat(...)``)
    it is awaited before returning or raising, which cancels a call left unfinished.
    """
    collector = _TurnCollector()
    try:
        async for event in events:
            collector.add(event)
    finally:
        # Stop the source (and so the call) when we give up on it early.
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    return collector.result()
