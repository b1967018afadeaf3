"""Transcript rules: repairing unresolved tool calls (the continuation prompt is
:data:`turnwire.providers.CONTINUATION_PROMPT`: providers see it too)."""

from __future__ import annotations

from collections.abc import Sequence

from turnwire.errors import INTERRUPTED_RUNNING_TOOL_ERROR, INTERRUPTED_TOOL_ERROR
from turnwire_client.v1 import message_pb2
from turnwire_server.store.waiting_calls import close_call

_UNRESOLVED = frozenset(
    {
        message_pb2.TOOL_CALL_STATE_UNSPECIFIED,
        message_pb2.TOOL_CALL_STATE_INPUT_STREAMING,
        message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE,
        message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED,
        message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED,
    }
)


def runnable_on_recovery(call: message_pb2.ToolCallPart) -> bool:
    """True for a call a recovery may still run (docs/semantics.md §8, "Tool effects"): one the
    sidecar runs (not the client's, not the provider's) whose input was complete and that has no
    result. Whether it does run depends on ``call.started`` and its tool's idempotency."""
    return (
        call.state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
        and not call.client_executed
        and not call.provider_executed
    )


def interrupt_call(call: message_pb2.ToolCallPart) -> None:
    """Give ``call`` (without a result) its interrupted result: for a started call (it may have
    had its effect) :data:`~turnwire.errors.INTERRUPTED_RUNNING_TOOL_ERROR` and ``interrupted``
    set, else :data:`~turnwire.errors.INTERRUPTED_TOOL_ERROR` (docs/semantics.md §8)."""
    close_call(call, INTERRUPTED_RUNNING_TOOL_ERROR if call.started else INTERRUPTED_TOOL_ERROR)
    call.interrupted = call.started


def repair_unresolved_tool_calls(
    messages: Sequence[message_pb2.Message], *, keep_runnable: bool = False
) -> list[message_pb2.Message]:
    """Give every tool call without a result its interrupted result (:func:`interrupt_call`), in
    place; with ``keep_runnable`` the calls :func:`runnable_on_recovery` are left open, for the
    recovery to run or interrupt once it knows their tools (``interrupted_calls``).

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
            if call.state in _UNRESOLVED and not (keep_runnable and runnable_on_recovery(call)):
                interrupt_call(call)
                touched = True
        if touched:
            changed.append(message)
    return changed


def mark_unknown_starts(message: message_pb2.Message) -> None:
    """Mark the calls of ``message`` a recovery may run ``started``, in place: ``message`` is the
    reply of a turn stored by a sidecar that did not record starts (``TurnSpec.tool_starts``
    false), so a call without the mark may have run (docs/semantics.md §8, "Tool effects")."""
    for part in message.parts:
        if part.WhichOneof("kind") == "tool_call" and runnable_on_recovery(part.tool_call):
            part.tool_call.started = True
