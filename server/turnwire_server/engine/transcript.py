"""Transcript rules: repairing unresolved tool calls (the continuation prompt is
:data:`turnwire.providers.CONTINUATION_PROMPT`: providers see it too)."""

from __future__ import annotations

from collections.abc import Sequence

from turnwire.errors import INTERRUPTED_TOOL_ERROR
from turnwire_client.v1 import message_pb2

_UNRESOLVED = frozenset(
    {
        message_pb2.TOOL_CALL_STATE_UNSPECIFIED,
        message_pb2.TOOL_CALL_STATE_INPUT_STREAMING,
        message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE,
        message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED,
        message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED,
    }
)


def repair_unresolved_tool_calls(
    messages: Sequence[message_pb2.Message],
) -> list[message_pb2.Message]:
    """Give every tool call without a result an errored result, in place.

    Returns the messages that changed (to be stored). A call whose input is
    not a JSON object keeps an empty object as input.
    """
    changed: list[message_pb2.Message] = []
    for message in messages:
        if message.role != message_pb2.ROLE_ASSISTANT:
            continue
        touched = False
        for part in message.parts:
            if part.WhichOneof("kind") != "tool_call":
                continue
            call = part.tool_call
            if call.state in _UNRESOLVED:
                call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
                call.error_text = INTERRUPTED_TOOL_ERROR
                call.preliminary = False
                touched = True
        if touched:
            changed.append(message)
    return changed
