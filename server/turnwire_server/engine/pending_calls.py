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

import dataclasses
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


@dataclasses.dataclass(frozen=True, slots=True)
class OpenCalls:
    """Where the calls without a result (open: waiting, approval requested or responded,
    interrupted) are in a history, found in one pass over it (issue 17: the engine's per-turn
    work over the history is that pass, not one per rule).

    ``history`` is the list searched (its messages may change in place afterwards: repair and
    approved calls only ever close calls, so the messages at ``at`` stay a superset of the ones
    with open calls); ``at`` the indexes in it of the assistant messages that held an open call,
    ascending; ``last_user`` the index of its last user message (-1: none); ``reply_at`` the index
    of the message whose id :meth:`find` was given as ``reply_id`` (-1: none or not given).
    """

    history: list[message_pb2.Message]
    at: tuple[int, ...]
    last_user: int = -1
    reply_at: int = -1

    @classmethod
    def find(cls, history: Sequence[message_pb2.Message], *, reply_id: str = "") -> OpenCalls:
        """Search ``history`` once (kept as :attr:`history` when a list, else as a list of it).
        Only assistant messages' parts are walked (a role check is all the others cost), and a
        message's walk stops at its first open call."""
        if not isinstance(history, list):
            history = list(history)
        at: list[int] = []
        last_user = reply_at = -1
        user, assistant = message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT
        result_states = _RESULT_STATES
        for index, message in enumerate(history):
            role = message.role
            if role == user:
                last_user = index
            elif role == assistant:
                # HasField is cheaper than WhichOneof here, and most parts are not calls.
                for part in message.parts:
                    if part.HasField("tool_call") and part.tool_call.state not in result_states:
                        at.append(index)
                        break
            if reply_id and message.id == reply_id:
                reply_at = index
        return cls(history, tuple(at), last_user, reply_at)

    def messages(self) -> list[message_pb2.Message]:
        """The messages at :attr:`at`, in history order."""
        history = self.history
        return [history[index] for index in self.at]

    def without_reply(self) -> OpenCalls:
        """This search with the ``reply_id`` message dropped from the history (a new list; this
        one when it was not there), the indexes moved to match."""
        dropped = self.reply_at
        if dropped < 0:
            return self
        history = [*self.history[:dropped], *self.history[dropped + 1 :]]
        at = tuple(index - (index > dropped) for index in self.at if index != dropped)
        last_user = self.last_user
        if last_user == dropped:  # only a user message with the reply's id: look further back
            last_user = next(
                (i for i in range(dropped - 1, -1, -1) if history[i].role == message_pb2.ROLE_USER), -1
            )
        elif last_user > dropped:
            last_user -= 1
        return OpenCalls(history, at, last_user)


def has_open_call(message: message_pb2.Message) -> bool:
    """True when ``message`` holds a tool call without a result."""
    return any(
        part.HasField("tool_call") and part.tool_call.state not in _RESULT_STATES for part in message.parts
    )


def repair_pending(
    open_calls: OpenCalls, *, now: dt.datetime, expiry_seconds: float
) -> list[message_pb2.Message]:
    """Apply the module's rules, in place, to the messages of ``open_calls.history`` that
    ``open_calls`` found; returns the messages that changed (to be stored), in history order.
    Waiting calls that may still be answered are left as they are."""
    cutoff = expiry_cutoff(now, expiry_seconds)
    changed: list[message_pb2.Message] = []
    history = open_calls.history
    for index in open_calls.at:
        message = history[index]
        user_after = open_calls.last_user > index
        expired: bool | None = None  # decided at the message's first open call
        touched = False
        for part in message.parts:
            if not part.HasField("tool_call"):
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
    return changed


def with_pending_placeholders(open_calls: OpenCalls) -> list[message_pb2.Message]:
    """``open_calls.history`` as the model is sent it: a copy of each message still holding a
    call without a result, with :data:`PENDING_TOOL_TEXT` as that call's errored result (the
    stored ones are unchanged). Others are passed through as they are; only the messages
    ``open_calls`` found are looked at."""
    result = list(open_calls.history)
    for index in open_calls.at:
        message = result[index]
        if not has_open_call(message):  # closed since the search (repair, an approved call run)
            continue
        copy = message_pb2.Message()
        copy.CopyFrom(message)
        for part in copy.parts:
            if part.HasField("tool_call") and part.tool_call.state not in _RESULT_STATES:
                close_call(part.tool_call, PENDING_TOOL_TEXT)
        result[index] = copy
    return result
