"""A small asyncio client for the Turnwire ``ChatService``.

The turn-running calls (:meth:`TurnwireClient.chat`, :meth:`TurnwireClient.save_messages`,
:meth:`TurnwireClient.continue_last_turn`) are async generators of
:class:`turnwire.v1.event_pb2.TurnEvent`; :func:`collect` folds such a stream into a
:class:`TurnResult`. Every gRPC failure surfaces as :class:`TurnwireError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, cast

import grpc
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from turnwire.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2

__all__ = [
    "ERROR_DOMAIN",
    "ProtocolError",
    "TurnResult",
    "TurnwireClient",
    "TurnwireError",
    "collect",
]

ERROR_DOMAIN = "turnwire.dev"
"""The ``google.rpc.ErrorInfo.domain`` of every error Turnwire sends."""

_DETAILS_KEY = "grpc-status-details-bin"


class TurnwireError(Exception):
    """A failed Turnwire call, or a turn that ended in error.

    Attributes:
        code: The gRPC status code (``grpc.StatusCode``), e.g. ``INVALID_ARGUMENT``,
            ``NOT_FOUND``, or ``UNAVAILABLE`` when the sidecar cannot be reached.
        message: The human-readable status message.
        reason: ``google.rpc.ErrorInfo.reason`` (an ``ErrorReason`` name without the
            ``ERROR_REASON_`` prefix, e.g. ``"CONVERSATION_NOT_FOUND"``), or ``""`` when the
            status carried no ErrorInfo (transport failures, deadlines, client-side errors).
        domain: ``ErrorInfo.domain`` (``"turnwire.dev"`` for Turnwire errors), or ``""``.
        error_metadata: ``ErrorInfo.metadata`` as a plain dict (empty when absent).
        field_violations: ``(field, description)`` pairs from ``google.rpc.BadRequest``.
        status: The full ``google.rpc.Status`` when the server sent one, else ``None``.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        error_metadata: Mapping[str, str] | None = None,
        field_violations: Sequence[tuple[str, str]] = (),
        status: status_pb2.Status | None = None,
    ) -> None:
        """Build an error; usually done by :meth:`from_rpc_error` or :meth:`from_status`."""
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.error_metadata: dict[str, str] = dict(error_metadata or {})
        self.field_violations: list[tuple[str, str]] = list(field_violations)
        self.status = status
        super().__init__(str(self))

    def __str__(self) -> str:
        """``CODE [REASON]: message``, plus ``; field: description`` for each violation the
        message does not already state."""
        head = self.code.name if isinstance(self.code, grpc.StatusCode) else str(self.code)
        if self.reason:
            head += f" [{self.reason}]"
        text = f"{head}: {self.message}" if self.message else head
        for field_path, description in self.field_violations:
            violation = f"{field_path}: {description}"
            if violation not in self.message:
                text += f"; {violation}"
        return text

    @classmethod
    def from_status(cls, status: status_pb2.Status) -> TurnwireError:
        """Build an error from a ``google.rpc.Status`` (e.g. ``TurnEnd.error``).

        Unpacks ``ErrorInfo`` and ``BadRequest`` from ``status.details``; other detail types
        are kept only in :attr:`status`. An unknown numeric code maps to ``UNKNOWN``.
        """
        reason = ""
        domain = ""
        metadata: dict[str, str] = {}
        violations: list[tuple[str, str]] = []
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad_request = error_details_pb2.BadRequest()
                detail.Unpack(bad_request)
                violations.extend((v.field, v.description) for v in bad_request.field_violations)
        return cls(
            _status_code(status.code),
            status.message,
            reason=reason,
            domain=domain,
            error_metadata=metadata,
            field_violations=violations,
            status=status,
        )

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> TurnwireError:
        """Build an error from a failed call (``grpc.aio.AioRpcError`` or a sync ``grpc.Call``).

        The rich status comes from the ``grpc-status-details-bin`` trailing metadata (via
        ``grpc_status.rpc_status.from_call``); the call's own code and details win when the
        two disagree, and a call without details yields an error with empty ``reason``.
        """
        code: grpc.StatusCode = error.code()
        message: str = error.details() or ""
        rich: status_pb2.Status | None
        try:
            rich = rpc_status.from_call(error)
        except ValueError:
            # Code or message of the rich status disagree with the call's; keep its details.
            rich = _details_from_metadata(error.trailing_metadata())
        if rich is None:
            return cls(code, message)
        parsed = cls.from_status(rich)
        parsed.code = code
        parsed.message = message
        parsed.args = (str(parsed),)
        return parsed


