"""The store's errors: what a read or write could not do, and why (docs/semantics.md §8, §10).

Raised by every backend. Each carries its ``ErrorReason``, default status and retryability
(:class:`turnwire.errors.DomainError`); the API layer turns them into gRPC statuses
(``api/status.py``). A :class:`StoreError` that says nothing more is ``STORE_UNAVAILABLE``; a
:class:`StoreRefusal` says why a write was refused (nothing was stored).
"""

from __future__ import annotations

from turnwire.errors import CanonicalCode, DomainError, ErrorDetails
from turnwire_client.v1 import error_reason_pb2 as reasons
from turnwire_server.store.records import BudgetAsk, BudgetLimits, BudgetSpend


class StoreError(DomainError):
    """The store could not read or write (I/O, database unavailable): retryable.

    ``str(error)`` is the operator's text (logs, spans): it may name the store's address and
    quote the driver. ``public`` is what a client may read: never the store's user, host, port,
    database or file, nor the driver's text (docs/security.md); it defaults to the message,
    for errors whose message names none of these.
    """

    error_reason = reasons.ERROR_REASON_STORE_UNAVAILABLE
    status_code = CanonicalCode.UNAVAILABLE
    retryable = True
    retry_delay_seconds: float | None = 1.0

    def __init__(self, message: str, *, public: str | None = None) -> None:
        super().__init__(message)
        self.public = message if public is None else public

    @property
    def client_message(self) -> str:
        return f"store unavailable: {self.public}"


class StoreUnreachable(StoreError):
    """The database cannot be reached now (restarted, down, or cut off). Raised at once while the
    store knows the database is gone, so a call is refused quickly rather than left to wait out a
    connection timeout; retryable after the delay (docs/operate/outages.md). The client message
    names no address.

    ``in_flight``: the database went away while the operation was under way, so a write may have
    been applied (a COMMIT sent, its answer lost); False: refused before anything was sent."""

    retry_delay_seconds: float | None = 2.0

    def __init__(
        self,
        message: str,
        *,
        public: str = "the database cannot be reached; retry shortly",
        in_flight: bool = False,
    ) -> None:
        super().__init__(message, public=public)
        self.in_flight = in_flight

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"cause": "unreachable"}, retry_after_seconds=self.retry_delay_seconds)


class StoreFull(StoreError):
    """The store has no room for a write (a full disk, a size limit): nothing of the write was
    stored, what was stored before stays. ``RESOURCE_EXHAUSTED`` with reason ``STORE_FULL``,
    retryable once the operator frees space (docs/operate/outages.md); the store recovers by
    itself. The client message names neither the file nor the disk."""

    error_reason = reasons.ERROR_REASON_STORE_FULL
    status_code = CanonicalCode.RESOURCE_EXHAUSTED
    retry_delay_seconds: float | None = 10.0

    @property
    def client_message(self) -> str:
        return f"store full: {self.public}"


class StoreReadOnly(StoreError):
    """The store's file or disk refuses writes (a read-only mount, permissions): nothing was
    written; reads still work. ``UNAVAILABLE`` (reason ``STORE_UNAVAILABLE``, metadata ``cause:
    read_only``), retryable once the operator makes it writable again (docs/operate/outages.md)."""

    retry_delay_seconds: float | None = 10.0

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"cause": "read_only"}, retry_after_seconds=self.retry_delay_seconds)


class StoreRefusal(StoreError):
    """The store refused a read or write for what it asked, not for a failure: nothing was
    stored, and the same request fails again (not retryable). The client sees the message as is;
    subclasses set the reason and status."""

    status_code = CanonicalCode.FAILED_PRECONDITION
    retryable = False
    retry_delay_seconds: float | None = None

    @property
    def client_message(self) -> str:
        return self.public


class StoreValueRefused(StoreRefusal):
    """The database refused a value the request carried (a data exception, SQLSTATE class 22: a
    NUL character in a text value, a number out of range): the caller's to fix, not retryable.
    ``public`` names the operation only; the driver's text stays in ``str(error)``."""

    error_reason = reasons.ERROR_REASON_INVALID_FIELD
    status_code = CanonicalCode.INVALID_ARGUMENT


class StoreCorrupted(StoreError):
    """Something stored cannot be read back: a bug or a damaged file, not a passing failure
    (docs/semantics.md §11: never reported as a retryable ``UNAVAILABLE``)."""

    error_reason = reasons.ERROR_REASON_DATA_CORRUPTED
    status_code = CanonicalCode.INTERNAL
    retryable = False
    retry_delay_seconds = None

    @property
    def client_message(self) -> str:
        return f"stored data cannot be read: {self.public}"


