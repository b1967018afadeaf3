"""How the OpenAI door finds the calls ``mcp_approval_response`` items answer
(server/turnwire_server/http/openai_approvals.py, docs/api/openai.md#tool-approvals), in process
over a recording stand-in for the in-process calls: from the events of the turn the approval id
names (one turn's events, whatever the conversation's length), and from the conversation's stored
messages only when those cannot tell. Before, every answer read every page of the conversation.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf.message import Message
from support.event_logs import turn_events

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.engine.ids import new_approval_id
from turnwire_server.http.calls import CallEnded
from turnwire_server.http.openai_approvals import tool_approvals
from turnwire_server.http.openai_request import ApprovalAnswer


class RecordingCalls:
    """The in-process calls ``tool_approvals`` makes: ``ResumeTurn`` answers the events of
    ``turns`` (request id → event dicts, as ``turn_events`` takes them, of conversation ``c``),
    ``GetConversation`` the one page ``stored``, ``ResumeTurn`` of any other turn NOT_FOUND;
    every call is recorded as ``(method, id)``."""

    def __init__(self, turns: dict[str, list[dict[str, Any]]], stored: list[message_pb2.Message]):
        self.turns = turns
        self.stored = stored
        self.made: list[tuple[str, str]] = []

    async def unary(self, method: str, request: Any, call: Any) -> Message:
        self.made.append((method.rpartition("/")[2], request.conversation_id))
        page = chat_service_pb2.GetConversationResponse()
        page.conversation.messages.extend(self.stored)
        return page

    async def stream(self, method: str, request: Any, call: Any) -> AsyncIterator[Message]:
        self.made.append((method.rpartition("/")[2], request.request_id))
        if request.request_id not in self.turns:  # as ResumeTurn answers a turn past its events
            raise CallEnded(grpc.StatusCode.NOT_FOUND, "no such turn")
        for event in turn_events(self.turns.get(request.request_id, []), "c", request.request_id):
            yield chat_service_pb2.ResumeTurnResponse(event=event)


def asked(call_id: str, approval_id: str) -> dict[str, Any]:
    return {"tool_approval_request": {"tool_call_id": call_id, "approval_id": approval_id, "tool_name": "t"}}


def stored_reply(**approvals: str) -> message_pb2.Message:
    """An assistant message whose calls (call id → approval id) wait for approval."""
    reply = message_pb2.Message(id="tw-a-old", role=message_pb2.ROLE_ASSISTANT)
    for call_id, approval_id in approvals.items():
        part = reply.parts.add().tool_call
        part.tool_call_id, part.approval.id = call_id, approval_id
        part.state = message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED
    return reply


async def test_an_answer_reads_the_events_of_the_turn_that_asked_it_not_the_conversation() -> None:
    first, second = new_approval_id("resp-a"), new_approval_id("resp-a")
    turn = [{"turn_start": {}}, asked("c1", first), asked("c2", second), {"turn_end": {}}]
    calls = RecordingCalls({"resp-a": turn}, [])
    answers = [ApprovalAnswer(second, False, "no", "input[0]"), ApprovalAnswer(first, True, "", "input[1]")]
    found = await tool_approvals(calls, "c", answers, None)  # type: ignore[arg-type]
    assert found == [
        chat_service_pb2.ToolApproval(tool_call_id="c2", approved=False, reason="no"),
        chat_service_pb2.ToolApproval(tool_call_id="c1", approved=True),
    ]
    assert calls.made == [("ResumeTurn", "resp-a")], "one turn's events; no GetConversation"


async def test_what_the_events_cannot_tell_is_read_from_the_stored_conversation() -> None:
    """An approval id that names no turn (an older sidecar's), a turn whose events are gone, one
    of another conversation (a fork's copy of the call), or an attempt a recovery replaced: the
    stored messages decide, as before."""
    older = "tw-ap-" + "0" * 32
    replaced, gone = new_approval_id("resp-b"), new_approval_id("resp-gone")
    turn = [{"turn_start": {}}, asked("c9", replaced), {"attempt_start": {"attempt": 2}}, {"turn_end": {}}]
    calls = RecordingCalls({"resp-b": turn}, [stored_reply(c1=older, c2=replaced, c3=gone)])
    answers = [ApprovalAnswer(a, True, "", f"input[{i}]") for i, a in enumerate([older, replaced, gone])]
    found = await tool_approvals(calls, "c", answers, None)  # type: ignore[arg-type]
    assert [a.tool_call_id for a in found] == ["c1", "c2", "c3"]  # type: ignore[union-attr]
    assert ("GetConversation", "c") in calls.made
    elsewhere = RecordingCalls(
        {"resp-b": [{"turn_start": {}}, asked("c9", replaced)]}, [stored_reply(c2=replaced)]
    )
    found = await tool_approvals(elsewhere, "fork", [answers[1]], None)  # type: ignore[arg-type]
    assert [a.tool_call_id for a in found] == ["c2"]  # type: ignore[union-attr]
