"""A synchronous client for scripts: the calls of :class:`~turnwire_client.TurnwireClient`
without ``async``/``await``, on gRPC's own (thread-based) channel::

    from turnwire_client.sync import SyncTurnwireClient

    with SyncTurnwireClient("localhost:50051") as client:
        result = client.chat("conv-1", "What's the weather in Paris?").collect()
        print(result.text)

Every method takes the same arguments and raises the same errors as its async namesake; turn
streams are :class:`SyncTurnStream`, plain iterators of ``TurnEvent``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self, Unpack

import grpc

from turnwire_client._requests import (
    ClientToolSpec,
    ConcurrentInputStrategy,
    MessagesSpec,
    TurnOptions,
    submit_messages_request,
    tool_approvals,
    tool_results,
    user_message,
    user_messages,
    with_turn_options,
)
from turnwire_client.errors import TurnwireError
from turnwire_client.metadata import AUTHORIZATION_METADATA
from turnwire_client.result import TurnResult, collect_sync
from turnwire_client.tls import TlsOptions
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2

__all__ = ["SyncTurnStream", "SyncTurnwireClient"]


class SyncTurnStream:
    """The events of one turn-running call of the synchronous client, ``TurnEnd`` last.

    Iterate it (``for event in stream``), or use it as a context manager so that the call ends
    with the block. Leaving early cancels the call (and, unless the call's ``disconnect`` was
    ``"continue"``, the server aborts the turn): on ``with`` exit, :meth:`cancel`, or when the
    stream is garbage-collected. Iterating raises :class:`TurnwireError` when the call fails.
    ``Progress`` keepalives are skipped unless ``include_progress`` is true, as in
    :class:`~turnwire_client.stream.TurnStream`.
    """

    __slots__ = ("_call", "_include_progress")

    def __init__(self, call: Any, *, include_progress: bool = False) -> None:
        """Wrap a response-streaming call of a sync ``ChatServiceStub``; yield its ``Progress``
        keepalives too when ``include_progress``."""
        self._call = call
        self._include_progress = include_progress

    def __iter__(self) -> Self:
        """Return the stream itself."""
        return self

    def __next__(self) -> event_pb2.TurnEvent:
        """The next event (``Progress`` keepalives skipped unless asked for);
        :class:`StopIteration` after the last one."""
        while True:
            try:
                response = next(self._call)
            except grpc.RpcError as error:
                raise TurnwireError.from_rpc_error(error) from error
            except BaseException:
                self._call.cancel()  # interrupted, or StopIteration at the end: a no-op then
                raise
            event: event_pb2.TurnEvent = response.event
            if self._include_progress or not event.HasField("progress"):
                return event

    def collect(self) -> TurnResult:
        """Read the stream to its end and fold it into a :class:`TurnResult`
        (:func:`~turnwire_client.result.collect_sync`)."""
        return collect_sync(self)

    def cancel(self) -> bool:
        """Cancel the call (the server aborts the turn, storing its partial reply).

        Returns False when the call had already ended.
        """
        return bool(self._call.cancel())

    def __enter__(self) -> Self:
        """Return the stream itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Cancel the call if it is still running."""
        self._call.cancel()

    def __del__(self) -> None:
        # Dropped without being read to the end: cancel now rather than when gRPC collects it.
        call = getattr(self, "_call", None)
        if call is not None and not call.done():
            call.cancel()


class SyncTurnwireClient:
    """Synchronous client for a Turnwire sidecar's ``turnwire.v1.ChatService``.

    Use it as a context manager, or call :meth:`close` when done. The arguments are those of
    :class:`~turnwire_client.TurnwireClient` (``target``, and keyword-only ``channel``: a
    ``grpc.Channel`` the client will not close, ``metadata``, ``tls``, ``token``,
    ``include_progress``). Safe to use from several threads (gRPC channels are).

    Raises:
        ValueError: ``tls`` with ``channel``.
        OSError: an unreadable TLS file.
    """

    def __init__(
        self,
        target: str,
        *,
        channel: grpc.Channel | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        tls: TlsOptions | None = None,
        token: str | None = None,
        include_progress: bool = False,
    ) -> None:
        """Open (or adopt) the channel; see the class docstring."""
        if channel is not None and tls is not None:
            raise ValueError("tls configures the channel the client opens; not with channel")
        self.target = target
        self._owns_channel = channel is None
        if channel is None:
            channel = (
                grpc.insecure_channel(target)
                if tls is None
                else grpc.secure_channel(target, tls.channel_credentials(), options=tls.channel_options())
            )
        self._channel: grpc.Channel = channel
        self._metadata: tuple[tuple[str, str], ...] = tuple(metadata)
        self._include_progress = include_progress
        if token:
            self._metadata += ((AUTHORIZATION_METADATA, f"Bearer {token}"),)
        self._stub = chat_service_pb2_grpc.ChatServiceStub(self._channel)

    def __enter__(self) -> Self:
        """Return the client itself."""
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the client (see :meth:`close`)."""
        self.close()

    def close(self) -> None:
        """Close the channel if the client opened it; calls in flight are cancelled."""
        if self._owns_channel:
            self._channel.close()

    # -- turn-running calls (see TurnwireClient for the arguments) -------------------------

    def chat(self, conversation_id: str, text: str, **options: Unpack[TurnOptions]) -> SyncTurnStream:
        """Append a user message and stream the turn it runs (:meth:`TurnwireClient.chat`)."""
        request = chat_service_pb2.ChatRequest(conversation_id=conversation_id, message=user_message(text))
        return self._stream(self._stub.Chat, with_turn_options(request, options), options)

    def save_messages(
        self, conversation_id: str, messages: MessagesSpec, **options: Unpack[TurnOptions]
    ) -> SyncTurnStream:
        """Append messages and stream the turn (:meth:`TurnwireClient.save_messages`)."""
        request = chat_service_pb2.SaveMessagesRequest(
            conversation_id=conversation_id, messages=user_messages(messages)
        )
        return self._stream(self._stub.SaveMessages, with_turn_options(request, options), options)

    def continue_last_turn(self, conversation_id: str, **options: Unpack[TurnOptions]) -> SyncTurnStream:
        """Continue after the last assistant message (:meth:`TurnwireClient.continue_last_turn`)."""
        request = chat_service_pb2.ContinueLastTurnRequest(conversation_id=conversation_id)
        return self._stream(self._stub.ContinueLastTurn, with_turn_options(request, options), options)

    def resume_turn(
        self, request_id: str, after_sequence_number: int = 0, *, timeout: float | None = None
    ) -> SyncTurnStream:
        """Re-attach to a turn's events (:meth:`TurnwireClient.resume_turn`)."""
        request = chat_service_pb2.ResumeTurnRequest(
            request_id=request_id, after_sequence_number=after_sequence_number
        )
        return self._stream(self._stub.ResumeTurn, request, {"timeout": timeout})

    def watch_submission(
        self, submission_id: str, after_sequence_number: int = 0, *, timeout: float | None = None
    ) -> SyncTurnStream:
        """Stream a submission's turn (:meth:`TurnwireClient.watch_submission`)."""
        request = chat_service_pb2.WatchSubmissionRequest(
            submission_id=submission_id, after_sequence_number=after_sequence_number
        )
        return self._stream(self._stub.WatchSubmission, request, {"timeout": timeout})

    def submit_tool_results(
        self,
        conversation_id: str,
        results: Mapping[str, Any],
        *,
        errors: Mapping[str, str] | None = None,
        auto_continue: bool = True,
        **options: Unpack[TurnOptions],
    ) -> SyncTurnStream:
        """Answer client tool calls; stream the continuation
        (:meth:`TurnwireClient.submit_tool_results`)."""
        request = chat_service_pb2.SubmitToolResultsRequest(
            conversation_id=conversation_id,
            results=tool_results(results, errors),
            auto_continue=auto_continue,
        )
        return self._stream(self._stub.SubmitToolResults, with_turn_options(request, options), options)

    def submit_tool_approvals(
        self,
        conversation_id: str,
        approvals: Mapping[str, bool],
        *,
        reasons: Mapping[str, str] | None = None,
        auto_continue: bool = True,
        **options: Unpack[TurnOptions],
    ) -> SyncTurnStream:
        """Approve or deny tool calls; stream the continuation
        (:meth:`TurnwireClient.submit_tool_approvals`)."""
        request = chat_service_pb2.SubmitToolApprovalsRequest(
            conversation_id=conversation_id,
            approvals=tool_approvals(approvals, reasons),
            auto_continue=auto_continue,
        )
        return self._stream(self._stub.SubmitToolApprovals, with_turn_options(request, options), options)

    def _stream(self, method: Any, request: Any, options: TurnOptions) -> SyncTurnStream:
        return SyncTurnStream(
            method(request, timeout=options.get("timeout"), metadata=self._metadata or None),
            include_progress=self._include_progress,
        )

    # -- unary calls (see TurnwireClient for the arguments and errors) ---------------------

    def get_conversation(
        self, conversation_id: str, *, timeout: float | None = None
    ) -> chat_service_pb2.Conversation:
        """A conversation with all its messages, partial replies and turns without reply, every
        page fetched in turn (:meth:`TurnwireClient.get_conversation`)."""
        request = chat_service_pb2.GetConversationRequest(conversation_id=conversation_id)
        response: chat_service_pb2.GetConversationResponse = self._unary(
            self._stub.GetConversation, request, timeout
        )
        conversation = response.conversation
        while response.next_page_token:
            request.page_token = response.next_page_token
            response = self._unary(self._stub.GetConversation, request, timeout)
            conversation.messages.extend(response.conversation.messages)
            conversation.partial_replies.extend(response.conversation.partial_replies)
            conversation.turns_without_reply.extend(response.conversation.turns_without_reply)
        return conversation

    def get_conversation_page(
        self, conversation_id: str, page_size: int = 0, page_token: str = "", *, timeout: float | None = None
    ) -> chat_service_pb2.GetConversationResponse:
        """One page of a conversation's messages (:meth:`TurnwireClient.get_conversation_page`)."""
        request = chat_service_pb2.GetConversationRequest(
            conversation_id=conversation_id, page_size=page_size, page_token=page_token
        )
        response: chat_service_pb2.GetConversationResponse = self._unary(
            self._stub.GetConversation, request, timeout
        )
        return response

    def list_conversations(
        self, page_size: int = 0, page_token: str = "", *, timeout: float | None = None
    ) -> chat_service_pb2.ListConversationsResponse:
        """One page of conversations (:meth:`TurnwireClient.list_conversations`)."""
        request = chat_service_pb2.ListConversationsRequest(page_size=page_size, page_token=page_token)
        response: chat_service_pb2.ListConversationsResponse = self._unary(
            self._stub.ListConversations, request, timeout
        )
        return response

    def cancel_chat(self, request_id: str, *, timeout: float | None = None) -> bool:
        """Cancel a running or queued turn; True when one was cancelled
        (:meth:`TurnwireClient.cancel_chat`)."""
        request = chat_service_pb2.CancelChatRequest(request_id=request_id)
        response: chat_service_pb2.CancelChatResponse = self._unary(self._stub.CancelChat, request, timeout)
        return response.cancelled

    def submit_messages(
        self,
        conversation_id: str,
        messages: MessagesSpec,
        *,
        submission_id: str | None = None,
        idempotency_key: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        model: str | None = None,
        client_tools: Sequence[ClientToolSpec] = (),
        concurrent_input: ConcurrentInputStrategy | None = None,
        timeout: float | None = None,
    ) -> chat_service_pb2.SubmitMessagesResponse:
        """Durably submit messages for a later turn (:meth:`TurnwireClient.submit_messages`)."""
        request = submit_messages_request(
            conversation_id,
            messages,
            submission_id=submission_id,
            idempotency_key=idempotency_key,
            metadata=metadata,
            body=body,
            model=model,
            client_tools=client_tools,
            concurrent_input=concurrent_input,
        )
        response: chat_service_pb2.SubmitMessagesResponse = self._unary(
            self._stub.SubmitMessages, request, timeout
        )
        return response

    def get_submission(
        self, submission_id: str, *, timeout: float | None = None
    ) -> chat_service_pb2.Submission:
        """One submission (:meth:`TurnwireClient.get_submission`)."""
        request = chat_service_pb2.GetSubmissionRequest(submission_id=submission_id)
        response: chat_service_pb2.GetSubmissionResponse = self._unary(
            self._stub.GetSubmission, request, timeout
        )
        return response.submission

    def list_submissions(
        self,
        *,
        conversation_id: str = "",
        state: chat_service_pb2.SubmissionState.ValueType = chat_service_pb2.SUBMISSION_STATE_UNSPECIFIED,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> chat_service_pb2.ListSubmissionsResponse:
        """One page of submissions (:meth:`TurnwireClient.list_submissions`)."""
        request = chat_service_pb2.ListSubmissionsRequest(
            conversation_id=conversation_id, state=state, page_size=page_size, page_token=page_token
        )
        response: chat_service_pb2.ListSubmissionsResponse = self._unary(
            self._stub.ListSubmissions, request, timeout
        )
        return response

    def cancel_submission(
        self, submission_id: str, *, timeout: float | None = None
    ) -> chat_service_pb2.Submission:
        """Cancel a pending or running submission (:meth:`TurnwireClient.cancel_submission`)."""
        request = chat_service_pb2.CancelSubmissionRequest(submission_id=submission_id)
        response: chat_service_pb2.CancelSubmissionResponse = self._unary(
            self._stub.CancelSubmission, request, timeout
        )
        return response.submission

    def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        *,
        upsert: bool = False,
        allow_missing: bool = False,
        timeout: float | None = None,
    ) -> chat_service_pb2.AddMessagesResponse:
        """Write messages into the transcript without a turn (:meth:`TurnwireClient.add_messages`)."""
        request = chat_service_pb2.AddMessagesRequest(
            conversation_id=conversation_id,
            messages=list(messages),
            mode=chat_service_pb2.ADD_MODE_UPSERT if upsert else chat_service_pb2.ADD_MODE_APPEND,
            allow_missing=allow_missing,
        )
        response: chat_service_pb2.AddMessagesResponse = self._unary(self._stub.AddMessages, request, timeout)
        return response

    def delete_conversation(
        self, conversation_id: str, *, allow_missing: bool = False, timeout: float | None = None
    ) -> bool:
        """Delete a conversation and all it holds (:meth:`TurnwireClient.delete_conversation`)."""
        request = chat_service_pb2.DeleteConversationRequest(
            conversation_id=conversation_id, allow_missing=allow_missing
        )
        response: chat_service_pb2.DeleteConversationResponse = self._unary(
            self._stub.DeleteConversation, request, timeout
        )
        return response.deleted

    def _unary(self, method: Any, request: Any, deadline: float | None) -> Any:
        try:
            return method(request, timeout=deadline, metadata=self._metadata or None)
        except grpc.RpcError as error:
            raise TurnwireError.from_rpc_error(error) from error
