"""The store interface: conversations, messages and turn records.

One interface; today's backend is SQLite (WAL, one process), the embedded
default. A backend shared by several processes would implement the same
methods and carry the turn lock of :meth:`Store.turn_lock` across them. The
engine calls only what is here.

Durability rules (docs/semantics.md §8): :meth:`Store.start_turn`
returns only once the user's messages are durable; :meth:`Store.finish_turn`
returns only once the assistant message is durable. Checkpoints
(:meth:`Store.save_message`) may be batched by the backend (group commit) but
are applied in call order.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from turnwire_client.v1 import message_pb2

TurnState = Literal["running", "completed", "error", "aborted", "interrupted", "skipped"]
"""A turn record's state; ``running`` until the turn ends."""


class StoreError(Exception):
    """The store could not read or write (I/O, database unavailable)."""


class StoreCorrupted(StoreError):
    """Something stored cannot be read back: a bug or a damaged file, not a passing failure
    (docs/semantics.md §11: never reported as a retryable ``UNAVAILABLE``)."""


class StoreInUse(StoreError):
    """The database file is already served by another process (the embedded store serves one)."""

    def __init__(self, path: object) -> None:
        super().__init__(
            f"the database {path} is in use by another turnwire process; the embedded SQLite store "
            "serves one process: stop that one, or give this one its own store.url"
        )


class MessageIdConflict(StoreError):
    """A message with the same id and other content (or role) already exists in the conversation."""

    def __init__(self, conversation_id: str, message_id: str) -> None:
        super().__init__(
            f"message id {message_id!r} already exists in conversation {conversation_id!r} with other content"
        )
        self.conversation_id = conversation_id
        self.message_id = message_id


class MessageAlreadyAnswered(StoreError):
    """A re-sent message (same id, same content) already has a completed reply; nothing was stored.

    docs/semantics.md §12 (idempotency conflicts): re-sending the latest user message that has
    no completed reply re-runs it; re-sending one that has a reply is refused.
    """

    def __init__(self, conversation_id: str, message_id: str) -> None:
        super().__init__(
            f"message {message_id!r} of conversation {conversation_id!r} was already answered; "
            "send a new message (a new id) to ask again"
        )
        self.conversation_id = conversation_id
        self.message_id = message_id


class TurnAlreadyExists(StoreError):
    """A turn with the same request id was already recorded, and this is not a retry of a failed,
    aborted or interrupted one with the same input."""

    def __init__(self, request_id: str) -> None:
        super().__init__(f"a turn with request_id {request_id!r} already exists")
        self.request_id = request_id


class InvalidPageToken(StoreError):
    """A page token was not issued by this store, or is for another query."""


class ToolCallNotFound(StoreError):
    """A tool result or approval names no tool call of the conversation; nothing was stored."""

    def __init__(self, conversation_id: str, tool_call_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} has no tool call {tool_call_id!r}")
        self.conversation_id = conversation_id
        self.tool_call_id = tool_call_id


class ToolCallNotPending(StoreError):
    """A tool result or approval names a call that does not wait for it (it has a result, waits for
    the other kind of answer, or the user moved past it); nothing was stored."""

    def __init__(self, tool_call_id: str, why: str) -> None:
        super().__init__(f"tool call {tool_call_id!r} does not wait for this answer: {why}")
        self.tool_call_id = tool_call_id
        self.why = why


class ToolCallExpired(StoreError):
    """A tool result or approval came after the call's pending expiry; nothing was stored."""

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(
            f"tool call {tool_call_id!r} expired before its answer arrived "
            "(durability.pending_expiry_seconds); it gets an errored result instead"
        )
        self.tool_call_id = tool_call_id


class ToolCallsSpanMessages(StoreError):
    """One request answered calls of different assistant messages; nothing was stored."""

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(
            f"tool call {tool_call_id!r} belongs to another assistant message than the first one "
            "answered; answer each message's calls in their own request"
        )
        self.tool_call_id = tool_call_id


ToolCallAnswerKind = Literal["output", "error", "approve", "deny"]
"""What the client answered: a result (``output``), a failed result (``error``), an approval or a
denial."""


@dataclass(frozen=True, slots=True)
class ToolCallAnswer:
    """The client's answer to one waiting tool call (docs/semantics.md §6).

    ``output`` needs ``output_json`` (JSON text, stored exactly) and answers a client call;
    ``error`` answers a client call with ``text`` as the error (``Tool execution denied by
    user`` when empty); ``approve`` and ``deny`` answer an approval request, ``text`` being
    the denial's reason (default ``Tool execution denied by user``).
    """

    tool_call_id: str
    kind: ToolCallAnswerKind
    output_json: str = ""
    text: str = ""


