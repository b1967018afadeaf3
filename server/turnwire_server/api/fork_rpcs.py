"""``ForkConversation``: a conversation holding another's history up to a message, sharing it
(docs/forks.md).

A mixin of :class:`~turnwire_server.api.chat_service.ChatService`. A transcript write like
``AddMessages``: no turn, no turn lock, no hooks; a turn running on the source meanwhile goes on
(the fork keeps the source's messages as they were when it was made: copy-on-write). Tenancy:
both ids are tenant-scoped keys (:data:`~turnwire_server.api.tenancy.SCOPED_FIELDS`), so a tenant
forks only its own conversations, into its own.
"""

from __future__ import annotations

from typing import Any

import grpc

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.api.resources import conversation_proto
from turnwire_server.api.status import TurnwireStatusError, status_error_of
from turnwire_server.api.tenancy import scoped_key
from turnwire_server.api.turn_streams import abort
from turnwire_server.api.validation import check_id, raise_if_any
from turnwire_server.engine.ids import new_conversation_id
from turnwire_server.store.base import EngineStore
from turnwire_server.store.errors import StoreError


class ForkRpcs:
    """``ForkConversation`` on the servicer's ``store``."""

    store: EngineStore

    async def ForkConversation(
        self,
        request: chat_service_pb2.ForkConversationRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.ForkConversationResponse:
        """Fork ``conversation_id`` at ``at_message_id`` into ``new_conversation_id`` (a server id
        ``tw-c-…`` when empty); O(1) rows whatever the history's length (docs/forks.md).

        Errors: INVALID_ARGUMENT with field violations (a missing or malformed id, a new id in
        the server's reserved namespace, ``at_message_id`` not in the source's history), NOT_FOUND
        (``CONVERSATION_NOT_FOUND``) for a source that does not exist (another tenant's included),
        ALREADY_EXISTS when ``new_conversation_id`` is a conversation's.
        """
        try:
            violations: list[tuple[str, str]] = []
            check_id(request.conversation_id, "conversation_id", violations, required=True)
            check_id(request.at_message_id, "at_message_id", violations, required=True)
            check_id(
                request.new_conversation_id,
                "new_conversation_id",
                violations,
                required=False,
                client_chosen=True,
            )
            raise_if_any(violations)
            fork_id = request.new_conversation_id or scoped_key(new_conversation_id())
            try:
                record = await self.store.fork_conversation(
                    request.conversation_id, request.at_message_id, fork_id
                )
            except StoreError as error:
                raise status_error_of(error) from error
        except TurnwireStatusError as error:
            await abort(context, error)
            raise AssertionError("unreachable") from None
        return chat_service_pb2.ForkConversationResponse(conversation=conversation_proto(record))
