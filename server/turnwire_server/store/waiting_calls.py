"""Tool calls that wait for the client, and how one is closed or denied: part of the store's
interface (with :mod:`~turnwire_server.store.base` and :mod:`~turnwire_server.store.errors`), the
one place both sides apply the same rule: the stores inside the writes that answer or expire a
call (:mod:`turnwire_server.store.core.tool_answers`), the engine when it repairs a transcript
(:mod:`turnwire_server.engine.pending_calls`). docs/semantics.md §6 and §12; pure functions on
``turnwire.v1`` protos, importing nothing of the store.

A call **waits** for the client when it is a client tool's call in ``input-available``
(``client_executed``) or an approval request (``approval-requested``).
"""

from __future__ import annotations

from turnwire_client.v1 import message_pb2

__all__ = ["DENIED_BY_USER_TEXT", "close_call", "deny_call", "expired_text", "is_waiting"]

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
