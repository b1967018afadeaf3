"""A turn whose events are past ``durability.event_retention_seconds`` but whose record and reply
are still stored, found for the HTTP doors that read turns by request id (the OpenAI door's
``GET /v1/responses/{id}``, ``previous_response_id``; AG-UI's re-attach by ``runId``).

``ResumeTurn`` answers such a turn NOT_FOUND with ``expired`` and the conversation that stores it
in its ``google.rpc.ErrorInfo`` metadata (:func:`expired_in`); the turn's record is then read with
``ListTurns`` and its reply with ``GetConversation`` from that message (:func:`stored_turn`;
:func:`reply_followed` tells whether a later reply follows it), through the same
in-process calls as every door's (authentication, tenants, limits), so the door can answer from
them for as long as the conversation is stored.
"""

from __future__ import annotations

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls

_SERVICE = "/turnwire.v1.ChatService/"
_FOLLOWING_PAGE = 16
"""Messages :func:`reply_followed` reads a page: the reply and what followed it, mostly the
next turn's input and reply."""


def expired_in(ended: CallEnded) -> str | None:
    """The conversation that stores the turn whose events ``ResumeTurn``'s NOT_FOUND ``ended``
    says are past their retention (its ErrorInfo metadata); None for any other refusal."""
    if ended.code.name != "NOT_FOUND":
        return None
    info = ended.error_info()
    if info is None or info.metadata.get("expired") != "true":
        return None
    return info.metadata.get("conversation_id") or None


async def stored_turn(
    calls: InProcessCalls, request_id: str, conversation: str, call: DoorCallInfo
) -> tuple[chat_service_pb2.Turn, message_pb2.Message | None] | None:
    """Turn ``request_id``'s record in ``conversation`` (``ListTurns``) and its assistant message
    (``GetConversation`` from that message, one message read; None when it has none); None when
    the conversation no longer holds the turn. Raises
    :class:`~turnwire_server.http.calls.CallEnded` when a read is refused."""
    turn: chat_service_pb2.Turn | None = None
    token = ""
    while turn is None:
        page = await calls.unary(
            _SERVICE + "ListTurns",
            chat_service_pb2.ListTurnsRequest(conversation_id=conversation, page_size=1000, page_token=token),
            call,
        )
        turn = next((t for t in page.turns if t.request_id == request_id), None)  # type: ignore[attr-defined]
        token = page.next_page_token  # type: ignore[attr-defined]
        if turn is None and not token:
            return None
    page = await calls.unary(
        _SERVICE + "GetConversation",
        chat_service_pb2.GetConversationRequest(
            conversation_id=conversation, start_message_id=turn.assistant_message_id, page_size=1
        ),
        call,
    )
    found = page.conversation.messages  # type: ignore[attr-defined]
    return turn, (found[0] if found and found[0].id == turn.assistant_message_id else None)


async def reply_followed(calls: InProcessCalls, conversation: str, reply_id: str, call: DoorCallInfo) -> bool:
    """Whether ``conversation`` holds the assistant message ``reply_id`` and a later assistant
    message (so the reply is not the conversation's latest: the OpenAI door forks at it). Reads
    from the reply on (``GetConversation`` with ``start_message_id``), a page of
    :data:`_FOLLOWING_PAGE` messages at a time, until an assistant message: its cost is the
    messages after the reply, not the conversation's length. Raises
    :class:`~turnwire_server.http.calls.CallEnded` when a read is refused (another tenant's
    conversation, or none: NOT_FOUND)."""
    request = chat_service_pb2.GetConversationRequest(
        conversation_id=conversation, start_message_id=reply_id, page_size=_FOLLOWING_PAGE
    )
    page = await calls.unary(_SERVICE + "GetConversation", request, call)
    messages = list(page.conversation.messages)  # type: ignore[attr-defined]
    if not messages or messages[0].role != message_pb2.ROLE_ASSISTANT:
        return False  # no such reply here (its start_message_id page is empty)
    messages = messages[1:]
    while True:
        if any(message.role == message_pb2.ROLE_ASSISTANT for message in messages):
            return True
        token = page.next_page_token  # type: ignore[attr-defined]
        if not token:
            return False
        request = chat_service_pb2.GetConversationRequest(
            conversation_id=conversation, page_token=token, page_size=_FOLLOWING_PAGE
        )
        page = await calls.unary(_SERVICE + "GetConversation", request, call)
        messages = list(page.conversation.messages)  # type: ignore[attr-defined]


__all__ = ["expired_in", "reply_followed", "stored_turn"]
