"""The engine's domain errors. The API layer (``turnwire_server.api.status``) alone maps them
to gRPC status codes and ``google.rpc`` details."""

from __future__ import annotations

from turnwire.hooks import ErrorStage


class ModelTimeout(TimeoutError):
    """A model call ran past a ``TurnConfig.timeout`` limit (a ``TimeoutError``: classified
    ``transient``, turnwire.error_classes)."""


class TurnFailure(Exception):
    """A turn failed at ``stage``; ``error`` (also ``__cause__``) is the original error."""

    def __init__(self, stage: ErrorStage, error: BaseException) -> None:
        super().__init__(str(error))
        self.stage = stage
        self.error = error
        self.__cause__ = error


class AdmissionRefused(Exception):
    """A turn was not admitted; nothing was stored. Subclasses say why."""


class ShuttingDown(AdmissionRefused):
    """The engine is draining for shutdown and takes no new turns."""

    def __init__(self) -> None:
        super().__init__("the sidecar is shutting down and takes no new turns; retry on another replica")


class RequestIdInUse(AdmissionRefused):
    """A turn with this request id is already running."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"a turn with request_id {request_id!r} is already running; use a new request_id for a new turn"
        )
        self.request_id = request_id


class NestedTurn(AdmissionRefused):
    """A blocking turn was requested from inside an active turn of the same conversation
    (it would wait for its own parent's lock forever)."""

    def __init__(self, parent_request_id: str) -> None:
        super().__init__(
            "cannot be called from inside an active turn of the same conversation: "
            "it would wait for that turn to end"
        )
        self.parent_request_id = parent_request_id


class QueueFull(AdmissionRefused):
    """The conversation already has ``limit`` turns waiting."""

    def __init__(self, conversation_id: str, limit: int) -> None:
        super().__init__(
            f"conversation {conversation_id!r} already has {limit} turns waiting; "
            "retry after the running turns finish"
        )
        self.conversation_id = conversation_id
        self.limit = limit


class InputNotStored(Exception):
    """The turn ended before its input was stored: nothing of it is kept; resend to run it.

    docs/semantics.md §5 (Decision: the start event is an acknowledgement).
    """

    def __init__(self, why: str) -> None:
        super().__init__(f"the turn did not run and its input was not stored: {why}; resend it to run it")
        self.why = why


class ConversationDeleted(Exception):
    """The turn's conversation was deleted (DeleteConversation, retention): the turn was stopped
    first, and nothing of it is kept (docs/semantics.md §12, deleting)."""

    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"conversation {conversation_id!r} was deleted; the turn was stopped")
        self.conversation_id = conversation_id


class StreamStalled(Exception):
    """The stall watchdog stopped the turn: no event for ``stream_stall_timeout_seconds``."""


class SlowConsumer(Exception):
    """The client read nothing of a full stream buffer for ``seconds``; the turn was stopped
    (``stopped``), or, with disconnect policy CONTINUE, goes on without that call."""

    def __init__(self, seconds: float, *, stopped: bool = True) -> None:
        what = "the turn was stopped and its partial reply stored" if stopped else "the call was let go"
        super().__init__(
            f"the client read no event for {seconds:g} s while the stream's buffer was full "
            f"(limits.slow_reader_timeout_seconds); {what}"
        )
        self.seconds = seconds
        self.stopped = stopped


class NothingToContinue(Exception):
    """ContinueLastTurn found no assistant message at the end of the conversation (SKIPPED).
    ``last_role``: the role of the conversation's last message ("user", "system"), "" when it has
    none. A last user message has no reply yet (a turn cancelled before any reply, say): the message
    says how to have it answered (docs/semantics.md §1)."""

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


class ServerRestarted(Exception):
    """A turn was cut short by a server restart (crash) and is not recovered: recovery is off, its
    budget is spent (``exhausted``), or it was stored before recovery data existed."""

    def __init__(self, why: str, *, exhausted: bool = False) -> None:
        super().__init__(f"the turn was interrupted by a server restart and not recovered: {why}")
        self.exhausted = exhausted


class TurnNotFound(Exception):
    """ResumeTurn / WatchSubmission found no stream for the request id (``expired``: it ended longer
    ago than the event retention)."""

    def __init__(self, message: str, *, request_id: str, expired: bool = False) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.expired = expired


class TurnNotHere(Exception):
    """The turn's stream has not ended but the turn runs nowhere in this process (interrupted by a
    crash and not recovered yet); retrying later may find it."""

    def __init__(self, request_id: str) -> None:
        super().__init__(
            f"turn {request_id!r} has not ended but is not running on this server "
            "(interrupted by a crash, recovery pending); retry ResumeTurn shortly"
        )
        self.request_id = request_id


class SubmissionNotFound(Exception):
    """No submission has this id."""

    def __init__(self, submission_id: str) -> None:
        super().__init__(f"no submission {submission_id!r}; check the id returned by SubmitMessages")
        self.submission_id = submission_id


class ServerStopping(Exception):
    """Shutdown stopped a turn that runs without its caller (a submission, disconnect policy
    CONTINUE, a recovery) after the grace period: it is left running in the store and the next
    start recovers it (docs/semantics.md §5, shutdown)."""

    def __init__(self) -> None:
        super().__init__(
            "the server stopped before the turn finished; it is recovered when the server starts "
            "again (ResumeTurn then shows the rest)"
        )


class CancelledByShutdown(Exception):
    """Shutdown cancelled a turn whose caller waits for it, after the shutdown grace ran out or a
    second signal cut it short: it ends ABORTED with its partial reply stored, as a cancel would,
    and its TurnEnd says why (reason ``SHUTTING_DOWN``; docs/semantics.md §5, shutdown)."""

    def __init__(self, why: str) -> None:
        super().__init__(
            f"the sidecar shut down before the turn finished ({why}); its partial reply is stored"
        )


class SubmissionExpired(Exception):
    """A submission waited pending longer than ``durability.pending_expiry_seconds``."""

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

    def __init__(self, conversation_id: str, running_request_id: str) -> None:
        super().__init__(
            f"conversation {conversation_id!r} has a turn running or queued ({running_request_id!r}) "
            "and this request asked to be rejected then (concurrent_input_strategy REJECT); "
            "retry after that turn ends, or send it with ENQUEUE, INTERRUPT or ROLLBACK"
        )
        self.conversation_id = conversation_id
        self.running_request_id = running_request_id


class StoppedByInput(Exception):
    """New input stopped this turn (docs/semantics.md §5, new input while a turn runs):
    ``interrupting_request_id`` asked for ``interrupt`` (the partial reply is stored) or
    ``rollback`` (everything the turn stored is removed; its input must be resent)."""

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
