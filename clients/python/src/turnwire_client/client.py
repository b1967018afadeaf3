"""A small asyncio client for the Turnwire ``ChatService``.

The turn-running calls (:meth:`TurnwireClient.chat`, :meth:`TurnwireClient.save_messages`,
:meth:`TurnwireClient.continue_last_turn`) return a :class:`~turnwire_client.stream.TurnStream`
of :class:`turnwire_client.v1.event_pb2.TurnEvent`; :func:`collect` folds such a stream into a
:class:`TurnResult`. Every gRPC failure surfaces as :class:`TurnwireError`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self, Unpack, cast

import grpc

from turnwire_client._requests import (
    ClientToolSpec,
    ConcurrentInputStrategy,
    DisconnectPolicy,
    MessagesSpec,
    TurnBudgetSpec,
    TurnOptions,
    WebhookSpec,
    submit_messages_request,
    tool_approvals,
    tool_results,
    user_message,
    user_messages,
    with_turn_options,
)
from turnwire_client._schedules import ScheduleCalls
from turnwire_client.errors import TurnwireError, explain_unreachable
from turnwire_client.metadata import AUTHORIZATION_METADATA, EVENT_BATCHES_METADATA
from turnwire_client.stream import TurnStream
from turnwire_client.tls import TlsOptions
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2, webhook_pb2

__all__ = ["ClientToolSpec", "DisconnectPolicy", "TurnOptions", "TurnwireClient"]


class TurnwireClient(ScheduleCalls):
    """Async client for a Turnwire sidecar's ``turnwire.v1.ChatService``.

    Use it as an async context manager, or call :meth:`close` when done::

        async with TurnwireClient("localhost:50051") as client:
            result = await collect(client.chat("conv-1", "Hello!"))

    Args:
        target: The sidecar's address, e.g. ``"localhost:50051"``; an insecure channel is
            opened to it unless ``channel`` is given.
        channel: An existing ``grpc.aio.Channel`` to use instead; the client does not close
            a channel it did not open.
        metadata: ``(key, value)`` pairs sent with every call.
        tls: Connect with TLS (:class:`~turnwire_client.tls.TlsOptions`: the CA to trust, a
            client certificate for mutual TLS, the server name); None (the default) is
            plaintext, as for a sidecar on localhost. Not with ``channel``.
        token: A bearer token, sent with every call as ``authorization: Bearer <token>``
            metadata (the sidecar's ``auth:``; the CLI reads it from ``--token`` or
            ``TURNWIRE_TOKEN``). Use TLS whenever the network between client and sidecar is not
            trusted: the token is a credential.
        include_progress: Let the turn streams yield ``Progress`` keepalives (a silent turn's
            stream sends them; :func:`collect` ignores them); skipped by default.

    A call that cannot reach the sidecar because of a TLS mismatch (a plaintext client to a TLS
    sidecar, a client without a certificate to a mutual-TLS one, a TLS client to a plaintext
    one) raises :class:`~turnwire_client.errors.TlsMismatchError` (``UNAVAILABLE``) saying what
    the sidecar wants, instead of gRPC's "Socket closed" (a channel passed in is not checked).

    Create the client inside a running event loop; grpc.aio channels bind to it.
    """

    def __init__(
        self,
        target: str,
        *,
        channel: grpc.aio.Channel | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        tls: TlsOptions | None = None,
        token: str | None = None,
        include_progress: bool = False,
    ) -> None:
        """Open (or adopt) the channel; see the class docstring for the arguments. Raises
        :class:`ValueError` for ``tls`` with ``channel``, :class:`OSError` for an unreadable
        TLS file."""
        self.target = target
        self._owns_channel = channel is None
        if channel is not None and tls is not None:
            raise ValueError("tls configures the channel the client opens; not with channel")
        if channel is None:
            channel = (
                grpc.aio.insecure_channel(target)
                if tls is None
                else grpc.aio.secure_channel(target, tls.channel_credentials(), options=tls.channel_options())
            )
        self._channel: grpc.aio.Channel = channel
        # What a failure before any answer is checked against (a TLS mismatch); unknown for a
        # channel passed in.
        self._security = (target, tls) if self._owns_channel else None
        self._metadata: tuple[tuple[str, str], ...] = tuple(metadata)
        self._include_progress = include_progress
        if token:
            self._metadata += ((AUTHORIZATION_METADATA, f"Bearer {token}"),)
        # Turn streams read a response's batched events (docs/semantics.md §10, "Event batches").
        self._stream_metadata = (*self._metadata, (EVENT_BATCHES_METADATA, "1"))
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

    def chat(self, conversation_id: str, text: str, **options: Unpack[TurnOptions]) -> TurnStream:
        """Append a user message with one text part and stream the turn it runs.

        Args:
            conversation_id: The conversation (created on first use).
            text: The user's text.
            **options: :class:`~turnwire_client._requests.TurnOptions`: ``request_id``,
                ``body``, ``model``, ``timeout`` (seconds), ``disconnect`` (``"cancel"`` or
                ``"continue"``), ``client_tools``.

        Returns:
            A :class:`TurnStream`: the turn's ``TurnEvent``\\ s as they arrive, ``TurnEnd``
            last; ``await stream.collect()`` folds it into a :class:`TurnResult`. Leaving it
            early cancels the call and (unless ``disconnect="continue"``) the server aborts the
            turn: ``break`` or an exception out of ``async for`` (the stream kept in a variable
            or not), ``async with`` exit, :meth:`TurnStream.cancel`, or the stream dropped.

        Raises:
            TurnwireError: while iterating, if the call fails (e.g. ``INVALID_ARGUMENT`` with
                field violations, ``UNAVAILABLE`` when the sidecar cannot be reached).
            TypeError: an unknown option.
        """
        request = chat_service_pb2.ChatRequest(conversation_id=conversation_id, message=user_message(text))
        return self._stream(self._stub.Chat, with_turn_options(request, options), options)

    def save_messages(
        self, conversation_id: str, messages: MessagesSpec, **options: Unpack[TurnOptions]
    ) -> TurnStream:
        """Append ``messages`` (possibly none; a plain text is one user message) and stream the
        turn run on the history.

        Options, return value and errors are as for :meth:`chat`.
        """
        request = chat_service_pb2.SaveMessagesRequest(
            conversation_id=conversation_id, messages=user_messages(messages)
        )
        return self._stream(self._stub.SaveMessages, with_turn_options(request, options), options)

    def continue_last_turn(self, conversation_id: str, **options: Unpack[TurnOptions]) -> TurnStream:
        """Let the model continue after the last assistant message, streaming that turn.

        When the last message is not an assistant message the stream is a lone ``TurnEnd``
        with ``TURN_STATUS_SKIPPED``. The conversation must exist (else ``NOT_FOUND``).
        Options, return value and errors are otherwise as for :meth:`chat`.
        """
        request = chat_service_pb2.ContinueLastTurnRequest(conversation_id=conversation_id)
        return self._stream(self._stub.ContinueLastTurn, with_turn_options(request, options), options)

    def resume_turn(
        self, request_id: str, after_sequence_number: int = 0, *, timeout: float | None = None
    ) -> TurnStream:
        """Re-attach to a running or recently finished turn: the events after
        ``after_sequence_number`` (the last one you saw; 0 for all), then the live ones.

        Leaving the stream early never affects the turn. Raises (while iterating)
        :class:`TurnwireError` ``NOT_FOUND`` (reason ``TURN_NOT_FOUND``) for an unknown request
        id or a turn whose events are past the retention.
        """
        request = chat_service_pb2.ResumeTurnRequest(
            request_id=request_id, after_sequence_number=after_sequence_number
        )
        return self._stream(self._stub.ResumeTurn, request, {"timeout": timeout})

    def watch_submission(
        self, submission_id: str, after_sequence_number: int = 0, *, timeout: float | None = None
    ) -> TurnStream:
        """Stream a submission's turn (once it runs) from ``after_sequence_number``, ``TurnEnd``
        last. Raises (while iterating) :class:`TurnwireError` ``NOT_FOUND`` for an unknown id."""
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
    ) -> TurnStream:
        """Send the results of client tool calls, stored at once; stream the continuation.

        Args:
            conversation_id: The conversation of the calls.
            results: ``{tool_call_id: output}``: each output any JSON value (sent as JSON text,
                so integers of any size stay exact).
            errors: ``{tool_call_id: error_text}`` for calls that failed (``""``: the model
                reads ``Tool execution denied by user``).
            auto_continue: Once no call of that assistant message waits any more, run one
                continuation turn and stream it here; otherwise (or while other calls still
                wait) the stream is a lone ``TurnEnd`` with ``TURN_STATUS_SKIPPED``.
            **options: As for :meth:`chat`.

        Raises (while iterating) :class:`TurnwireError`: ``NOT_FOUND`` (``TOOL_CALL_NOT_FOUND``),
        ``FAILED_PRECONDITION`` (``TOOL_CALL_NOT_PENDING``, ``EXPIRED``); nothing is stored then.
        Raises :class:`ValueError` at once for an output with no JSON form (NaN, Infinity).
        """
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
    ) -> TurnStream:
        """Approve (True) or deny (False) tool calls waiting for approval, by tool call id; stream
        the continuation, in which approved calls run first (``before_tool_call`` still
        decides) and denied ones reach the model as denied, with ``reasons[id]`` when given.

        Other arguments, the result and errors are as for :meth:`submit_tool_results`.
        """
        request = chat_service_pb2.SubmitToolApprovalsRequest(
            conversation_id=conversation_id,
            approvals=tool_approvals(approvals, reasons),
            auto_continue=auto_continue,
        )
        return self._stream(self._stub.SubmitToolApprovals, with_turn_options(request, options), options)

    def _stream(self, method: Any, request: Any, options: TurnOptions) -> TurnStream:
        return TurnStream(
            method(request, timeout=options.get("timeout"), metadata=self._stream_metadata),
            include_progress=self._include_progress,
            # A submission's id is its turn's request id (docs/semantics.md §7).
            request_id=getattr(request, "request_id", "") or getattr(request, "submission_id", ""),
            security=self._security,
        )

    # -- unary calls --------------------------------------------------------------------

    async def get_conversation(
        self,
        conversation_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.Conversation:
        """Fetch a conversation with all its messages, oldest first, its ``partial_replies`` and
        ``turns_without_reply`` (every page, fetched in turn).

        Raises:
            TurnwireError: ``NOT_FOUND`` (reason ``CONVERSATION_NOT_FOUND``) for an unknown
                conversation, ``INVALID_ARGUMENT`` for a malformed id, or any call failure.
        """
        request = chat_service_pb2.GetConversationRequest(conversation_id=conversation_id)
        response: chat_service_pb2.GetConversationResponse = await self._unary(
            self._stub.GetConversation, request, timeout
        )
        conversation = response.conversation
        while response.next_page_token:
            request.page_token = response.next_page_token
            response = await self._unary(self._stub.GetConversation, request, timeout)
            conversation.messages.extend(response.conversation.messages)
            conversation.partial_replies.extend(response.conversation.partial_replies)
            conversation.turns_without_reply.extend(response.conversation.turns_without_reply)
        return conversation

    async def get_conversation_page(
        self,
        conversation_id: str,
        page_size: int = 0,
        page_token: str = "",
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.GetConversationResponse:
        """One page of a conversation's messages, oldest first (AIP-158).

        Args:
            conversation_id: The conversation.
            page_size: At most this many messages; 0 means as many as fit one response under
                3 MiB.
            page_token: ``next_page_token`` of the previous page; ``""`` for the first.

        Returns:
            The response: ``conversation`` with this page's messages and ``next_page_token``
            (``""`` on the last page).

        Raises:
            TurnwireError: as for :meth:`get_conversation`, and ``INVALID_ARGUMENT`` (reason
                ``INVALID_PAGE_TOKEN``) for a token of another conversation.
        """
        request = chat_service_pb2.GetConversationRequest(
            conversation_id=conversation_id, page_size=page_size, page_token=page_token
        )
        response: chat_service_pb2.GetConversationResponse = await self._unary(
            self._stub.GetConversation, request, timeout
        )
        return response

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

    async def list_turns(
        self,
        conversation_id: str,
        page_size: int = 0,
        page_token: str = "",
        *,
        failed_only: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.ListTurnsResponse:
        """List a conversation's turns, most recently started first, each with its status, error,
        cost and stored timeline (docs/inspector.md).

        Args:
            conversation_id: The conversation (an unknown one has no turns).
            page_size: 1-1000; 0 means the server default (100).
            page_token: ``next_page_token`` of the previous page; ``""`` for the first.
            failed_only: Only the turns that ended ``ERROR``, ``ABORTED`` or ``INTERRUPTED``.

        Returns:
            The page; its ``next_page_token`` is ``""`` on the last page.

        Raises:
            TurnwireError: ``INVALID_ARGUMENT`` for a bad id or a foreign page token (reason
                ``INVALID_PAGE_TOKEN``), or any call failure.
        """
        request = chat_service_pb2.ListTurnsRequest(
            conversation_id=conversation_id,
            page_size=page_size,
            page_token=page_token,
            failed_only=failed_only,
        )
        response: chat_service_pb2.ListTurnsResponse = await self._unary(
            self._stub.ListTurns, request, timeout
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

    # -- submissions --------------------------------------------------------------------

    async def submit_messages(
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
        webhook: WebhookSpec | None = None,
        budget: TurnBudgetSpec | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.SubmitMessagesResponse:
        """Durably submit messages for a turn that runs later, in order with the conversation's
        other turns. ``messages`` may be a plain text (one user message). ``webhook``: call this
        target when the submission ends (an endpoint's name, or ``{"url": …}``; docs/webhooks.md).
        ``budget``: lowers its turn's budget, as on ``chat`` (:class:`TurnOptions`).

        Returns:
            The response: ``submission`` (its id is the turn's request id) and ``accepted``
            (False when ``submission_id`` or ``idempotency_key`` repeats an earlier one: the
            earlier submission is returned).

        Raises:
            TurnwireError: ``ALREADY_EXISTS`` (reason ``SUBMISSION_CONFLICT``) when the id and
                key name different submissions or the id is reused with other messages,
                ``INVALID_ARGUMENT`` for an empty list or a bad message, any call failure.
        """
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
            webhook=webhook,
            budget=budget,
        )
        response: chat_service_pb2.SubmitMessagesResponse = await self._unary(
            self._stub.SubmitMessages, request, timeout
        )
        return response

    async def get_submission(
        self,
        submission_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.Submission:
        """One submission. Raises :class:`TurnwireError` ``NOT_FOUND`` for an unknown id."""
        request = chat_service_pb2.GetSubmissionRequest(submission_id=submission_id)
        response: chat_service_pb2.GetSubmissionResponse = await self._unary(
            self._stub.GetSubmission, request, timeout
        )
        return response.submission

    async def list_submissions(
        self,
        *,
        conversation_id: str = "",
        state: chat_service_pb2.SubmissionState.ValueType = chat_service_pb2.SUBMISSION_STATE_UNSPECIFIED,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.ListSubmissionsResponse:
        """One page of submissions in acceptance order, optionally of one conversation and state."""
        request = chat_service_pb2.ListSubmissionsRequest(
            conversation_id=conversation_id, state=state, page_size=page_size, page_token=page_token
        )
        response: chat_service_pb2.ListSubmissionsResponse = await self._unary(
            self._stub.ListSubmissions, request, timeout
        )
        return response

    async def list_webhook_deliveries(
        self,
        *,
        submission_id: str = "",
        conversation_id: str = "",
        state: webhook_pb2.WebhookDeliveryState.ValueType = webhook_pb2.WEBHOOK_DELIVERY_STATE_UNSPECIFIED,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> webhook_pb2.ListWebhookDeliveriesResponse:
        """One page of webhook deliveries (each with every attempt), oldest first, optionally of
        one submission, conversation or state (docs/webhooks.md)."""
        request = webhook_pb2.ListWebhookDeliveriesRequest(
            submission_id=submission_id,
            conversation_id=conversation_id,
            state=state,
            page_size=page_size,
            page_token=page_token,
        )
        response: webhook_pb2.ListWebhookDeliveriesResponse = await self._unary(
            self._stub.ListWebhookDeliveries, request, timeout
        )
        return response

    async def cancel_submission(
        self,
        submission_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.Submission:
        """Cancel a pending or running submission; returns it as stored afterwards (a finished
        one unchanged). Raises :class:`TurnwireError` ``NOT_FOUND`` for an unknown id."""
        request = chat_service_pb2.CancelSubmissionRequest(submission_id=submission_id)
        response: chat_service_pb2.CancelSubmissionResponse = await self._unary(
            self._stub.CancelSubmission, request, timeout
        )
        return response.submission

    # -- transcript writes and deletion ---------------------------------------------------

    async def add_messages(
        self,
        conversation_id: str,
        messages: Sequence[message_pb2.Message],
        *,
        upsert: bool = False,
        allow_missing: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.AddMessagesResponse:
        """Write ``messages`` into the conversation's transcript without running a turn.

        No turn lock and no hooks: a tool may call it from inside a running turn of the same
        conversation. Idempotent by message id: a message already stored with the same content
        counts as unchanged. All or nothing.

        Args:
            conversation_id: The conversation; it must exist unless ``allow_missing``.
            messages: At least one message, each with a role and at least one part; an empty
                id gets a server id.
            upsert: Replace stored messages with the same id in place (``ADD_MODE_UPSERT``)
                instead of refusing other content under a stored id (``ADD_MODE_APPEND``).
            allow_missing: Create the conversation when it does not exist.
            timeout: Optional deadline in seconds.

        Returns:
            The response: ``conversation`` (without messages) and ``added_count``,
            ``updated_count``, ``unchanged_count``.

        Raises:
            TurnwireError: ``INVALID_ARGUMENT`` with field violations, ``NOT_FOUND`` (reason
                ``CONVERSATION_NOT_FOUND``), ``ALREADY_EXISTS`` (a stored id with other
                content), ``FAILED_PRECONDITION`` (upserting the reply a running turn writes),
                or any call failure.
        """
        request = chat_service_pb2.AddMessagesRequest(
            conversation_id=conversation_id,
            messages=list(messages),
            mode=chat_service_pb2.ADD_MODE_UPSERT if upsert else chat_service_pb2.ADD_MODE_APPEND,
            allow_missing=allow_missing,
        )
        response: chat_service_pb2.AddMessagesResponse = await self._unary(
            self._stub.AddMessages, request, timeout
        )
        return response

    async def delete_conversation(
        self,
        conversation_id: str,
        *,
        allow_missing: bool = False,
        include_forks: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> bool:
        """Delete a conversation with its messages, turns, stored events and submissions.

        A running or queued turn on it is cancelled first (its stream ends ``ABORTED``) and
        writes nothing afterwards. A later :meth:`chat` on the same id starts afresh. Its forks
        stay readable unless ``include_forks`` (docs/forks.md).

        Args:
            conversation_id: The conversation to delete.
            allow_missing: Succeed when it does not exist.
            include_forks: Delete every conversation forked from it too (an erasure request).
            timeout: Optional deadline in seconds.

        Returns:
            True when something was deleted (False only with ``allow_missing``).

        Raises:
            TurnwireError: ``NOT_FOUND`` (reason ``CONVERSATION_NOT_FOUND``) unless
                ``allow_missing``, ``INVALID_ARGUMENT`` for a malformed id, or any call failure.
        """
        request = chat_service_pb2.DeleteConversationRequest(
            conversation_id=conversation_id, allow_missing=allow_missing, include_forks=include_forks
        )
        response: chat_service_pb2.DeleteConversationResponse = await self._unary(
            self._stub.DeleteConversation, request, timeout
        )
        return response.deleted

    async def fork_conversation(
        self,
        conversation_id: str,
        at_message_id: str,
        *,
        new_conversation_id: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.Conversation:
        """Fork a conversation: a new one holding its messages up to and including
        ``at_message_id``, shared without a copy; later changes on either side never show on the
        other (docs/forks.md). Edit and regenerate: fork at the message before the edited one,
        then :meth:`chat` on the fork with the edited text.

        Returns the new conversation (without messages; ``forked_from`` set; its id is
        ``new_conversation_id``, or a server id when empty). Raises :class:`TurnwireError`:
        ``NOT_FOUND`` (no such conversation), ``ALREADY_EXISTS`` (``new_conversation_id`` is
        taken), ``INVALID_ARGUMENT`` (a malformed id, a message not in the conversation), or
        any call failure.
        """
        request = chat_service_pb2.ForkConversationRequest(
            conversation_id=conversation_id,
            at_message_id=at_message_id,
            new_conversation_id=new_conversation_id,
        )
        response: chat_service_pb2.ForkConversationResponse = await self._unary(
            self._stub.ForkConversation, request, timeout
        )
        return response.conversation

    async def _unary(self, method: Any, request: Any, deadline: float | None) -> Any:
        try:
            return await method(request, timeout=deadline, metadata=self._metadata or None)
        except grpc.aio.AioRpcError as error:
            failure = TurnwireError.from_rpc_error(error)
            if self._security is not None:
                failure = await asyncio.to_thread(explain_unreachable, failure, *self._security)
            raise failure from error