class StoreInUse(StoreRefusal):
    """The database file is already served by another process (the embedded store serves one):
    a start-up refusal, not retryable until that process stops."""

    def __init__(self, path: object) -> None:
        super().__init__(
            f"the database {path} is in use by another turnwire process; the embedded SQLite store "
            "serves one process: stop that one, or give this one its own store.url"
        )


class MessageIdConflict(StoreRefusal):
    """A message with the same id and other content (or role) already exists in the conversation."""

    error_reason = reasons.ERROR_REASON_INVALID_FIELD
    status_code = CanonicalCode.ALREADY_EXISTS

    def __init__(self, conversation_id: str, message_id: str) -> None:
        super().__init__(
            f"message id {message_id!r} already exists in conversation {conversation_id!r} with other content"
        )
        self.conversation_id = conversation_id
        self.message_id = message_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(
            field_violations=(
                ("message.id", "choose an id not used in this conversation, or leave it empty"),
            )
        )


class MessageAlreadyAnswered(StoreRefusal):
    """A re-sent message (same id, same content) already has a completed reply; nothing was stored.

    docs/semantics.md §12 (idempotency conflicts): re-sending the latest user message that has
    no completed reply re-runs it; re-sending one that has a reply is refused.
    """

    error_reason = reasons.ERROR_REASON_ALREADY_ANSWERED

    def __init__(self, conversation_id: str, message_id: str) -> None:
        super().__init__(
            f"message {message_id!r} of conversation {conversation_id!r} was already answered; "
            "send a new message (a new id) to ask again"
        )
        self.conversation_id = conversation_id
        self.message_id = message_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"message_id": self.message_id})


class TurnAlreadyExists(StoreRefusal):
    """A turn with the same request id was already recorded, and this is not a retry of a failed,
    aborted or interrupted one with the same input.

    The message says which path does not store the question twice (docs/semantics.md §11,
    "Idempotent input"): a completed turn's reply is stored already; a turn that ended otherwise
    is retried under its request id with the same messages, ids included (the clients derive an
    input message's id from the request id, so repeating the same call is that retry).
    """

    error_reason = reasons.ERROR_REASON_INVALID_FIELD
    status_code = CanonicalCode.ALREADY_EXISTS

    def __init__(self, request_id: str, earlier_state: str) -> None:
        super().__init__(f"a turn with request_id {request_id!r} already exists: {_advice(earlier_state)}")
        self.request_id = request_id
        self.earlier_state = earlier_state

    def details(self) -> ErrorDetails:
        return ErrorDetails(field_violations=(("request_id", _advice(self.earlier_state)),))


def _advice(earlier_state: str) -> str:
    """What to do instead of sending input again under a taken request id (the path that does not
    store it twice)."""
    if earlier_state == "completed":
        return (
            "it completed and its reply is stored (GetConversation); "
            "a new question is a new turn under a new request_id"
        )
    if earlier_state in ("error", "aborted", "interrupted"):
        return (
            f"it ended {earlier_state}; retry it under this request_id with the same messages and message "
            "ids (repeating the same client call does), so the question is stored once; "
            "this request brings other input, which needs a new request_id"
        )
    return "it is still running; re-attach to it with ResumeTurn, and use a new request_id for a new turn"


class BudgetSpent(StoreRefusal):
    """A new turn's admission found a budget it would run under exhausted, or without room for
    its first step (``Store.admit_turn``'s ``refuse``; the rule:
    :func:`~turnwire_server.store.core.budget_writes.raise_spent`): nothing was stored.
    ``budget`` is the budget that refused, ``spend`` its state then, ``ask`` the first step's
    reservation it had no room for (None: the budget is spent). The engine reports it as its
    ``BudgetRefused``, naming the budget and when it resets (docs/cost.md, "Budgets")."""

    error_reason = reasons.ERROR_REASON_BUDGET_EXHAUSTED
    status_code = CanonicalCode.RESOURCE_EXHAUSTED

    def __init__(self, budget: BudgetLimits, spend: BudgetSpend, ask: BudgetAsk | None = None) -> None:
        what = "is spent" if ask is None else "has no room for the first step"
        super().__init__(f"the {budget.key.scope} budget {what}")
        self.budget = budget
        self.spend = spend
        self.ask = ask


class TurnNotFound(StoreRefusal):
    """No turn with this request id is recorded (:meth:`Store.finish_turn`): its conversation
    was deleted while it ran, or the id was never started. Nothing was stored."""

    error_reason = reasons.ERROR_REASON_TURN_NOT_FOUND
    status_code = CanonicalCode.NOT_FOUND

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"no turn {request_id!r} to finish (its conversation was deleted, or it never started)"
        )
        self.request_id = request_id


