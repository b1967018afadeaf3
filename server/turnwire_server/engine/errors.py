"""The engine's domain errors, each with its ``ErrorReason``, default status and retryability
(:class:`turnwire.errors.DomainError`). The API layer (``turnwire_server.api.status``) alone turns
them into gRPC statuses with ``google.rpc`` details."""

from __future__ import annotations

from turnwire.errors import CanonicalCode, DomainError, ErrorDetails
from turnwire.hooks import ErrorStage
from turnwire_client.v1 import error_reason_pb2 as reasons


class ModelTimeout(DomainError, TimeoutError):
    """A model call ran past a ``TurnConfig.timeout`` limit (a ``TimeoutError``: classified
    ``transient``, turnwire.error_classes)."""

    error_reason = reasons.ERROR_REASON_MODEL_TIMEOUT
    status_code = CanonicalCode.DEADLINE_EXCEEDED
    retryable = True
    retry_delay_seconds = 1.0


class TurnFailure(Exception):
    """A turn failed at ``stage``; ``error`` (also ``__cause__``) is the original error."""

    def __init__(self, stage: ErrorStage, error: BaseException) -> None:
        super().__init__(str(error))
        self.stage = stage
        self.error = error
        self.__cause__ = error


def drop_tracebacks(error: BaseException | None) -> None:
    """Clear the tracebacks of ``error`` and of every error it leads to (``__cause__``, which
    is :class:`TurnFailure`'s ``error``; ``__context__``; an exception group's members). For an error
    kept after it was logged and recorded: its frames hold whatever raised it (a turn's run, which
    keeps the error), a cycle only the collector would free (docs/architecture.md, "A turn's
    objects")."""
    seen: set[int] = set()
    pending = [error]
    while pending:
        each = pending.pop()
        if each is None or id(each) in seen:
            continue
        seen.add(id(each))
        each.__traceback__ = None
        pending.extend((each.__cause__, each.__context__))
        if isinstance(each, BaseExceptionGroup):
            pending.extend(each.exceptions)


class AdmissionRefused(DomainError):
    """A turn was not admitted; nothing was stored. Subclasses say why (and their reason)."""

    status_code = CanonicalCode.FAILED_PRECONDITION


class ShuttingDown(AdmissionRefused):
    """The engine is draining for shutdown and takes no new turns."""

    error_reason = reasons.ERROR_REASON_SHUTTING_DOWN
    status_code = CanonicalCode.UNAVAILABLE
    retryable = True
    retry_delay_seconds = 1.0

    def __init__(self) -> None:
        super().__init__("the sidecar is shutting down and takes no new turns; retry on another replica")


class RequestIdInUse(AdmissionRefused):
    """A turn with this request id is already running."""

    error_reason = reasons.ERROR_REASON_INVALID_FIELD
    status_code = CanonicalCode.ALREADY_EXISTS

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"a turn with request_id {request_id!r} is already running; to follow it re-attach with "
            "ResumeTurn (sending it again would not run it twice), and use a new request_id for a new turn"
        )
        self.request_id = request_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(field_violations=(("request_id", "already used by a running turn"),))


class NestedTurn(AdmissionRefused):
    """A blocking turn was requested from inside an active turn of the same conversation
    (it would wait for its own parent's lock forever)."""

    error_reason = reasons.ERROR_REASON_NESTED_TURN

    def __init__(self, parent_request_id: str) -> None:
        super().__init__(
            "cannot be called from inside an active turn of the same conversation: it would wait "
            "for that turn to end; to add input from inside it, use SubmitMessages (its turn runs "
            "after this one) or AddMessages (no turn)"
        )
        self.parent_request_id = parent_request_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"parent_request_id": self.parent_request_id})


class QueueFull(AdmissionRefused):
    """The conversation already has ``limit`` turns waiting."""

    error_reason = reasons.ERROR_REASON_OVERLOADED
    status_code = CanonicalCode.RESOURCE_EXHAUSTED
    retryable = True
    retry_delay_seconds = 1.0

    def __init__(self, conversation_id: str, limit: int) -> None:
        super().__init__(
            f"conversation {conversation_id!r} already has {limit} turns waiting; "
            "retry after the running turns finish"
        )
        self.conversation_id = conversation_id
        self.limit = limit

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"limit": str(self.limit)}, retry_after_seconds=self.retry_delay_seconds)


