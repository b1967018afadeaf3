"""The ``turnwire.v1.ChatService`` servicer: validation, admission, streaming.

Errors found before a turn starts end the call with a status and google.rpc
details; errors during a turn end its stream with a TurnEnd event instead.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc
from google.rpc import status_pb2

from turnwire.tools import Tool
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2, message_pb2
from turnwire_server.api.client_tool_input import check_client_tools
from turnwire_server.api.fork_rpcs import ForkRpcs
from turnwire_server.api.message_pages import (
    decode_token,
    encode_token,
    message_index,
    on_page,
    page_of,
)
from turnwire_server.api.progress import Silence
from turnwire_server.api.replays import replay_stream
from turnwire_server.api.resources import conversation_proto, timestamp
from turnwire_server.api.schedule_rpcs import ScheduleRpcs
from turnwire_server.api.status import (
    TurnwireStatusError,
    invalid_argument,
    invalid_page_token,
    status_error_of,
)
from turnwire_server.api.submission_rpcs import SubmissionRpcs
from turnwire_server.api.tenancy import caller_principal, listing_prefix, scoped_key
from turnwire_server.api.tool_result_rpcs import ToolResultRpcs
from turnwire_server.api.transcript_rpcs import TranscriptRpcs
from turnwire_server.api.turn_rpcs import TurnRpcs
from turnwire_server.api.turn_streams import (
    BATCH_MAX_BYTES,
    Started,
    abort,
    disconnect_of,
    entry_of,
    parent_request_id,
    strategy_of,
    trace_context,
)
from turnwire_server.api.turn_streams import stream_turn as _stream_turn
from turnwire_server.api.validation import (
    check_budget,
    check_id,
    check_message,
    json_object,
    raise_if_any,
)
from turnwire_server.api.webhook_rpcs import WebhookRpcs
from turnwire_server.engine import TurnEngine, TurnHandle, TurnRequest
from turnwire_server.engine.budget_settings import BudgetLimit
from turnwire_server.engine.ids import new_request_id
from turnwire_server.engine.schedules import Scheduler
from turnwire_server.engine.submissions import Submissions
from turnwire_server.store.base import EngineStore
from turnwire_server.store.errors import InvalidPageToken, StoreError
from turnwire_server.store.records import ConversationRecord, TurnRecord
from turnwire_server.turn_places import turn_places
from turnwire_server.webhooks.settings import WebhookSettings

log = logging.getLogger("turnwire.api")

_DEFAULT_PAGE_SIZE = 50
_MAX_PAGE_SIZE = 1000


def _not_found(conversation_id: str) -> TurnwireStatusError:
    return TurnwireStatusError(
        grpc.StatusCode.NOT_FOUND,
        f"conversation {conversation_id!r} does not exist; start it with Chat or SaveMessages",
        reason="CONVERSATION_NOT_FOUND",
        metadata={"conversation_id": conversation_id},
    )


TURNS_WITHOUT_REPLY_LIMIT = 100
"""Most ``Conversation.turns_without_reply`` GetConversation considers (the most recently
started), so that many cancelled turns cannot push a response past its size budget."""

_PARTIAL_STATUS: dict[str, event_pb2.TurnStatus.ValueType] = {
    "running": event_pb2.TURN_STATUS_UNSPECIFIED,
    "aborted": event_pb2.TURN_STATUS_ABORTED,
    "error": event_pb2.TURN_STATUS_ERROR,
    "interrupted": event_pb2.TURN_STATUS_INTERRUPTED,
}
"""A partial reply's (or a turn without reply's) turn state
(:mod:`turnwire_server.store.core.partial_replies`) → ``PartialReply.status``."""


def _turn_without_reply(turn: TurnRecord) -> chat_service_pb2.TurnWithoutReply:
    """``turn`` (one of ``ConversationView.turns_without_reply``) as the API's ``TurnWithoutReply``."""
    entry = chat_service_pb2.TurnWithoutReply(
        request_id=turn.request_id,
        status=_PARTIAL_STATUS[turn.state],
        start_time=timestamp(turn.start_time),
    )
    if turn.error is not None:
        entry.error.CopyFrom(status_pb2.Status.FromString(turn.error))
    return entry


