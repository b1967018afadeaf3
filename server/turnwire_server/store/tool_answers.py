"""How a client's answer changes a waiting tool call: the rules every store applies atomically.

docs/semantics.md §6 and §12. Pure functions on ``turnwire.v1`` protos, shared by the
store backends (which apply them inside one write, so concurrent answers cannot race) and
the engine's transcript repair (:mod:`turnwire_server.engine.pending_calls`).

A call **waits** for the client when it is a client tool's call in ``input-available``
(``client_executed``) or an approval request (``approval-requested``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from turnwire.values import loads, value_view
from turnwire_client.v1 import message_pb2
from turnwire_server.store.base import AnsweredToolCalls, ToolCallAnswer
from turnwire_server.store.errors import (
    ToolCallExpired,
    ToolCallNotFound,
    ToolCallNotPending,
    ToolCallsSpanMessages,
)

DENIED_BY_USER_TEXT = "Tool execution denied by user"
"""A denial without a reason, and a client's error result without text (docs/semantics.md §6)."""


def expired_text(expiry_seconds: float | None = None) -> str:
    """The errored result of a waiting call that expired (docs/semantics.md §12)."""
    within = f"within {expiry_seconds:g} s " if expiry_seconds else ""
    return (
        f"The tool call expired: no result or approval arrived {within}"
        "(durability.pending_expiry_seconds), so it was closed without one."
    )


def is_waiting(call: message_pb2.ToolCallPart) -> bool:
    """True for a call that waits for the client: a client call without a result, or an approval
    request."""
    state = call.state
    return state == message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED or (
        call.client_executed and state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    )


def close_call(call: message_pb2.ToolCallPart, error_text: str) -> None:
    """Give ``call`` an errored result ``error_text`` (its input stays as it is)."""
    call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
    call.error_text = error_text
    call.preliminary = False
    call.ClearField("output")
    call.ClearField("output_json")


def deny_call(call: message_pb2.ToolCallPart, reason: str) -> None:
    """Record a denial: ``output-denied``, the client's ``reason`` in ``approval.reason``, and the
    text the model reads (the reason, or :data:`DENIED_BY_USER_TEXT`) in ``error_text``."""
    call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED
    call.approval.approved = False
    call.approval.reason = reason
    call.error_text = reason or DENIED_BY_USER_TEXT
    call.preliminary = False
    call.ClearField("output")
    call.ClearField("output_json")


def _apply(call: message_pb2.ToolCallPart, answer: ToolCallAnswer) -> None:
    """Record ``answer`` into ``call``, or raise :class:`ToolCallNotPending` when the call does not
    wait for this kind of answer."""
    if answer.kind in ("output", "error"):
        if not (call.client_executed and call.state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE):
            why = (
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
        why = (
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
    for index, message in enumerate(messages):
        if message.role != message_pb2.ROLE_ASSISTANT:
            continue
        for part in message.parts:
            if part.WhichOneof("kind") == "tool_call":
                index_of.setdefault(part.tool_call.tool_call_id, (index, part.tool_call))
    for answer in answers:
        found = index_of.get(answer.tool_call_id)
        if found is None:
            raise ToolCallNotFound(conversation_id, answer.tool_call_id)
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
