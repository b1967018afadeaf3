"""Folding a turn's event stream into a :class:`TurnResult`."""

from __future__ import annotations

from collections.abc import AsyncIterable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from google.rpc import status_pb2

from turnwire_client.errors import ProtocolError, TurnwireError
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_client.values import (
    STEP_SEPARATOR,
    ChatMessage,
    Citation,
    MessageFile,
    Step,
    ToolCall,
    Usage,
    steps_of,
    struct_value,
)

__all__ = ["TurnResult", "collect", "collect_sync", "status_name"]


@dataclass
class TurnResult:
    """The outcome of one turn, folded from its event stream by :func:`collect`.

    The plain views (:attr:`text`, :attr:`steps`, :attr:`tool_calls`, :attr:`usage`,
    :attr:`metadata`) hold Python values; :attr:`message`, :attr:`error` and :attr:`events` keep
    the protobuf messages as sent.

    Attributes:
        conversation_id: The conversation the turn ran on.
        request_id: The turn's request id (client-supplied or assigned by the server).
        status: ``TurnEnd.status``, an ``event_pb2.TurnStatus`` value such as
            ``event_pb2.TURN_STATUS_COMPLETED`` (see :attr:`status_name` for its name).
        message: The assistant message as stored (``TurnEnd.message``), or ``None`` when
            nothing was stored. For a continuation turn it is the whole stored reply, the
            steps of the turn it continued included.
        usage: Token usage of the whole turn, as ints (zeros when the server sent none).
        error: ``TurnEnd.error`` for ``TURN_STATUS_ERROR`` turns, else ``None``; see
            :meth:`raise_for_error` for it as a :class:`TurnwireError`.
        events: Every event of the stream, in order, the ``TurnEnd`` last.
        step_count: Number of model steps the turn ran.
        metadata: ``TurnEnd.metadata`` (what middlewares attached) as plain values.
    """

    conversation_id: str
    request_id: str
    status: event_pb2.TurnStatus.ValueType
    message: message_pb2.Message | None
    usage: Usage
    error: status_pb2.Status | None
    events: list[event_pb2.TurnEvent] = field(default_factory=list)
    step_count: int = 0
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the turn's status is ``TURN_STATUS_COMPLETED``."""
        return self.status == event_pb2.TURN_STATUS_COMPLETED

    @property
    def status_name(self) -> str:
        """The status without its prefix, e.g. ``"COMPLETED"`` or ``"ERROR"``."""
        return status_name(self.status)

    @property
    def reply(self) -> ChatMessage | None:
        """:attr:`message` in plain values, or ``None`` without a message."""
        return None if self.message is None else ChatMessage.from_proto(self.message)

    @property
    def steps(self) -> list[Step]:
        """The reply's model steps (text, reasoning, tool calls each), ``[]`` without a message."""
        return [] if self.message is None else steps_of(self.message)

    @property
    def text(self) -> str:
        """The reply's text for reading (:attr:`ChatMessage.text`): the steps' texts without
        surrounding whitespace, joined by a blank line
        (:data:`~turnwire_client.values.STEP_SEPARATOR`); ``""`` without a message. Each step's
        exact text is in :attr:`steps`."""
        return STEP_SEPARATOR.join(text for step in self.steps if (text := step.text.strip()))

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The reply's tool calls in order, with plain inputs and results (see
        :class:`~turnwire_client.values.ToolCall`); ``[]`` without a message."""
        return [call for step in self.steps for call in step.tool_calls]

    @property
    def sources(self) -> list[Citation]:
        """The reply's cited sources in order, each with its cited passage and the text that cites
        it (see :class:`~turnwire_client.values.Citation`); ``[]`` without a message."""
        return [source for step in self.steps for source in step.sources]

    @property
    def files(self) -> list[MessageFile]:
        """The files the reply holds (generated images …) in order; ``[]`` without a message."""
        return [file for step in self.steps for file in step.files]

    @property
    def cost_usd(self) -> float | None:
        """What the whole turn cost in US dollars (``TurnEnd.cost.usd``); ``None`` when the cost is
        unknown (a model without a price, a usage the provider did not report: docs/cost.md)."""
        end = self.events[-1].turn_end if self.events else None
        return end.cost.usd if end is not None and end.HasField("cost") else None

    @property
    def error_reason(self) -> str:
        """The ``google.rpc.ErrorInfo`` reason of :attr:`error` (``"BUDGET_EXHAUSTED"``,
        ``"STREAM_STALLED"`` …): why the turn did not complete, when the sidecar said; ``""``
        otherwise (docs/api/rpcs.md, "Errors")."""
        return "" if self.error is None else TurnwireError.from_status(self.error).reason

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
            usage=Usage.from_proto(end.usage),
            error=end.error if end.HasField("error") else None,
            events=list(self.events),
            step_count=end.step_count,
            metadata=struct_value(end.metadata) if end.HasField("metadata") else {},
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


def collect_sync(events: Iterable[event_pb2.TurnEvent]) -> TurnResult:
    """The synchronous :func:`collect`, for a stream of the synchronous client
    (:class:`~turnwire_client.sync.SyncTurnwireClient`): same checks, result and errors. A
    source with a ``cancel`` method (a :class:`~turnwire_client.sync.SyncTurnStream`) is cancelled
    before returning or raising, which ends a call left unfinished.
    """
    collector = _TurnCollector()
    try:
        for event in events:
            collector.add(event)
    finally:
        cancel = getattr(events, "cancel", None)
        if cancel is not None:
            cancel()
    return collector.result()
