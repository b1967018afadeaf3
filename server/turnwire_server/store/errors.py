"""The store's errors: what a read or write could not do, and why (docs/semantics.md §8, §10).

Raised by every backend; the API layer maps them to gRPC statuses (``api/status.py``).
"""

from __future__ import annotations


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


class TurnNotFound(StoreError):
    """No turn with this request id is recorded (:meth:`Store.finish_turn`): its conversation
    was deleted while it ran, or the id was never started. Nothing was stored."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"no turn {request_id!r} to finish (its conversation was deleted, or it never started)"
        )
        self.request_id = request_id


class ConversationNotFound(StoreError):
    """The conversation does not exist and the write may not create it (:meth:`Store.add_messages`
    without ``allow_missing``). Nothing was stored."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(
            f"conversation {conversation_id!r} does not exist; set allow_missing to create it, "
            "or start it with Chat or SaveMessages"
        )
        self.conversation_id = conversation_id


class MessageBeingWritten(StoreError):
    """An upsert would replace the assistant message a running turn is still writing
    (docs/semantics.md §1); nothing was stored. Retry once that turn has ended."""

    def __init__(self, conversation_id: str, message_id: str, request_id: str) -> None:
        super().__init__(
            f"message {message_id!r} of conversation {conversation_id!r} is being written by the "
            f"running turn {request_id!r}; wait for that turn to end (or cancel it), then retry"
        )
        self.conversation_id = conversation_id
        self.message_id = message_id
        self.request_id = request_id


class UnknownMessage(StoreError):
    """:meth:`Store.add_messages` was given an id that may only replace a stored message (one in
    the server's reserved namespace, docs/semantics.md §5) and no message has it. Nothing was
    stored."""

    def __init__(self, conversation_id: str, message_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} has no message {message_id!r} to replace")
        self.conversation_id = conversation_id
        self.message_id = message_id


class InvalidPageToken(StoreError):
    """A page token was not issued by this store, or is for another query."""


class SubmissionConflict(StoreError):
    """A submission id and an idempotency key name different submissions, or a submission id is
    reused with other content (docs/semantics.md §7, §12: ``ALREADY_EXISTS``)."""

    def __init__(self, message: str, submission_id: str) -> None:
        super().__init__(message)
        self.submission_id = submission_id


class SubmissionNotPending(StoreError):
    """A submission's turn tried to start after the submission stopped being pending (it was
    cancelled, or its conversation deleted); nothing was stored."""

    def __init__(self, submission_id: str, state: str) -> None:
        super().__init__(f"submission {submission_id!r} is {state}, so its turn does not run")
        self.submission_id = submission_id
        self.state = state


class TooManySubmissions(StoreError):
    """The conversation already has ``limit`` pending or running submissions."""

    def __init__(self, conversation_id: str, limit: int) -> None:
        super().__init__(
            f"conversation {conversation_id!r} already has {limit} submissions waiting "
            "(durability.max_pending_submissions_per_conversation); retry once some have run"
        )
        self.conversation_id = conversation_id
        self.limit = limit


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
