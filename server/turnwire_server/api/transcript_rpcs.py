"""``AddMessages`` and ``DeleteConversation``: writing and deleting a transcript outside a turn.

A mixin of :class:`~turnwire_server.api.chat_service.ChatService`. ``AddMessages`` is a transcript
write only: no turn, no turn lock, no hooks, so a tool or hook may call it from inside a running
turn of the same conversation (docs/semantics.md §1). ``DeleteConversation`` stops the
conversation's turns, then deletes everything stored of it (docs/semantics.md §12, AIP-135).
"""

from __future__ import annotations

from typing import Any

import grpc

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.api.resources import conversation_proto
from turnwire_server.api.status import TurnwireStatusError, invalid_argument, status_error_of
from turnwire_server.api.turn_streams import abort
from turnwire_server.api.validation import check_id, check_message, raise_if_any
from turnwire_server.engine import TurnEngine
from turnwire_server.engine.deletion import delete_conversation, delete_with_forks
from turnwire_server.engine.ids import RESERVED_PREFIX, is_reserved
from turnwire_server.store.base import EngineStore
from turnwire_server.store.errors import StoreError, UnknownMessage
from turnwire_server.store.records import AddMode, AddResult

_MODES: dict[int, AddMode] = {
    chat_service_pb2.ADD_MODE_UNSPECIFIED: "append",
    chat_service_pb2.ADD_MODE_APPEND: "append",
    chat_service_pb2.ADD_MODE_UPSERT: "upsert",
}


def _response(result: AddResult) -> chat_service_pb2.AddMessagesResponse:
    record = result.conversation
    return chat_service_pb2.AddMessagesResponse(
        conversation=conversation_proto(record),
        added_count=result.added,
        updated_count=result.updated,
        unchanged_count=result.unchanged,
    )


class TranscriptRpcs:
    """``AddMessages`` and ``DeleteConversation`` on the servicer's ``engine`` and ``store``;
    ``max_message_bytes`` bounds each added message (``limits.max_message_bytes``)."""

    engine: TurnEngine
    store: EngineStore
    max_message_bytes: int

    async def AddMessages(
        self,
        request: chat_service_pb2.AddMessagesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.AddMessagesResponse:
        """Write messages into the transcript; no turn runs (docs/semantics.md §1).

        All or nothing, in one store transaction. Errors: INVALID_ARGUMENT with field
        violations (no messages, a bad message, an id repeated in the request, a new message
        under a server id), NOT_FOUND (``CONVERSATION_NOT_FOUND``) unless ``allow_missing``,
        ALREADY_EXISTS for a stored id with other content (append mode),
        FAILED_PRECONDITION for an upsert of the reply a running turn is writing.
        """
        try:
            violations: list[tuple[str, str]] = []
            check_id(request.conversation_id, "conversation_id", violations, required=True)
            mode = _MODES.get(request.mode)
            if mode is None:
                violations.append(
                    ("mode", f"unknown mode {request.mode}; use ADD_MODE_APPEND or ADD_MODE_UPSERT")
                )
            if not request.messages:
                violations.append(("messages", "must contain at least one message"))
            upsert = mode == "upsert"
            index_of: dict[str, int] = {}
            replace_only: set[str] = set()
            for index, message in enumerate(request.messages):
                field = f"messages[{index}]"
                # Upsert may edit a stored message under a server id (a reply, tw-a-…); the
                # store refuses to add a new one under such an id (replace_only).
                if upsert and message.id and is_reserved(message.id):
                    replace_only.add(message.id)
                check_message(
                    message,
                    field,
                    violations,
                    max_bytes=self.max_message_bytes,
                    default_role=None,
                    client_chosen_id=not upsert,
                )
                if message.id in index_of:
                    violations.append(
                        (
                            f"{field}.id",
                            f"duplicates messages[{index_of[message.id]}].id {message.id!r}; "
                            "give each message its own id",
                        )
                    )
                index_of.setdefault(message.id, index)
            raise_if_any(violations)
            assert mode is not None
            try:
                result = await self.store.add_messages(
                    request.conversation_id,
                    list(request.messages),
                    mode=mode,
                    allow_missing=request.allow_missing,
                    replace_only=replace_only,
                )
            except UnknownMessage as error:
                raise invalid_argument(
                    [
                        (
                            f"messages[{index_of[error.message_id]}].id",
                            f"ids starting with {RESERVED_PREFIX!r} are reserved for ids the server "
                            "assigns: ADD_MODE_UPSERT may replace a stored message under one but not "
                            "add one; choose another id or leave it empty",
                        )
                    ]
                ) from None
            except StoreError as error:
                raise status_error_of(error) from error
        except TurnwireStatusError as error:
            await abort(context, error)
            raise AssertionError("unreachable") from None
        return _response(result)

    async def DeleteConversation(
        self,
        request: chat_service_pb2.DeleteConversationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.DeleteConversationResponse:
        """Delete the conversation and everything stored of it (docs/semantics.md §12, AIP-135).

        Its running or queued turns are cancelled first (they end ``ABORTED``, reason
        ``CONVERSATION_DELETED``) and write nothing afterwards. NOT_FOUND
        (``CONVERSATION_NOT_FOUND``) when there is no such conversation, unless
        ``allow_missing``. Its forks stay readable; ``include_forks`` deletes them too, their
        turns cancelled the same way (docs/forks.md).
        """
        try:
            violations: list[tuple[str, str]] = []
            check_id(request.conversation_id, "conversation_id", violations, required=True)
            raise_if_any(violations)
            conversation_id = request.conversation_id
            try:
                known = (
                    self.engine.active_turns(conversation_id) > 0
                    or await self.store.get_conversation(conversation_id) is not None
                )
                if not known and not request.allow_missing:
                    raise TurnwireStatusError(
                        grpc.StatusCode.NOT_FOUND,
                        f"conversation {conversation_id!r} does not exist",
                        reason="CONVERSATION_NOT_FOUND",
                        metadata={"conversation_id": conversation_id},
                    )
                # Also with allow_missing: rows stored before the conversation (submissions) go too.
                forks = 0
                if request.include_forks:
                    deleted, forks = await delete_with_forks(self.engine, conversation_id)
                else:
                    deleted = await delete_conversation(self.engine, conversation_id)
            except StoreError as error:
                raise status_error_of(error) from error
        except TurnwireStatusError as error:
            await abort(context, error)
            raise AssertionError("unreachable") from None
        return chat_service_pb2.DeleteConversationResponse(deleted=deleted, deleted_fork_count=forks)
