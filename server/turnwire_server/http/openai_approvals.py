"""The calls that ``mcp_approval_response`` input items answer (docs/api/openai.md#tool-approvals).

A call of the sidecar's own tools that waits for the user's approval is shown on the Responses
door as OpenAI's ``mcp_approval_request`` item whose ``id`` is the call's approval id
(``ToolCallApproval.id``, :mod:`turnwire_server.http.openai_response_log`). The caller answers it
with an ``mcp_approval_response`` item naming that id (``approval_request_id``) on a request that
continues the response (``previous_response_id``, as OpenAI's docs show). ``SubmitToolApprovals``
names calls by ``tool_call_id``, so each answer's call is looked up:

- first in the events of the turn that asked it, which its approval id names
  (:func:`~turnwire_server.engine.ids.approval_turn`): its ``ToolApprovalRequest`` pairs the
  approval id with the call's id. One turn's events, whatever the conversation's length;
- else (an approval id that names no turn, the turn's events past their retention, a turn of
  another conversation: a fork's copy of the call) in every page of the conversation's stored
  messages (``GetConversation``), where the approval id is kept with its call.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from starlette.responses import Response

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.engine.ids import approval_turn
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls
from turnwire_server.http.openai_errors import bad_request, ended_response
from turnwire_server.http.openai_request import ApprovalAnswer

_SERVICE = "/turnwire.v1.ChatService/"


async def tool_approvals(
    calls: InProcessCalls, conversation: str, answers: Sequence[ApprovalAnswer], call: DoorCallInfo
) -> list[chat_service_pb2.ToolApproval] | Response:
    """The ``SubmitToolApprovals`` answers of ``answers`` (in order), each naming the call of
    ``conversation`` whose approval id its ``approval_request_id`` is (found as the module
    docstring says, as the caller). Answers 400 naming the item's ``approval_request_id`` when
    no call of the conversation has that approval id, or the refusal of ``GetConversation`` (a
    conversation another tenant's, or gone: 404)."""
    wanted = {answer.approval_request_id for answer in answers}
    call_of: dict[str, str] = {}  # approval id → tool call id
    for turn in sorted({t for t in map(approval_turn, wanted) if t is not None}):
        call_of |= await _asked_in_turn(calls, turn, conversation, wanted - call_of.keys(), call)
    if missing := wanted - call_of.keys():
        try:
            call_of |= await _asked_in_conversation(calls, conversation, missing, call)
        except CallEnded as ended:
            return ended_response(ended, param_names={"conversation_id": "previous_response_id"})
    approvals = []
    for answer in answers:
        tool_call_id = call_of.get(answer.approval_request_id)
        if tool_call_id is None:
            return bad_request(
                f"{answer.where}.approval_request_id: no tool call of the previous response's "
                f"conversation asked for approval {answer.approval_request_id!r}; send the id of an "
                "mcp_approval_request item of the response named by previous_response_id",
                f"{answer.where}.approval_request_id",
                "tool_call_not_found",
            )
        approvals.append(
            chat_service_pb2.ToolApproval(
                tool_call_id=tool_call_id, approved=answer.approve, reason=answer.reason
            )
        )
    return approvals


async def _asked_in_turn(
    calls: InProcessCalls, turn: str, conversation: str, wanted: Collection[str], call: DoorCallInfo
) -> dict[str, str]:
    """Approval id → tool call id of the approvals of ``wanted`` that turn ``turn`` of
    ``conversation`` asked, from its events (``ResumeTurn``), read until all are found or the turn
    ends (the approvals of an attempt a recovery replaced do not count: ``AttemptStart`` starts
    afresh from the reply it continues). Empty when the turn's events cannot be read (past their
    retention, another tenant's) or belong to another conversation."""
    found: dict[str, str] = {}
    if not wanted:
        return found
    events = calls.stream(_SERVICE + "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id=turn), call)
    try:
        async for item in events:
            event = item.event  # type: ignore[attr-defined]
            if event.conversation_id != conversation:
                return {}
            kind = event.WhichOneof("event")
            if kind == "tool_approval_request" and event.tool_approval_request.approval_id in wanted:
                found[event.tool_approval_request.approval_id] = event.tool_approval_request.tool_call_id
            elif kind == "attempt_start":
                found = _asked_in_message(event.attempt_start.message, wanted)
            if len(found) == len(wanted):
                break
    except CallEnded:
        return {}
    finally:
        await events.aclose()  # type: ignore[attr-defined]
    return found


async def _asked_in_conversation(
    calls: InProcessCalls, conversation: str, wanted: Collection[str], call: DoorCallInfo
) -> dict[str, str]:
    """Approval id → tool call id of the approvals of ``wanted`` asked in ``conversation``'s stored
    assistant messages, every page read (``GetConversation``); raises
    :class:`~turnwire_server.http.calls.CallEnded` when a read is refused."""
    found: dict[str, str] = {}
    token = ""
    while True:
        page = await calls.unary(
            _SERVICE + "GetConversation",
            chat_service_pb2.GetConversationRequest(conversation_id=conversation, page_token=token),
            call,
        )
        for message in page.conversation.messages:  # type: ignore[attr-defined]
            found |= _asked_in_message(message, wanted)
        token = page.next_page_token  # type: ignore[attr-defined]
        if not token:
            return found


def _asked_in_message(message: message_pb2.Message, wanted: Collection[str]) -> dict[str, str]:
    """Approval id → tool call id of the calls of assistant ``message`` whose approval id is one of
    ``wanted``."""
    if message.role != message_pb2.ROLE_ASSISTANT:
        return {}
    return {
        part.tool_call.approval.id: part.tool_call.tool_call_id
        for part in message.parts
        if part.HasField("tool_call") and part.tool_call.approval.id in wanted
    }


__all__ = ["tool_approvals"]