class ProtocolError(TurnwireError):
    """A turn's event stream broke the contract.

    Raised by :func:`collect` when sequence numbers are not ``1, 2, 3, ...`` without gaps,
    when events of one stream name different conversations or request ids, when an event
    follows the ``TurnEnd``, or when the stream ends without a ``TurnEnd``. Its ``code`` is
    ``grpc.StatusCode.INTERNAL`` and its ``reason`` is ``""``.
    """

    def __init__(self, message: str) -> None:
        """Build a protocol error with the given description."""
        super().__init__(grpc.StatusCode.INTERNAL, message)


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
        expected = len(self.events) + 1
        if self.end is not None:
            raise ProtocolError(f"event {event.sequence_number} ({event.WhichOneof('event')}) after TurnEnd")
        if event.sequence_number != expected:
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
        events: The stream, e.g. ``client.chat(...)``.

    Returns:
        The turn's result. A turn that ended in ``TURN_STATUS_ERROR`` is returned, not
        raised; call :meth:`TurnResult.raise_for_error` to turn it into an exception.

    Raises:
        ProtocolError: sequence numbers are not ``1, 2, 3, ...`` without gaps, events name
            different turns, an event follows the ``TurnEnd``, or there is no ``TurnEnd``.
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


class TurnwireClient:
    """Async client for a Turnwire sidecar's ``turnwire.v1.ChatService``.

    Use it as an async context manager, or call :meth:`close` when done::

        async with TurnwireClient("localhost:50051") as client:
            result = await collect(client.chat("conv-1", "Hello!"))

    Args:
        target: The sidecar's address, e.g. ``"localhost:50051"``; an insecure channel is
            opened to it unless ``channel`` is given.
        channel: An existing ``grpc.aio.Channel`` to use instead; the client does not close
            a channel it did not open.
        metadata: ``(key, value)`` pairs sent with every call (e.g. authorization).

    Create the client inside a running event loop; grpc.aio channels bind to it.
    """

    def __init__(
        self,
        target: str,
        *,
        channel: grpc.aio.Channel | None = None,
        metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Open (or adopt) the channel; see the class docstring for the arguments."""
        self.target = target
        self._owns_channel = channel is None
        self._channel: grpc.aio.Channel = grpc.aio.insecure_channel(target) if channel is None else channel
        self._metadata: tuple[tuple[str, str], ...] = tuple(metadata)
        # The stub's aio overload is not picked while grpc is untyped; say what it is.
        self._stub = cast(
            "chat_service_pb2_grpc.ChatServiceAsyncStub",
            chat_service_pb2_grpc.ChatServiceStub(self._channel),
        )

    async def __aenter__(self) -> Self:
        """Return the client itself."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the client (see :meth:`close`)."""
        await self.close()

    async def close(self) -> None:
        """Close the channel if the client opened it; calls in flight are cancelled."""
        if self._owns_channel:
            await self._channel.close()

    # -- turn-running calls -------------------------------------------------------------

    def chat(
        self,
        conversation_id: str,
        text: str,
        *,
        request_id: str | None = None,
        body: Mapping[str, Any] | None = None,
        model: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[event_pb2.TurnEvent]:
        """Append a user message with one text part and stream the turn it runs.

        Args:
            conversation_id: The conversation (created on first use).
            text: The user's text.
            request_id: Optional client-chosen turn id (to cancel it with :meth:`cancel_chat`).
            body: Optional JSON-like data for lifecycle hooks (sent as a ``Struct``).
            model: Optional ``provider:model`` for this turn.
            timeout: Optional deadline in seconds for the whole call.

        Returns:
            An async iterator of the turn's ``TurnEvent``\\ s as they arrive, ``TurnEnd`` last.
            Leaving the iteration early cancels the call (the server aborts the turn).

        Raises:
            TurnwireError: while iterating, if the call fails (e.g. ``INVALID_ARGUMENT`` with
                field violations, ``UNAVAILABLE`` when the sidecar cannot be reached).
        """
        message = message_pb2.Message(
            role=message_pb2.ROLE_USER,
            parts=[message_pb2.Part(text=message_pb2.TextPart(text=text))],
        )
        request = chat_service_pb2.ChatRequest(
            conversation_id=conversation_id,
            message=message,
            request_id=request_id or "",
            model=model or "",
        )
        if body is not None:
            request.body.CopyFrom(_struct(body))
        return self._stream(self._stub.Chat, request, timeout)

    def save_messages(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        *,
        request_id: str | None = None,
        body: Mapping[str, Any] | None = None,
        model: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[event_pb2.TurnEvent]:
        """Append ``messages`` (possibly none) and stream the turn run on the history.

        Arguments, return value and errors are as for :meth:`chat`.
        """
        request = chat_service_pb2.SaveMessagesRequest(
            conversation_id=conversation_id,
            messages=list(messages),
            request_id=request_id or "",
            model=model or "",
        )
        if body is not None:
            request.body.CopyFrom(_struct(body))
        return self._stream(self._stub.SaveMessages, request, timeout)

    def continue_last_turn(
        self,
        conversation_id: str,
        *,
        request_id: str | None = None,
        body: Mapping[str, Any] | None = None,
        model: str | None = None,
        timeout: float | None = None,
    ) -> AsyncIterator[event_pb2.TurnEvent]:
        """Let the model continue after the last assistant message, streaming that turn.

        When the last message is not an assistant message the stream is a lone ``TurnEnd``
        with ``TURN_STATUS_SKIPPED``. The conversation must exist (else ``NOT_FOUND``).
        Arguments, return value and errors are otherwise as for :meth:`chat`.
        """
        request = chat_service_pb2.ContinueLastTurnRequest(
            conversation_id=conversation_id,
            request_id=request_id or "",
            model=model or "",
        )
        if body is not None:
            request.body.CopyFrom(_struct(body))
        return self._stream(self._stub.ContinueLastTurn, request, timeout)

    async def _stream(
        self, method: Any, request: Any, deadline: float | None
    ) -> AsyncIterator[event_pb2.TurnEvent]:
        call = method(request, timeout=deadline, metadata=self._metadata or None)
        try:
            async for response in call:
                yield response.event
        except grpc.aio.AioRpcError as error:
            raise TurnwireError.from_rpc_error(error) from error
        finally:
            call.cancel()  # no-op once the call has finished

    # -- unary calls --------------------------------------------------------------------

    async def get_conversation(
        self,
        conversation_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.Conversation:
        """Fetch a conversation with its messages, oldest first.

        Raises:
            TurnwireError: ``NOT_FOUND`` (reason ``CONVERSATION_NOT_FOUND``) for an unknown
                conversation, ``INVALID_ARGUMENT`` for a malformed id, or any call failure.
        """
        request = chat_service_pb2.GetConversationRequest(conversation_id=conversation_id)
        response: chat_service_pb2.GetConversationResponse = await self._unary(
            self._stub.GetConversation, request, timeout
        )
        return response.conversation

    async def list_conversations(
        self,
        page_size: int = 0,
        page_token: str = "",
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.ListConversationsResponse:
        """List conversations, most recently updated first, without their messages.

        Args:
            page_size: 1-1000; 0 means the server default (50).
            page_token: ``next_page_token`` of the previous page; ``""`` for the first.

        Returns:
            The page; its ``next_page_token`` is ``""`` on the last page.

        Raises:
            TurnwireError: ``INVALID_ARGUMENT`` (reason ``INVALID_PAGE_TOKEN``) for a foreign
                token, or any call failure.
        """
        request = chat_service_pb2.ListConversationsRequest(page_size=page_size, page_token=page_token)
        response: chat_service_pb2.ListConversationsResponse = await self._unary(
            self._stub.ListConversations, request, timeout
        )
        return response

    async def cancel_chat(
        self,
        request_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> bool:
        """Cancel a running or queued turn by its request id.

        Returns:
            True when a turn was found and cancelled; False for an unknown or finished turn.

        Raises:
            TurnwireError: if the call fails.
        """
        request = chat_service_pb2.CancelChatRequest(request_id=request_id)
        response: chat_service_pb2.CancelChatResponse = await self._unary(
            self._stub.CancelChat, request, timeout
        )
        return response.cancelled

    async def _unary(self, method: Any, request: Any, deadline: float | None) -> Any:
        try:
            return await method(request, timeout=deadline, metadata=self._metadata or None)
        except grpc.aio.AioRpcError as error:
            raise TurnwireError.from_rpc_error(error) from error


def _struct(data: Mapping[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(dict(data))
    return struct


def _status_code(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


def _details_from_metadata(metadata: Any) -> status_pb2.Status | None:
    for key, value in metadata or ():
        if key == _DETAILS_KEY:
            return status_pb2.Status.FromString(value)
    return None