class InputNotStored(DomainError):
    """The turn ended before its input was stored: nothing of it is kept; resend to run it.

    docs/semantics.md §5 (Decision: the start event is an acknowledgement).
    """

    error_reason = reasons.ERROR_REASON_INPUT_NOT_STORED
    status_code = CanonicalCode.CANCELLED

    def __init__(self, why: str) -> None:
        super().__init__(f"the turn did not run and its input was not stored: {why}; resend it to run it")
        self.why = why


class ConversationDeleted(DomainError):
    """The turn's conversation was deleted (DeleteConversation, retention): the turn was stopped
    first, and nothing of it is kept (docs/semantics.md §12, deleting)."""

    error_reason = reasons.ERROR_REASON_CONVERSATION_DELETED
    status_code = CanonicalCode.ABORTED

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} was deleted; the turn was stopped")
        self.conversation_id = conversation_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"conversation_id": self.conversation_id})


class StreamStalled(DomainError):
    """The stall watchdog stopped the turn: no event for ``stream_stall_timeout_seconds``."""

    error_reason = reasons.ERROR_REASON_STREAM_STALLED
    status_code = CanonicalCode.DEADLINE_EXCEEDED

    @property
    def client_message(self) -> str:
        return f"the turn was interrupted: {self}"


class SlowConsumer(DomainError):
    """The client read nothing of a full stream buffer for ``seconds``; the turn was stopped
    (``stopped``), or, with disconnect policy CONTINUE, goes on without that call."""

    error_reason = reasons.ERROR_REASON_SLOW_CONSUMER
    status_code = CanonicalCode.RESOURCE_EXHAUSTED

    def __init__(self, seconds: float, *, stopped: bool = True) -> None:
        what = "the turn was stopped and its partial reply stored" if stopped else "the call was let go"
        super().__init__(
            f"the client read no event for {seconds:g} s while the stream's buffer was full "
            f"(limits.slow_reader_timeout_seconds); {what}"
        )
        self.seconds = seconds
        self.stopped = stopped


class NothingToContinue(DomainError):
    """ContinueLastTurn found no assistant message at the end of the conversation, or SaveMessages
    with no messages found no history (SKIPPED).
    ``last_role``: the role of the conversation's last message ("user", "system"), "" when it has
    none. A last user message has no reply yet (a turn cancelled before any reply, say): the message
    says how to have it answered (docs/semantics.md §1)."""

    error_reason = reasons.ERROR_REASON_NOTHING_TO_CONTINUE
    status_code = CanonicalCode.FAILED_PRECONDITION

    def __init__(self, last_role: str) -> None:
        if not last_role:
            why = "the conversation has no messages"
        elif last_role == "user":
            why = (
                "the last message is the user's and has no reply yet (to have it answered, run a turn "
                "on the history as it is: SaveMessages with no messages)"
            )
        else:
            why = f"the last message is not the assistant's but the {last_role}'s"
        super().__init__(f"nothing to continue: {why}; the turn was skipped and nothing was stored")
        self.last_role = last_role

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"last_role": self.last_role})


class ServerRestarted(DomainError):
    """A turn was cut short by a server restart (crash) and is not recovered: recovery is off, its
    budget is spent (``exhausted``: reason ``RECOVERY_EXHAUSTED``), or it was stored before
    recovery data existed."""

    error_reason = reasons.ERROR_REASON_SERVER_RESTARTED
    status_code = CanonicalCode.UNAVAILABLE

    def __init__(self, why: str, *, exhausted: bool = False) -> None:
        super().__init__(f"the turn was interrupted by a server restart and not recovered: {why}")
        self.exhausted = exhausted
        if exhausted:
            self.error_reason = reasons.ERROR_REASON_RECOVERY_EXHAUSTED


class TurnStreamNotFound(DomainError):
    """ResumeTurn / WatchSubmission found no stream for the request id (``expired``: it ended longer
    ago than the event retention; ``conversation_id``: the conversation that still stores the
    reply of such a turn, in the ErrorInfo metadata as ``conversation_id``, so a caller can read it
    there)."""

    error_reason = reasons.ERROR_REASON_TURN_NOT_FOUND
    status_code = CanonicalCode.NOT_FOUND

    def __init__(
        self, message: str, *, request_id: str, expired: bool = False, conversation_id: str = ""
    ) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.expired = expired
        self.conversation_id = conversation_id

    def details(self) -> ErrorDetails:
        metadata = {"request_id": self.request_id, "expired": str(self.expired).lower()}
        if self.conversation_id:
            metadata["conversation_id"] = self.conversation_id
        return ErrorDetails(metadata=metadata)