class ChatService(
    SubmissionRpcs,
    TranscriptRpcs,
    ToolResultRpcs,
    TurnRpcs,
    ForkRpcs,
    ScheduleRpcs,
    WebhookRpcs,
    chat_service_pb2_grpc.ChatServiceServicer,
):
    """Implements ``turnwire.v1.ChatService`` on a :class:`~turnwire_server.engine.TurnEngine`.

    The turn-running RPCs, reads, CancelChat and ResumeTurn are here; each other group of
    RPCs is a mixin in its own module (:class:`SubmissionRpcs`, …).
    ``max_message_bytes`` bounds each input message (``limits.max_message_bytes``);
    ``progress_interval`` is the silence (seconds; 0: off) after which a turn stream sends a
    Progress keepalive (``limits.progress_interval_seconds``); ``webhooks`` is the ``webhooks:``
    section a request's webhook target is checked against (docs/webhooks.md).
    ``scheduler``: the replica's schedule loop, woken by CreateSchedule and ResumeSchedule (None:
    schedules fire on its next poll only).
    """

    def __init__(
        self,
        engine: TurnEngine,
        store: EngineStore,
        submissions: Submissions,
        *,
        default_model: str,
        max_message_bytes: int,
        progress_interval: float = 0.0,
        scheduler: Scheduler | None = None,
        webhooks: WebhookSettings | None = None,
    ) -> None:
        self.engine = engine
        self.webhooks = WebhookSettings() if webhooks is None else webhooks
        self.store = store
        self.submissions = submissions
        self.default_model = default_model
        self.max_message_bytes = max_message_bytes
        self.progress_interval = progress_interval
        self.batch_bytes = BATCH_MAX_BYTES  # the most bytes of events one message of a batch holds
        self.scheduler = scheduler

    # --- turn-running RPCs ---------------------------------------------------

    async def Chat(
        self, request: chat_service_pb2.ChatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[chat_service_pb2.ChatResponse]:
        """Append one user message and stream the turn."""

        async def start() -> TurnHandle:
            violations: list[tuple[str, str]] = []
            self._check_common(request.conversation_id, request.request_id, violations)
            if not request.HasField("message"):
                violations.append(("message", "is required: a user message with at least one part"))
            else:
                check_message(
                    request.message,
                    "message",
                    violations,
                    max_bytes=self.max_message_bytes,
                    default_role=message_pb2.ROLE_USER,
                )
                if request.message.role != message_pb2.ROLE_USER:
                    violations.append(("message.role", "must be ROLE_USER (or unset) in Chat"))
            client_tools = check_client_tools(request.client_tools, "client_tools", violations)
            budget = check_budget(request, violations)
            raise_if_any(violations)
            return await self._start(
                context,
                response_type=chat_service_pb2.ChatResponse,
                conversation_id=request.conversation_id,
                request_id=request.request_id,
                messages=[request.message],
                body=request.body,
                model=request.model,
                continuation=False,
                disconnect_policy=request.disconnect_policy,
                client_tools=client_tools,
                concurrent_input=request.concurrent_input_strategy,
                budget=budget,
            )

        async for response in _stream_turn(context, start, self.progress_interval, self.batch_bytes):
            yield response

    async def SaveMessages(
        self,
        request: chat_service_pb2.SaveMessagesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[chat_service_pb2.SaveMessagesResponse]:
        """Append zero or more messages and stream the turn. With none, the turn runs on the stored
        history: NOT_FOUND (``CONVERSATION_NOT_FOUND``) when the conversation does not exist, and a
        SKIPPED TurnEnd (``NOTHING_TO_CONTINUE``) when its history is empty (docs/semantics.md §1)."""

        async def start() -> Started:
            violations: list[tuple[str, str]] = []
            self._check_common(request.conversation_id, request.request_id, violations)
            # Tool results and approvals for stored calls complete them instead of being appended.
            answers, plain = await self.tool_answers_in(request.conversation_id, request.messages, violations)
            seen: set[str] = set()
            for index, message in plain:
                check_message(
                    message,
                    f"messages[{index}]",
                    violations,
                    max_bytes=self.max_message_bytes,
                    default_role=None,
                )
                if message.id in seen:
                    violations.append(
                        (f"messages[{index}].id", f"duplicates an earlier message id {message.id!r}")
                    )
                seen.add(message.id)
            client_tools = check_client_tools(request.client_tools, "client_tools", violations)
            budget = check_budget(request, violations)
            raise_if_any(violations)
            if not request.messages and await self._get_record(request.conversation_id) is None:
                # A turn on the stored history needs one (docs/semantics.md §1), as ContinueLastTurn.
                raise _not_found(request.conversation_id)
            if answers:
                return await self.answer_and_continue(
                    context,
                    chat_service_pb2.SaveMessagesResponse,
                    conversation_id=request.conversation_id,
                    answers=answers,
                    auto_continue=True,
                    request_id=request.request_id,
                    body=request.body,
                    model=request.model,
                    client_tools=client_tools,
                    messages=[message for _, message in plain],
                    disconnect_policy=request.disconnect_policy,
                    concurrent_input=request.concurrent_input_strategy,
                    budget=budget,
                )
            return await self._start(
                context,
                response_type=chat_service_pb2.SaveMessagesResponse,
                conversation_id=request.conversation_id,
                request_id=request.request_id,
                messages=list(request.messages),
                body=request.body,
                model=request.model,
                continuation=False,
                disconnect_policy=request.disconnect_policy,
                client_tools=client_tools,
                concurrent_input=request.concurrent_input_strategy,
                budget=budget,
            )

        async for response in _stream_turn(context, start, self.progress_interval, self.batch_bytes):
            yield response

    async def ContinueLastTurn(
        self,
        request: chat_service_pb2.ContinueLastTurnRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[chat_service_pb2.ContinueLastTurnResponse]:
        """Let the model continue after the last assistant message (or end at once, SKIPPED)."""

        async def start() -> TurnHandle:
            violations: list[tuple[str, str]] = []
            self._check_common(request.conversation_id, request.request_id, violations)
            client_tools = check_client_tools(request.client_tools, "client_tools", violations)
            budget = check_budget(request, violations)
            raise_if_any(violations)
            if await self._get_record(request.conversation_id) is None:
                raise _not_found(request.conversation_id)
            return await self._start(
                context,
                response_type=chat_service_pb2.ContinueLastTurnResponse,
                conversation_id=request.conversation_id,
                request_id=request.request_id,
                messages=[],
                body=request.body,
                model=request.model,
                continuation=True,
                disconnect_policy=request.disconnect_policy,
                client_tools=client_tools,
                budget=budget,
            )

        async for response in _stream_turn(context, start, self.progress_interval, self.batch_bytes):
            yield response

    def _check_common(self, conversation_id: str, request_id: str, violations: list[tuple[str, str]]) -> None:
        check_id(conversation_id, "conversation_id", violations, required=True)
        check_id(request_id, "request_id", violations, required=False, client_chosen=True)

    async def _start(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        *,
        response_type: Callable[[], Any],
        conversation_id: str,
        request_id: str,
        messages: list[message_pb2.Message],
        body: Any,
        model: str,
        continuation: bool,
        disconnect_policy: int = 0,
        client_tools: Sequence[Tool] = (),
        concurrent_input: int = 0,
        budget: BudgetLimit | None = None,
    ) -> TurnHandle:
        return await self.engine.start(
            TurnRequest(
                conversation_id=conversation_id,
                request_id=request_id or scoped_key(new_request_id()),
                messages=messages,
                body=json_object(body, "body"),
                model=model or self.default_model,
                continuation=continuation,
                response_type=response_type,
                # A continuation needs an assistant message to continue; a turn on the history as
                # it is (no messages) needs a history (docs/semantics.md §1).
                skip_unless="assistant_last" if continuation else "" if messages else "history",
                disconnect=disconnect_of(disconnect_policy),
                client_tools=client_tools,
                entry=entry_of(response_type),
                trace_context=trace_context(context),
                concurrent_input=strategy_of(concurrent_input),
                budget=budget,
                principal=caller_principal(),
            ),
            parent_request_id=parent_request_id(context),
        )

    # --- unary RPCs ----------------------------------------------------------

    async def _get_record(self, conversation_id: str) -> ConversationRecord | None:
        try:
            return await self.store.get_conversation(conversation_id)
        except StoreError as error:
            raise status_error_of(error) from error

    async def GetConversation(
        self,
        request: chat_service_pb2.GetConversationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.GetConversationResponse:
        """The conversation with one page of its messages, oldest first (AIP-158)."""
        try:
            violations: list[tuple[str, str]] = []
            check_id(request.conversation_id, "conversation_id", violations, required=True)
            if request.page_size < 0:
                violations.append(("page_size", "must not be negative; 0 means as many as fit"))
            check_id(request.start_message_id, "start_message_id", violations, required=False)
            if request.start_message_id and request.page_token:
                violations.append(("start_message_id", "not with page_token: give one of them"))
            raise_if_any(violations)
            start = 0
            if request.page_token:
                try:
                    start = decode_token(request.page_token, request.conversation_id)
                except InvalidPageToken:
                    raise invalid_page_token("for this conversation") from None
            try:
                view = await self.store.conversation_view(request.conversation_id, TURNS_WITHOUT_REPLY_LIMIT)
            except StoreError as error:
                raise status_error_of(error) from error
            if view is None:
                raise _not_found(request.conversation_id)
        except TurnwireStatusError as error:
            await abort(context, error)
            raise AssertionError("unreachable") from None
        messages = view.messages
        if request.start_message_id:
            start = message_index(messages, request.start_message_id)
        page, following = page_of(messages, start, request.page_size)
        conversation = conversation_proto(view.record)
        conversation.messages.extend(page)
        if view.cost is not None:
            view.cost.copy_to(conversation.cost)
        for message in page:
            turn = view.partial_replies.get(message.id)
            if turn is not None:
                reply = conversation.partial_replies.add(
                    message_id=message.id, request_id=turn.request_id, status=_PARTIAL_STATUS[turn.state]
                )
                if turn.error is not None:
                    reply.error.CopyFrom(status_pb2.Status.FromString(turn.error))
        end = start + len(page)
        turns = [_turn_without_reply(turn) for turn in view.turns_without_reply]
        if turns:  # placing them walks every message's time: not for a page that has none to place
            places = turn_places(messages, [turn.start_time for turn in turns])
            conversation.turns_without_reply.extend(
                turn for turn, place in zip(turns, places, strict=True) if on_page(place, start, end)
            )
        token = "" if following is None else encode_token(request.conversation_id, following)
        return chat_service_pb2.GetConversationResponse(conversation=conversation, next_page_token=token)

    async def ListConversations(
        self,
        request: chat_service_pb2.ListConversationsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.ListConversationsResponse:
        """One page of conversations, most recently updated first (AIP-158)."""
        try:
            if request.page_size < 0:
                raise invalid_argument([("page_size", "must not be negative; 0 means the default of 50")])
            page_size = min(request.page_size or _DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE)
            try:
                records, token = await self.store.list_conversations(
                    page_size, request.page_token, id_prefix=listing_prefix()
                )
            except InvalidPageToken:
                raise invalid_page_token("") from None
            except StoreError as error:
                raise status_error_of(error) from error
        except TurnwireStatusError as error:
            await abort(context, error)
            raise AssertionError("unreachable") from None
        return chat_service_pb2.ListConversationsResponse(
            conversations=[conversation_proto(r) for r in records], next_page_token=token
        )

    async def ResumeTurn(
        self,
        request: chat_service_pb2.ResumeTurnRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[chat_service_pb2.ResumeTurnResponse]:
        """Re-attach to a turn's stream from ``after_sequence_number`` (docs/semantics.md §8)."""
        violations: list[tuple[str, str]] = []
        check_id(request.request_id, "request_id", violations, required=True)
        if request.after_sequence_number < 0:
            violations.append(("after_sequence_number", "must not be negative; 0 replays from the start"))
        if violations:
            await abort(context, invalid_argument(violations))

        def replay(batch_events: int, batch_bytes: int) -> AsyncIterator[list[event_pb2.TurnEvent]]:
            return self.engine.replay(
                request.request_id,
                request.after_sequence_number,
                batch_events=batch_events,
                batch_bytes=batch_bytes,
            )

        # Joined after its TurnStart unless replayed from the start; its conversation comes with
        # its first event.
        silence = Silence("", request.request_id, started=request.after_sequence_number > 0)
        async for response in replay_stream(
            replay,
            context,
            chat_service_pb2.ResumeTurnResponse,
            batch_bytes=self.batch_bytes,
            progress_interval=self.progress_interval,
            silence=silence,
        ):
            yield response

    async def CancelChat(
        self,
        request: chat_service_pb2.CancelChatRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.CancelChatResponse:
        """Cancel a running or queued turn; a no-op for unknown or finished ones."""
        violations: list[tuple[str, str]] = []
        check_id(request.request_id, "request_id", violations, required=True)
        if violations:
            await abort(context, invalid_argument(violations))
        try:
            cancelled = await self.engine.cancel_anywhere(request.request_id)
        except StoreError as error:
            await abort(context, status_error_of(error))
            raise AssertionError("unreachable") from None
        return chat_service_pb2.CancelChatResponse(cancelled=cancelled)


__all__ = ["ChatService", "abort"]
