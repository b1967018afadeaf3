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
- every other call without a result (interrupted) gets its interrupted result
  (:func:`~turnwire_server.engine.transcript.interrupt_call`: whether it was started decides
  the text and ``interrupted``; a recovery of its own turn may run it instead, §8 "Tool
  effects").
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence

from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CACHES, CacheBudget
from turnwire_server.engine.transcript import interrupt_call
from turnwire_server.store.waiting_calls import close_call, deny_call, expired_text, is_waiting

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
    interrupted) are in a history (issue 17: the engine's per-turn work over the history is this
    one search, and for a conversation only appended to since its last search, only the new
    messages are searched).

    ``history`` is the list searched, the engine's own (its messages are never changed in place,
    they are shared with the store: :func:`repair_pending` and the approved calls replace a
    message by a changed copy in this list, and only ever close calls, so the messages at ``at``
    stay a superset of the ones with open calls); ``at`` the indexes in it of the assistant
    messages that held an open call, ascending; ``last_user`` the index of its last user message
    (-1: none); ``reply_at`` the index of the message whose id :meth:`find` was given as
    ``reply_id`` (-1: none or not given).
    """

    history: list[message_pb2.Message]
    at: tuple[int, ...]
    last_user: int = -1
    reply_at: int = -1

    @classmethod
    def find(
        cls, history: Sequence[message_pb2.Message], *, reply_id: str = "", conversation_id: str = ""
    ) -> OpenCalls:
        """Search ``history`` (kept as :attr:`history` when a list, else as a list of it). With
        ``conversation_id`` the search is kept (:data:`_SEARCHES`) and the next one of that
        conversation searches only the messages after the ones it finds again there, the very
        same objects at the same places (an edited, removed or reordered message is a new object
        or a shift: then all of it is searched again). Only assistant messages' parts are walked,
        and a message's walk stops at its first open call."""
        search = _SEARCHES.search(conversation_id, history) if conversation_id else _Search.of(history)
        if not isinstance(history, list):
            history = list(history)
        reply_at = search.ids.get(reply_id, -1) if reply_id else -1
        return cls(history, tuple(search.at), search.last_user, reply_at)

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
    """Apply the module's rules to the messages of ``open_calls.history`` that ``open_calls``
    found: each message that changes is copied, the copy changed and put in its place in
    ``open_calls.history`` (the messages are shared, never changed in place); returns the copies
    (to be stored), in history order. Waiting calls that may still be answered are left as they
    are."""
    cutoff = expiry_cutoff(now, expiry_seconds)
    changed: list[message_pb2.Message] = []
    history = open_calls.history
    for index in open_calls.at:
        message = history[index]
        user_after = open_calls.last_user > index
        expired: bool | None = None  # decided at the message's first open call
        copy: message_pb2.Message | None = None
        for position, part in enumerate(message.parts):
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
                    error: str | None = expired_text(expiry_seconds)
                elif user_after:
                    error = MOVED_PAST_TOOL_ERROR
                else:
                    continue
            elif is_approved(call):
                continue
            elif call.state == message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED:
                error = None  # a denial
            else:
                error = ""  # interrupted
            if copy is None:
                copy = message_pb2.Message()
                copy.CopyFrom(message)
            target = copy.parts[position].tool_call
            if error is None:
                deny_call(target, target.approval.reason)
            elif not error:
                interrupt_call(target)
            else:
                close_call(target, error)
        if copy is not None:
            history[index] = copy
            changed.append(copy)
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


@dataclasses.dataclass(slots=True)
class _Search:
    """One search of a history: ``messages`` searched (a tuple: what the store handed out),
    ``at`` and ``last_user`` as in :class:`OpenCalls`, ``ids`` every message's index by id."""

    messages: tuple[message_pb2.Message, ...]
    at: list[int]
    last_user: int
    ids: dict[str, int]

    @classmethod
    def of(cls, history: Sequence[message_pb2.Message]) -> _Search:
        """A search of all of ``history``."""
        search = cls((), [], -1, {})
        search.extend(history if isinstance(history, tuple) else tuple(history))
        return search

    def extend(self, history: tuple[message_pb2.Message, ...]) -> None:
        """Search the messages of ``history`` after :attr:`messages` (which it starts with), and
        hold ``history``."""
        at, ids = self.at, self.ids
        last_user = self.last_user
        user, assistant = message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT
        result_states = _RESULT_STATES
        for index in range(len(self.messages), len(history)):
            message = history[index]
            role = message.role
            if role == user:
                last_user = index
            elif role == assistant:
                # HasField is cheaper than WhichOneof here, and most parts are not calls.
                for part in message.parts:
                    if part.HasField("tool_call") and part.tool_call.state not in result_states:
                        at.append(index)
                        break
            ids[message.id] = index
        self.messages, self.last_user = history, last_user


SEARCH_BYTES_PER_MESSAGE = 180
"""RSS a kept search costs per message it covers: a reference to the store's shared message,
the message id (a new str) and its slot in the id map (``bench/cache_entry_sizes.py``)."""


class _Searches:
    """The last search of each recently searched conversation, in the process's cache budget
    (``turnwire_server.cache_budget``, issue 32 item 11: least recently used out first, with the
    other caches of conversations), each counting :data:`SEARCH_BYTES_PER_MESSAGE` per message
    (the messages are the store's shared objects, counted there). Holding the searched objects
    also keeps their ``id()`` from being reused, so "the same object" is a sound test. Not
    thread-safe: the event loop's."""

    def __init__(self, budget: CacheBudget = CACHES) -> None:
        self.region = budget.region("open-call searches")

    def search(self, conversation_id: str, history: Sequence[message_pb2.Message]) -> _Search:
        """The search of ``history``, ``conversation_id``'s messages now: the kept one extended by
        the new messages when ``history`` starts with its very messages, else a new one."""
        messages = history if isinstance(history, tuple) else tuple(history)
        kept: _Search | None = self.region.get(conversation_id)  # type: ignore[assignment]
        if kept is not None:
            held = kept.messages
            if len(held) <= len(messages) and held == messages[: len(held)]:  # in C; same objects
                kept.extend(messages)
            else:
                kept = None
        if kept is None:
            kept = _Search.of(messages)
        self.region.put(conversation_id, kept, len(messages) * SEARCH_BYTES_PER_MESSAGE)
        return kept


_SEARCHES = _Searches()
"""The engine's kept searches."""