class TurnNotHere(DomainError):
    """The turn's stream has not ended but the turn runs nowhere in this process (interrupted by a
    crash and not recovered yet); retrying later may find it."""

    error_reason = reasons.ERROR_REASON_SERVER_RESTARTED
    status_code = CanonicalCode.UNAVAILABLE
    retryable = True
    retry_delay_seconds = 1.0

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"turn {request_id!r} has not ended but is not running on this server "
            "(interrupted by a crash, recovery pending); retry ResumeTurn shortly"
        )
        self.request_id = request_id


class SubmissionNotFound(DomainError):
    """No submission has this id."""

    error_reason = reasons.ERROR_REASON_SUBMISSION_NOT_FOUND
    status_code = CanonicalCode.NOT_FOUND

    def __init__(self, submission_id: str) -> None:
        super().__init__(
            f"no submission {submission_id!r}; check the id returned by SubmitMessages, or for a "
            "schedule's fire its last_submission_id (GetSchedule)"
        )
        self.submission_id = submission_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"submission_id": self.submission_id})


class ServerStopping(DomainError):
    """Shutdown stopped a turn that runs without its caller (a submission, disconnect policy
    CONTINUE, a recovery) after the grace period: it is left running in the store and the next
    start recovers it (docs/semantics.md §5, shutdown)."""

    error_reason = reasons.ERROR_REASON_SHUTTING_DOWN
    status_code = CanonicalCode.UNAVAILABLE
    retryable = True
    retry_delay_seconds = 1.0

    def __init__(self) -> None:
        super().__init__(
            "the server stopped before the turn finished; it is recovered when the server starts "
            "again (ResumeTurn then shows the rest)"
        )


class CancelledByShutdown(DomainError):
    """Shutdown cancelled a turn whose caller waits for it, after the shutdown grace ran out or a
    second signal cut it short: it ends ABORTED with its partial reply stored, as a cancel would,
    and its TurnEnd says why (reason ``SHUTTING_DOWN``; docs/semantics.md §5, shutdown)."""

    error_reason = reasons.ERROR_REASON_SHUTTING_DOWN
    status_code = CanonicalCode.ABORTED

    def __init__(self, why: str) -> None:
        super().__init__(
            f"the sidecar shut down before the turn finished ({why}); its partial reply is stored"
        )


class Cancelled(DomainError):
    """A plain cancel stopped the turn after its input was stored: it ends ABORTED with its partial
    reply stored, and its TurnEnd and stored turn say who asked (``cause``, ErrorInfo metadata
    ``cancel_cause``: :data:`~turnwire_server.engine.turn_base.CancelCause`)."""

    error_reason = reasons.ERROR_REASON_CANCELLED
    status_code = CanonicalCode.CANCELLED

    def __init__(self, cause: str, who: str) -> None:
        super().__init__(f"the turn was cancelled: {who}; its partial reply is stored")
        self.cause = cause

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"cancel_cause": self.cause})


class SubmissionExpired(DomainError):
    """A submission waited pending longer than ``durability.pending_expiry_seconds``."""

    error_reason = reasons.ERROR_REASON_EXPIRED
    status_code = CanonicalCode.DEADLINE_EXCEEDED

    def __init__(self, seconds: float) -> None:
        super().__init__(
            f"the submission waited more than {seconds:g} s (durability.pending_expiry_seconds) "
            "without running; its messages were not stored: submit them again"
        )
        self.seconds = seconds


class TurnInProgress(AdmissionRefused):
    """New input asked for ``reject`` (``CONCURRENT_INPUT_STRATEGY_REJECT``) on a conversation with a
    turn running or queued: ``running_request_id`` (docs/semantics.md §5, new input while a turn
    runs). Nothing was stored."""

    error_reason = reasons.ERROR_REASON_TURN_IN_PROGRESS

    def __init__(self, conversation_id: str, running_request_id: str) -> None:
        super().__init__(
            f"conversation {conversation_id!r} has a turn running or queued ({running_request_id!r}) "
            "and this request asked to be rejected then (concurrent_input_strategy REJECT); "
            "retry after that turn ends, or send it with ENQUEUE, INTERRUPT or ROLLBACK"
        )
        self.conversation_id = conversation_id
        self.running_request_id = running_request_id

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"running_request_id": self.running_request_id})


