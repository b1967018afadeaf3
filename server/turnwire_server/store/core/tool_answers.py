"""How a client's answer changes a waiting tool call: the rules every store applies atomically.

docs/semantics.md §6 and §12. Pure functions on ``turnwire.v1`` protos, shared by both
drivers, which apply them inside one write, so concurrent answers cannot race.

Which calls wait, and how one is closed or denied, are the interface's rules
(:mod:`turnwire_server.store.waiting_calls`), which the engine applies too.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from turnwire.values import loads, value_view
from turnwire_client.v1 import message_pb2
from turnwire_server.store.errors import (
    ToolCallExpired,
    ToolCallNotFound,
    ToolCallNotPending,
    ToolCallsSpanMessages,
)
from turnwire_server.store.records import AnsweredToolCalls, ToolCallAnswer
from turnwire_server.store.waiting_calls import DENIED_BY_USER_TEXT, close_call, deny_call, is_waiting


def _answered_already(call: message_pb2.ToolCallPart) -> str | None:
    """Why ``call`` takes no answer because it had one (an approval answered, a client call's
    result recorded), for the refusal's message; None when it never waited or still waits."""
    if call.approval.id and call.state != message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED:
        if call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
            return "its approval was answered already: it was denied"
        return "its approval was answered already: it was approved"
    if call.client_executed and call.state in (
        message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
        message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
    ):
        return "its result was recorded already"
    return None


def _apply(call: message_pb2.ToolCallPart, answer: ToolCallAnswer) -> None:
    """Record ``answer`` into ``call``, or raise :class:`ToolCallNotPending` when the call does not
    wait for this kind of answer."""
    if answer.kind in ("output", "error"):
        if not (call.client_executed and call.state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE):
            why = _answered_already(call) or (
                "it waits for an approval (SubmitToolApprovals), not a result"
                if call.state == message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED
                else "it is not a client tool call waiting for its result"
            )
            raise ToolCallNotPending(call.tool_call_id, why)
        if answer.kind == "output":
            call.output_json = answer.output_json
            view = value_view(loads(answer.output_json))
            if view is not None:
                call.output.CopyFrom(view)
            else:
                call.ClearField("output")
            call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
            call.preliminary = False
        else:
            close_call(call, answer.text or DENIED_BY_USER_TEXT)
        return
    if call.state != message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED:
        why = _answered_already(call) or (
            "it waits for its result (SubmitToolResults), not an approval"
            if is_waiting(call)
            else "it is not waiting for an approval"
        )
        raise ToolCallNotPending(call.tool_call_id, why)
    if answer.kind == "approve":
        call.state = message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED
        call.approval.approved = True
        call.approval.reason = answer.text
    else:
        deny_call(call, answer.text)


def answer_calls(
    conversation_id: str,
    messages: Sequence[message_pb2.Message],
    answers: Sequence[ToolCallAnswer],
    *,
    expired_before: dt.datetime | None,
) -> tuple[message_pb2.Message, AnsweredToolCalls]:
    """Apply ``answers`` to the conversation's ``messages`` (oldest first; the holding message is
    changed in place). Returns that message and the outcome; ``completed`` is true when this
    answered the message's last waiting call.

    Raises (changing nothing a caller stores) :class:`ToolCallNotFound`,
    :class:`ToolCallNotPending` (answered already, another kind of wait, or a user message
    follows the call's message), :class:`ToolCallExpired`, :class:`ToolCallsSpanMessages`,
    and :class:`ValueError` for an empty ``answers``.
    """
    if not answers:
        raise ValueError("no tool call answers to record")
    holder: int | None = None
    located: list[message_pb2.ToolCallPart] = []
    index_of: dict[str, tuple[int, message_pb2.ToolCallPart]] = {}
    call_of_approval: dict[str, str] = {}  # for the error of an approval id given as a call id
    for index, message in enumerate(messages):
        if message.role != message_pb2.ROLE_ASSISTANT:
            continue
        for part in message.parts:
            if part.WhichOneof("kind") == "tool_call":
                index_of.setdefault(part.tool_call.tool_call_id, (index, part.tool_call))
                if part.tool_call.approval.id:
                    call_of_approval[part.tool_call.approval.id] = part.tool_call.tool_call_id
    for answer in answers:
        found = index_of.get(answer.tool_call_id)
        if found is None:
            raise ToolCallNotFound(
                conversation_id, answer.tool_call_id, approval_of=call_of_approval.get(answer.tool_call_id)
            )
        index, call = found
        if holder is None:
            holder = index
        elif index != holder:
            raise ToolCallsSpanMessages(answer.tool_call_id)
        located.append(call)
    assert holder is not None
    message = messages[holder]
    if any(later.role == message_pb2.ROLE_USER for later in messages[holder + 1 :]):
        raise ToolCallNotPending(
            answers[0].tool_call_id, "the conversation moved on (a later user message) before this answer"
        )
    if (
        expired_before is not None
        and message.HasField("create_time")
        and message.create_time.ToDatetime(dt.UTC) < expired_before
        and any(is_waiting(call) for call in located)
    ):
        raise ToolCallExpired(answers[0].tool_call_id)
    before = [part.tool_call.tool_call_id for part in message.parts if _waits(part)]
    for call, answer in zip(located, answers, strict=True):
        _apply(call, answer)
    waiting = tuple(part.tool_call.tool_call_id for part in message.parts if _waits(part))
    return message, AnsweredToolCalls(
        message=message, waiting=waiting, completed=bool(before) and not waiting
    )


def _waits(part: message_pb2.Part) -> bool:
    return part.WhichOneof("kind") == "tool_call" and is_waiting(part.tool_call)
