"""A turn whose events are past ``durability.event_retention_seconds`` but whose record and reply
are still stored, found for the HTTP doors that read turns by request id (the OpenAI door's
``GET /v1/responses/{id}``, ``previous_response_id``; AG-UI's re-attach by ``runId``).

``ResumeTurn`` answers such a turn NOT_FOUND with ``expired`` and the conversation that stores it
in its ``google.rpc.ErrorInfo`` metadata (:func:`expired_in`); the turn's record is then read with
``ListTurns`` and its reply with ``GetConversation`` (:func:`stored_turn`), through the same
in-process calls as every door's (authentication, tenants, limits), so the door can answer from
them for as long as the conversation is stored.
"""

from __future__ import annotations

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls

_SERVICE = "/turnwire.v1.ChatService/"


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
    (``GetConversation``; None when it has none); None when the conversation no longer holds the
    turn. Raises :class:`~turnwire_server.http.calls.CallEnded` when a read is refused."""
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
    token = ""
    while True:
        messages = await calls.unary(
            _SERVICE + "GetConversation",
            chat_service_pb2.GetConversationRequest(conversation_id=conversation, page_token=token),
            call,
        )
        for message in messages.conversation.messages:  # type: ignore[attr-defined]
            if message.id == turn.assistant_message_id:
                return turn, message
        token = messages.next_page_token  # type: ignore[attr-defined]
        if not token:
            return turn, None


__all__ = ["expired_in", "stored_turn"]