class StoppedByInput(DomainError):
    """New input stopped this turn (docs/semantics.md §5, new input while a turn runs):
    ``interrupting_request_id`` asked for ``interrupt`` (the partial reply is stored) or
    ``rollback`` (everything the turn stored is removed; its input must be resent): reason
    ``INTERRUPTED`` or ``ROLLED_BACK``."""

    error_reason = reasons.ERROR_REASON_INTERRUPTED
    status_code = CanonicalCode.ABORTED

    def __init__(self, interrupting_request_id: str, *, rollback: bool) -> None:
        if rollback:
            what = (
                "rolled back: its input and partial reply were removed from the conversation; "
                "resend the input to run it"
            )
        else:
            what = "interrupted: its partial reply is stored"
        super().__init__(
            f"the turn was stopped by new input (request {interrupting_request_id!r}) and {what}"
        )
        self.interrupting_request_id = interrupting_request_id
        self.rollback = rollback
        if rollback:
            self.error_reason = reasons.ERROR_REASON_ROLLED_BACK

    def details(self) -> ErrorDetails:
        return ErrorDetails(metadata={"interrupting_request_id": self.interrupting_request_id})


class BudgetExhausted(DomainError):
    """A budget (docs/cost.md, "Budgets") has no room for the next model step: ``budget`` names
    it (``turn``, ``conversation``, ``tenant/day``, ``tenant/month``), ``why`` says what ran out;
    ``resets_in_seconds`` is when a period's budget resets (None: never); the message says when,
    unless ``say_reset`` is False (a refusal that is not about what was spent, such as an unpriced
    model under a dollar budget). A turn that meets it ends ``error`` with this reason, its partial
    reply stored."""

    error_reason = reasons.ERROR_REASON_BUDGET_EXHAUSTED
    status_code = CanonicalCode.RESOURCE_EXHAUSTED
    room_for = "another model step"
    """What the budget has no room for, in the message."""

    def __init__(
        self, budget: str, why: str, resets_in_seconds: float | None = None, *, say_reset: bool = True
    ) -> None:
        when = _when_it_resets(budget, resets_in_seconds) if say_reset else ""
        super().__init__(f"the {budget} budget has no room for {self.room_for}: {why}{when}")
        self.budget = budget
        self.why = why
        self.resets_in_seconds = resets_in_seconds
        self.retryable = resets_in_seconds is not None

    def details(self) -> ErrorDetails:
        return ErrorDetails(
            metadata={"budget": self.budget},
            quota_violations=((self.budget, self.why),),
            retry_after_seconds=self.resets_in_seconds,
        )


def _when_it_resets(budget: str, seconds: float | None) -> str:
    """The message's end saying when ``budget`` resets: ``; it resets in 14 h 51 min (00:00 UTC)``
    for a period's (``seconds`` until then; a day's ends at 00:00 UTC, a month's at 00:00 UTC on
    the 1st: docs/cost.md), ``; a conversation's budget never resets`` for a conversation's, ""
    for a turn's or a step's. Spelt for a person reading it: RetryInfo carries the seconds."""
    if seconds is None:
        return "; a conversation's budget never resets" if budget == "conversation" else ""
    whole = max(0, round(seconds))
    days, rest = divmod(whole, 86_400)
    hours, rest = divmod(rest, 3_600)
    minutes, secs = divmod(rest, 60)
    if days:
        span = f"{days} d {hours} h"
    elif hours:
        span = f"{hours} h {minutes} min"
    else:
        parts = [f"{minutes} min"] if minutes else []
        if secs or not minutes:
            parts.append(f"{secs} s")
        span = " ".join(parts)
    at = "00:00 UTC on the 1st" if budget.endswith("/month") else "00:00 UTC"
    return f"; it resets in {span} ({at})"


class BudgetRefused(BudgetExhausted, AdmissionRefused):
    """A new turn was refused, nothing stored: a budget it would run under is exhausted
    (:class:`BudgetExhausted`'s fields; its message says "no room for a new turn")."""

    room_for = "a new turn"