class LeaseLost(StoreRefusal):
    """A turn write carried a lease (:class:`~turnwire_server.store.records.TurnLease`) that is no
    longer the turn's: another replica claimed the turn after this one's lease lapsed (it was
    paused or cut off from the store for longer than ``durability.lease_seconds``), or the turn
    ended there. Nothing was written; the turn goes on where it was taken over, and the caller
    follows it with ResumeTurn (docs/semantics.md §5, "Fencing").

    ``ABORTED`` (the Google API guide's code for a lost concurrency check; retried at a higher
    level: re-attach, never resend the input) and retryable, with a short retry hint.
    """

    error_reason = reasons.ERROR_REASON_LEASE_LOST
    status_code = CanonicalCode.ABORTED
    retryable = True
    retry_delay_seconds: float | None = 1.0

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"this replica lost the lease of turn {request_id!r}: it was paused or cut off from the "
            "store longer than durability.lease_seconds and another replica took the turn over; "
            "nothing this replica produced since was stored. Follow the turn with ResumeTurn "
            "(request_id, the last sequence_number received) on any replica"
        )
        self.request_id = request_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(
            metadata={"request_id": self.request_id}, retry_after_seconds=self.retry_delay_seconds
        )


class ConversationNotFound(StoreRefusal):
    """The conversation does not exist and the write may not create it (:meth:`Store.add_messages`
    without ``allow_missing``). Nothing was stored."""

    error_reason = reasons.ERROR_REASON_CONVERSATION_NOT_FOUND
    status_code = CanonicalCode.NOT_FOUND

    def __init__(self, conversation_id: str) -> None:
        super().__init__(
            f"conversation {conversation_id!r} does not exist; set allow_missing to create it, "
            "or start it with Chat or SaveMessages"
        )
        self.conversation_id = conversation_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"conversation_id": self.conversation_id})


class ForkSourceNotFound(ConversationNotFound):
    """The conversation to fork does not exist (docs/forks.md). Nothing was stored."""

    def __init__(self, conversation_id: str) -> None:
        StoreRefusal.__init__(
            self,
            f"conversation {conversation_id!r} does not exist; fork a conversation that "
            "GetConversation finds",
        )
        self.conversation_id = conversation_id


class ConversationExists(StoreRefusal):
    """A fork's new conversation id is already a conversation's (docs/forks.md). Nothing was
    stored."""

    error_reason = reasons.ERROR_REASON_INVALID_FIELD
    status_code = CanonicalCode.ALREADY_EXISTS

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} already exists")
        self.conversation_id = conversation_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(
            field_violations=(
                (
                    "new_conversation_id",
                    "choose an id no conversation has, or leave it empty for a server-assigned one",
                ),
            )
        )


class ForkPointNotFound(StoreRefusal):
    """The message to fork at is not in the conversation's history (docs/forks.md). Nothing was
    stored."""

    error_reason = reasons.ERROR_REASON_INVALID_FIELD
    status_code = CanonicalCode.INVALID_ARGUMENT

    def __init__(self, conversation_id: str, message_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} has no message {message_id!r}")
        self.conversation_id = conversation_id
        self.message_id = message_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(
            field_violations=(
                (
                    "at_message_id",
                    "name a message of the conversation (GetConversation lists them); the fork "
                    "holds the messages up to and including it",
                ),
            )
        )


class MessageBeingWritten(StoreRefusal):
    """An upsert would replace the assistant message a running turn is still writing
    (docs/semantics.md §1); nothing was stored. Retry once that turn has ended."""

    error_reason = reasons.ERROR_REASON_INVALID_FIELD

    def __init__(self, conversation_id: str, message_id: str, request_id: str) -> None:
        super().__init__(
            f"message {message_id!r} of conversation {conversation_id!r} is being written by the "
            f"running turn {request_id!r}; wait for that turn to end (or cancel it), then retry"
        )
        self.conversation_id = conversation_id
        self.message_id = message_id
        self.request_id = request_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"message_id": self.message_id, "request_id": self.request_id})


class UnknownMessage(StoreRefusal):
    """:meth:`Store.add_messages` was given an id that may only replace a stored message (one in
    the server's reserved namespace, docs/semantics.md §5) and no message has it. Nothing was
    stored."""

    error_reason = reasons.ERROR_REASON_INVALID_FIELD
    status_code = CanonicalCode.INVALID_ARGUMENT

    def __init__(self, conversation_id: str, message_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} has no message {message_id!r} to replace")
        self.conversation_id = conversation_id
        self.message_id = message_id


class InvalidPageToken(StoreRefusal):
    """A page token was not issued by this store, or is for another query (AIP-158)."""

    error_reason = reasons.ERROR_REASON_INVALID_PAGE_TOKEN
    status_code = CanonicalCode.INVALID_ARGUMENT


