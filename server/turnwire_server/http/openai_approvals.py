"""The calls that ``mcp_approval_response`` input items answer (docs/api/openai.md#tool-approvals).

A call of the sidecar's own tools that waits for the user's approval is shown on the Responses
door as OpenAI's ``mcp_approval_request`` item whose ``id`` is the call's approval id
(``ToolCallApproval.id``, :mod:`turnwire_server.http.openai_response_log`). The caller answers it
with an ``mcp_approval_response`` item naming that id (``approval_request_id``) on a request that
continues the response (``previous_response_id``, as OpenAI's docs show). ``SubmitToolApprovals``
names calls by ``tool_call_id``, so each answer's call is looked up in the conversation's stored
messages, where the approval id is kept with its call.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.responses import Response

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls
from turnwire_server.http.openai_errors import bad_request, ended_response
from turnwire_server.http.openai_request import ApprovalAnswer

_GET_CONVERSATION = "/turnwire.v1.ChatService/GetConversation"


async def tool_approvals(
    calls: InProcessCalls, conversation: str, answers: Sequence[ApprovalAnswer], call: DoorCallInfo
) -> list[chat_service_pb2.ToolApproval] | Response:
    """The ``SubmitToolApprovals`` answers of ``answers`` (in order), each naming the call of
    ``conversation`` whose approval id its ``approval_request_id`` is; reads every page of the
    conversation (``GetConversation``, as the caller). Answers 400 naming the item's
    ``approval_request_id`` when no call of the conversation has that approval id, or the
    refusal of ``GetConversation`` (a conversation another tenant's, or gone: 404)."""
    wanted = {answer.approval_request_id for answer in answers}
    call_of: dict[str, str] = {}  # approval id → tool call id
    token = ""
    while True:
        try:
            page = await calls.unary(
                _GET_CONVERSATION,
                chat_service_pb2.GetConversationRequest(conversation_id=conversation, page_token=token),
                call,
            )
        except CallEnded as ended:
            return ended_response(ended, param_names={"conversation_id": "previous_response_id"})
        for message in page.conversation.messages:  # type: ignore[attr-defined]
            if message.role != message_pb2.ROLE_ASSISTANT:
                continue
            for part in message.parts:
                if part.HasField("tool_call") and part.tool_call.approval.id in wanted:
                    call_of[part.tool_call.approval.id] = part.tool_call.tool_call_id
        token = page.next_page_token  # type: ignore[attr-defined]
        if not token:
            break
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


__all__ = ["tool_approvals"]
