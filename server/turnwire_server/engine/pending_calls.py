"""Tool calls that wait for the client, and the transcript rules that keep or close them.

docs/semantics.md §6 and §8. A call **waits** when it is a client tool's call in
``input-available`` (``client_executed``) or an approval request
(``approval-requested``). Transcript repair (run before every turn's first model
call) never destroys such a call while the client may still answer it:

- a waiting call is kept while no user message follows its assistant message
  (a continuation or ``GetConversation`` leaves it as it is); the provider is
  then sent a placeholder result for it (:data:`PENDING_TOOL_TEXT`, not stored),
  so a request never carries a call without a result;
- once a later user message is stored (the user moved past it), it becomes an
  errored result, :data:`MOVED_PAST_TOOL_ERROR`, and the repair is stored;
- one older than ``pending_expiry_seconds`` (0: never; measured from its
  assistant message's ``create_time``) becomes an errored result naming the
  expiry (:func:`expired_text`), stored;
- an approved call (``approval-responded``, approved) is left for the turn to run
  before its first model call (:mod:`turnwire_server.engine.approvals`);
- every other call without a result (interrupted) gets
  :data:`~turnwire_server.engine.transcript.INTERRUPTED_TOOL_ERROR`, as before.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from turnwire_client.v1 import message_pb2
from turnwire_server.engine.transcript import INTERRUPTED_TOOL_ERROR
from turnwire_server.store.tool_answers import close_call, deny_call, expired_text, is_waiting

MOVED_PAST_TOOL_ERROR = (
    "The tool call got no result: the conversation moved on (a later user message) before the "
    "client sent one."
)
"""The stored result of a waiting call once a later user message is stored (docs/semantics.md §8)."""

PENDING_TOOL_TEXT = "The tool call has no result yet: it waits for the client."
"""What the model is sent for a call that still waits (never stored; docs/semantics.md §8)."""

_RESULT_STATES = frozenset(
    {
        message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
        message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
        message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED,
    }
)


def is_approved(call: message_pb2.ToolCallPart) -> bool:
    """True for an approved call that has not run yet."""
    return call.state == message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED and call.approval.approved


def expiry_cutoff(now: dt.datetime, expiry_seconds: float) -> dt.datetime | None:
    """The create time before which a waiting call is expired; None when expiry is off (0)."""
    return now - dt.timedelta(seconds=expiry_seconds) if expiry_seconds > 0 else None


def repair_pending(
    messages: Sequence[message_pb2.Message], *, now: dt.datetime, expiry_seconds: float
) -> list[message_pb2.Message]:
    """Apply the module's rules to ``messages`` in place; returns the messages that changed
    (to be stored). Waiting calls that may still be answered are left as they are."""
    cutoff = expiry_cutoff(now, expiry_seconds)
    changed: list[message_pb2.Message] = []
    user_after = False
    for message in reversed(messages):
        if message.role == message_pb2.ROLE_USER:
            user_after = True
            continue
        if message.role != message_pb2.ROLE_ASSISTANT:
            continue
        expired: bool | None = None  # decided at the message's first open call: most have none
        touched = False
        for part in message.parts:
            if part.WhichOneof("kind") != "tool_call":
                continue
            call = part.tool_call
            if call.state in _RESULT_STATES:
                continue
            if expired is None:
                expired = (
                    cutoff is not None
                    and message.HasField("create_time")
                    and message.create_time.ToDatetime(dt.UTC) < cutoff
                )
            if is_waiting(call):
                if expired:
                    close_call(call, expired_text(expiry_seconds))
                elif user_after:
                    close_call(call, MOVED_PAST_TOOL_ERROR)
                else:
                    continue
            elif is_approved(call):
                continue
            elif call.state == message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED:
                deny_call(call, call.approval.reason)
            else:
                close_call(call, INTERRUPTED_TOOL_ERROR)
            touched = True
        if touched:
            changed.append(message)
    changed.reverse()
    return changed


def with_pending_placeholders(messages: Sequence[message_pb2.Message]) -> list[message_pb2.Message]:
    """``messages`` as the model is sent them: a copy of each message holding a call without a
    result, with :data:`PENDING_TOOL_TEXT` as that call's errored result (the stored ones are
    unchanged). Others are passed through as they are."""
    result: list[message_pb2.Message] = []
    for message in messages:
        if message.role == message_pb2.ROLE_ASSISTANT and any(
            part.WhichOneof("kind") == "tool_call" and part.tool_call.state not in _RESULT_STATES
            for part in message.parts
        ):
            copy = message_pb2.Message()
            copy.CopyFrom(message)
            for part in copy.parts:
                if part.WhichOneof("kind") == "tool_call" and part.tool_call.state not in _RESULT_STATES:
                    close_call(part.tool_call, PENDING_TOOL_TEXT)
            result.append(copy)
        else:
            result.append(message)
    return result