class SubmissionConflict(StoreRefusal):
    """A submission id and an idempotency key name different submissions, or a submission id is
    reused with other content (docs/semantics.md §7, §12: ``ALREADY_EXISTS``)."""

    error_reason = reasons.ERROR_REASON_SUBMISSION_CONFLICT
    status_code = CanonicalCode.ALREADY_EXISTS

    def __init__(self, message: str, submission_id: str) -> None:
        super().__init__(message)
        self.submission_id = submission_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"submission_id": self.submission_id})


class SubmissionNotPending(StoreRefusal):
    """A submission's turn tried to start after the submission stopped being pending (it was
    cancelled, or its conversation deleted); nothing was stored. ``ABORTED`` when it was
    aborted, else ``FAILED_PRECONDITION``."""

    error_reason = reasons.ERROR_REASON_INPUT_NOT_STORED

    def __init__(self, submission_id: str, state: str) -> None:
        super().__init__(f"submission {submission_id!r} is {state}, so its turn does not run")
        self.submission_id = submission_id
        self.state = state
        if state == "aborted":
            self.status_code = CanonicalCode.ABORTED

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"submission_id": self.submission_id, "state": self.state})


class TooManySubmissions(StoreRefusal):
    """The conversation already has ``limit`` pending or running submissions (retryable once
    some have run)."""

    error_reason = reasons.ERROR_REASON_OVERLOADED
    status_code = CanonicalCode.RESOURCE_EXHAUSTED
    retryable = True
    retry_delay_seconds = 5.0

    def __init__(self, conversation_id: str, limit: int) -> None:
        super().__init__(
            f"conversation {conversation_id!r} already has {limit} submissions waiting "
            "(durability.max_pending_submissions_per_conversation); retry once some have run"
        )
        self.conversation_id = conversation_id
        self.limit = limit

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"limit": str(self.limit)}, retry_after_seconds=self.retry_delay_seconds)


class ToolCallRefusal(StoreRefusal):
    """A tool result or approval for ``tool_call_id`` was refused (docs/semantics.md §6, §12):
    nothing was stored."""

    tool_call_id: str

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"tool_call_id": self.tool_call_id})


class ToolCallNotFound(ToolCallRefusal):
    """A tool result or approval names no tool call of the conversation; nothing was stored."""

    error_reason = reasons.ERROR_REASON_TOOL_CALL_NOT_FOUND
    status_code = CanonicalCode.NOT_FOUND

    def __init__(self, conversation_id: str, tool_call_id: str, approval_of: str | None = None) -> None:
        """``approval_of``: the call whose approval id (``ToolApprovalRequest.approval_id``) was
        given where its ``tool_call_id`` belongs; the message says to answer with the call id."""
        message = f"conversation {conversation_id!r} has no tool call {tool_call_id!r}"
        if approval_of is not None:
            message += f"; that is the approval id of call {approval_of!r}: answer with its tool_call_id"
        super().__init__(message)
        self.conversation_id = conversation_id
        self.tool_call_id = tool_call_id


class ToolCallNotPending(ToolCallRefusal):
    """A tool result or approval names a call that does not wait for it (it has a result, waits for
    the other kind of answer, or the user moved past it); nothing was stored."""

    error_reason = reasons.ERROR_REASON_TOOL_CALL_NOT_PENDING

    def __init__(self, tool_call_id: str, why: str) -> None:
        super().__init__(f"tool call {tool_call_id!r} does not wait for this answer: {why}")
        self.tool_call_id = tool_call_id
        self.why = why


class ToolCallExpired(ToolCallRefusal):
    """A tool result or approval came after the call's pending expiry; nothing was stored."""

    error_reason = reasons.ERROR_REASON_EXPIRED

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(
            f"tool call {tool_call_id!r} expired before its answer arrived "
            "(durability.pending_expiry_seconds); it gets an errored result instead"
        )
        self.tool_call_id = tool_call_id


class ToolCallsSpanMessages(ToolCallRefusal):
    """One request answered calls of different assistant messages; nothing was stored."""

    error_reason = reasons.ERROR_REASON_INVALID_FIELD
    status_code = CanonicalCode.INVALID_ARGUMENT

    def __init__(self, tool_call_id: str) -> None:
        super().__init__(
            f"tool call {tool_call_id!r} belongs to another assistant message than the first one "
            "answered; answer each message's calls in their own request"
        )
        self.tool_call_id = tool_call_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(
            field_violations=(("tool_call_id", "answer the calls of one assistant message per request"),),
            metadata={"tool_call_id": self.tool_call_id},
        )