@dataclass(frozen=True, slots=True)
class AnsweredToolCalls:
    """The outcome of :meth:`Store.answer_tool_calls`.

    ``message`` is the assistant message holding the calls, as stored now; ``waiting`` the
    ids of its calls that still wait for the client. ``completed`` is true for exactly one
    write per message: the one that answered its last waiting call.
    """

    message: message_pb2.Message
    waiting: tuple[str, ...]
    completed: bool


@dataclass(frozen=True, slots=True)
class ConversationRecord:
    """A conversation's metadata. Times are timezone-aware UTC."""

    conversation_id: str
    create_time: dt.datetime
    update_time: dt.datetime
    message_count: int


@dataclass(frozen=True, slots=True)
class TurnRecord:
    """One turn as the store knows it.

    ``error`` is a serialized ``google.rpc.Status`` when ``state`` is
    ``error``; ``recovery_count`` counts crash recoveries spent on this turn.
    """

    request_id: str
    conversation_id: str
    assistant_message_id: str
    continuation: bool
    model: str
    state: TurnState
    start_time: dt.datetime
    end_time: dt.datetime | None = None
    error: bytes | None = None
    recovery_count: int = 0


@runtime_checkable
class Store(Protocol):
    """Persistence for conversations, messages and turns.

    All methods raise :class:`StoreError` (or a subclass) when the backend
    fails. Messages are ``turnwire.v1.Message`` protos and round-trip
    losslessly.
    """

    async def open(self) -> None:
        """Connect and run pending schema migrations."""
        ...

    async def close(self) -> None:
        """Flush pending writes and disconnect."""
        ...

    async def get_conversation(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record, or ``None`` when it does not exist."""
        ...

    async def list_conversations(
        self, page_size: int, page_token: str
    ) -> tuple[list[ConversationRecord], str]:
        """One page of conversations, most recently updated first.

        Returns the records and the next page token ("" on the last page).
        Raises :class:`InvalidPageToken` for a token it did not issue, whatever the
        token holds (never another error: the API reports it as the client's mistake).
        """
        ...

    async def load_messages(self, conversation_id: str) -> list[message_pb2.Message]:
        """All messages of the conversation, oldest first ([] when none)."""
        ...

    async def start_turn(self, turn: TurnRecord, messages: Sequence[message_pb2.Message]) -> None:
        """Durably create the conversation if needed, append ``messages`` and record ``turn``.

        One transaction. Raises :class:`MessageIdConflict` (and stores
        nothing) when a message id already exists in the conversation.
        """
        ...

    async def save_message(self, conversation_id: str, message: message_pb2.Message) -> None:
        """Insert or replace ``message`` (by id): the checkpoint of a streaming reply."""
        ...

    async def finish_turn(
        self,
        turn: TurnRecord,
        message: message_pb2.Message | None,
    ) -> None:
        """Durably store the final assistant ``message`` (when given) and ``turn``'s end state."""
        ...

    async def answer_tool_calls(
        self,
        conversation_id: str,
        answers: Sequence[ToolCallAnswer],
        *,
        expired_before: dt.datetime | None,
    ) -> AnsweredToolCalls:
        """Record the client's ``answers`` into the assistant message holding the calls, atomically
        (docs/semantics.md §6, §12).

        One read-modify-write, applied alone: of concurrent calls answering the calls of one
        message, exactly one gets ``completed`` (the one that answered the last waiting call),
        so exactly one continuation runs. A client result needs a client call in
        ``input-available``; an approval answer a call in ``approval-requested``; either way no
        user message may follow the call's message (moved past). ``expired_before``: a call
        whose message was created before it has expired (None: no expiry).

        Raises, storing nothing: :class:`ToolCallNotFound`, :class:`ToolCallNotPending`,
        :class:`ToolCallExpired`, :class:`ToolCallsSpanMessages`; :class:`ValueError` for an
        empty ``answers``.
        """
        ...

    async def expire_pending_tool_calls(self, cutoff: dt.datetime) -> int:
        """Give every call still waiting for the client (a client call without a result, an
        approval request) whose assistant message was created before ``cutoff`` an errored
        result naming the expiry, so the model is told (docs/semantics.md §12). Returns how many
        calls expired. The maintenance loop calls it periodically."""
        ...

    async def running_turns(self) -> list[TurnRecord]:
        """Turns still recorded as ``running`` (after a crash, to recover)."""
        ...

    def turn_lock(self, conversation_id: str) -> AbstractAsyncContextManager[None]:
        """Hold the conversation's turn lock: one turn at a time, first in, first out.

        The SQLite backend holds it in the process (one process per database file).
        """
        ...
