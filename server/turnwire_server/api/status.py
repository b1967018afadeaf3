"""Domain errors to gRPC statuses with ``google.rpc`` details (AIP-193): the one place that maps them.

Every error Turnwire returns carries a ``google.rpc.ErrorInfo`` with domain
``turnwire.dev`` and an UPPER_SNAKE reason from ``turnwire.v1.ErrorReason``;
field problems add ``google.rpc.BadRequest``; errors worth retrying later add
``google.rpc.RetryInfo``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from turnwire.error_classes import OVER_LIMIT, classify_error, never_retryable
from turnwire.hooks import ChatError, ErrorStage
from turnwire.providers import ProviderError
from turnwire_server.engine.errors import (
    CancelledByShutdown,
    ConversationDeleted,
    InputNotStored,
    ModelTimeout,
    NestedTurn,
    NothingToContinue,
    QueueFull,
    RequestIdInUse,
    ServerRestarted,
    ServerStopping,
    ShuttingDown,
    SlowConsumer,
    StoppedByInput,
    StreamStalled,
    SubmissionExpired,
    SubmissionNotFound,
    TurnInProgress,
    TurnNotFound,
    TurnNotHere,
)
from turnwire_server.hooks.chain import HookError
from turnwire_server.providers.registry import UnknownModel
from turnwire_server.store.errors import (
    ConversationNotFound,
    MessageAlreadyAnswered,
    MessageBeingWritten,
    MessageIdConflict,
    StoreCorrupted,
    StoreError,
    SubmissionConflict,
    SubmissionNotPending,
    ToolCallExpired,
    ToolCallNotFound,
    ToolCallNotPending,
    ToolCallsSpanMessages,
    TooManySubmissions,
    TurnAlreadyExists,
)

DOMAIN = "turnwire.dev"


class TurnwireStatusError(Exception):
    """An error that maps to one gRPC status with details.

    ``code`` is a :class:`grpc.StatusCode`; ``reason`` an ``ErrorReason`` name
    without its prefix (``CONVERSATION_NOT_FOUND``); ``field_violations`` pairs
    of (field path, what to fix); ``retry_after_seconds`` the ``RetryInfo`` delay;
    ``metadata`` extra ErrorInfo metadata.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str,
        field_violations: Sequence[tuple[str, str]] = (),
        retry_after_seconds: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.field_violations = tuple(field_violations)
        self.retry_after_seconds = retry_after_seconds
        self.metadata = dict(metadata or {})

    def to_status(self) -> status_pb2.Status:
        """The ``google.rpc.Status`` of this error, details included."""
        return build_status(
            self.code,
            self.message,
            reason=self.reason,
            field_violations=self.field_violations,
            retry_after_seconds=self.retry_after_seconds,
            metadata=self.metadata,
        )


def invalid_argument(
    violations: Sequence[tuple[str, str]], reason: str = "INVALID_FIELD"
) -> TurnwireStatusError:
    """INVALID_ARGUMENT whose message lists each (field, what to fix) pair."""
    message = "; ".join(f"{field}: {description}" for field, description in violations)
    return TurnwireStatusError(
        grpc.StatusCode.INVALID_ARGUMENT, message, reason=reason, field_violations=violations
    )


def build_status(
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str,
    field_violations: Sequence[tuple[str, str]] = (),
    retry_after_seconds: float | None = None,
    metadata: Mapping[str, str] | None = None,
) -> status_pb2.Status:
    """A ``google.rpc.Status`` with ErrorInfo (always), BadRequest and RetryInfo (when given)."""
    details: list[any_pb2.Any] = []
    info = error_details_pb2.ErrorInfo(reason=reason, domain=DOMAIN, metadata=dict(metadata or {}))
    packed = any_pb2.Any()
    packed.Pack(info)
    details.append(packed)
    if field_violations:
        bad_request = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(field=f, description=d)
                for f, d in field_violations
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(bad_request)
        details.append(packed)
    if retry_after_seconds is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(retry_after_seconds * 1000))
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(packed)
    return status_pb2.Status(code=code.value[0], message=message, details=details)


def _provider_status(error: ProviderError) -> TurnwireStatusError:
    # One provider error, one status, whatever the shape of its body (docs/semantics.md §11): the
    # code follows the error's class (turnwire.error_classes, the same function the adapters'
    # "retryable" and classify_chat_error read: HTTP status, error type and code first, message
    # text last). The caller did nothing wrong when the provider is down or rate-limited: those map
    # to retryable codes; a request the provider rejected, or one over a limit (context window,
    # output cap, payload bytes; whatever HTTP status it came with, or inside a 200 stream), maps to
    # INVALID_ARGUMENT and is never retryable.
    kind = classify_error(error)
    never = never_retryable(error)
    if kind in ("rate_limit", "quota_or_billing", "server_capacity"):
        code = grpc.StatusCode.RESOURCE_EXHAUSTED
    elif kind in OVER_LIMIT or kind in ("invalid_request_transcript", "invalid_request"):
        code = grpc.StatusCode.INVALID_ARGUMENT
    elif kind == "not_found":
        code = grpc.StatusCode.NOT_FOUND
    elif (error.retryable and not never) or kind in ("overloaded", "server_error", "transient"):
        code = grpc.StatusCode.UNAVAILABLE
    else:
        code = grpc.StatusCode.INTERNAL
    metadata = {"provider": error.provider, "http_status": str(error.status), "provider_error_class": kind}
    if error.type:
        metadata["provider_error_type"] = error.type
    if error.code:
        metadata["provider_error_code"] = error.code
    # RetryInfo only when the same request may succeed later; a rate limit always may, unless it is
    # a request above the whole limit.
    retry_after_seconds = None
    if not never and (error.retryable or kind == "rate_limit"):
        retry_after_seconds = 1.0 if error.retry_after_seconds is None else error.retry_after_seconds
    return TurnwireStatusError(
        code,
        f"model provider error: {error.message}",
        reason="PROVIDER_ERROR",
        retry_after_seconds=retry_after_seconds,
        metadata=metadata,
    )


def _tool_call_status(
    error: ToolCallNotFound | ToolCallNotPending | ToolCallExpired | ToolCallsSpanMessages,
) -> TurnwireStatusError:
    """A refused tool result or approval (docs/semantics.md §6, §12): nothing was stored."""
    metadata = {"tool_call_id": error.tool_call_id}
    if isinstance(error, ToolCallNotFound):
        return TurnwireStatusError(
            grpc.StatusCode.NOT_FOUND, str(error), reason="TOOL_CALL_NOT_FOUND", metadata=metadata
        )
    if isinstance(error, ToolCallNotPending):
        return TurnwireStatusError(
            grpc.StatusCode.FAILED_PRECONDITION, str(error), reason="TOOL_CALL_NOT_PENDING", metadata=metadata
        )
    if isinstance(error, ToolCallExpired):
        return TurnwireStatusError(
            grpc.StatusCode.FAILED_PRECONDITION, str(error), reason="EXPIRED", metadata=metadata
        )
    return TurnwireStatusError(
        grpc.StatusCode.INVALID_ARGUMENT,
        str(error),
        reason="INVALID_FIELD",
        field_violations=[("tool_call_id", "answer the calls of one assistant message per request")],
        metadata=metadata,
    )


def status_error_of(error: BaseException, stage: ErrorStage = "turn") -> TurnwireStatusError:
    """The status a client sees for ``error`` raised at ``stage``: the code, message and details.

    Admission refusals, store, provider, hook and timeout errors each map to
    their code and ``ErrorReason``; a :class:`~turnwire.hooks.ChatError`
    returned by ``on_chat_error`` keeps its own; anything else is INTERNAL.
    """
    if isinstance(error, TurnwireStatusError):
        return error
    if isinstance(error, ChatError):
        code = getattr(grpc.StatusCode, error.code, grpc.StatusCode.UNKNOWN)
        return TurnwireStatusError(
            code,
            error.message,
            reason=error.reason,
            retry_after_seconds=error.retry_after_seconds,
            metadata=error.metadata,
        )
    if isinstance(error, ShuttingDown):
        return TurnwireStatusError(
            grpc.StatusCode.UNAVAILABLE, str(error), reason="SHUTTING_DOWN", retry_after_seconds=1.0
        )
    if isinstance(error, RequestIdInUse):
        return TurnwireStatusError(
            grpc.StatusCode.ALREADY_EXISTS,
            str(error),
            reason="INVALID_FIELD",
            field_violations=[("request_id", "already used by a running turn")],
        )
    if isinstance(error, NestedTurn):
        return TurnwireStatusError(
            grpc.StatusCode.FAILED_PRECONDITION,
            str(error),
            reason="NESTED_TURN",
            metadata={"parent_request_id": error.parent_request_id},
        )
    if isinstance(error, TurnInProgress):
        return TurnwireStatusError(
            grpc.StatusCode.FAILED_PRECONDITION,
            str(error),
            reason="TURN_IN_PROGRESS",
            metadata={"running_request_id": error.running_request_id},
        )
    if isinstance(error, QueueFull):
        return TurnwireStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            str(error),
            reason="OVERLOADED",
            retry_after_seconds=1.0,
            metadata={"limit": str(error.limit)},
        )
    if isinstance(error, TooManySubmissions):
        return TurnwireStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            str(error),
            reason="OVERLOADED",
            retry_after_seconds=5.0,
            metadata={"limit": str(error.limit)},
        )
    return _status_of(error, stage)


def status_of(error: BaseException, stage: ErrorStage) -> status_pb2.Status:
    """The ``google.rpc.Status`` (with details) a client sees for ``error`` raised at ``stage``:
    in a ``TurnEnd`` event, or as the call's status before a turn starts."""
    return status_error_of(error, stage).to_status()


def _status_of(error: BaseException, stage: ErrorStage) -> TurnwireStatusError:
    if isinstance(error, InputNotStored):
        return TurnwireStatusError(grpc.StatusCode.CANCELLED, str(error), reason="INPUT_NOT_STORED")
    if isinstance(error, StreamStalled):
        return TurnwireStatusError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"the turn was interrupted: {error}",
            reason="STREAM_STALLED",
        )
    if isinstance(error, ServerRestarted):
        return TurnwireStatusError(
            grpc.StatusCode.UNAVAILABLE,
            str(error),
            reason="RECOVERY_EXHAUSTED" if error.exhausted else "SERVER_RESTARTED",
        )
    if isinstance(error, CancelledByShutdown):
        return TurnwireStatusError(grpc.StatusCode.ABORTED, str(error), reason="SHUTTING_DOWN")
    if isinstance(error, ServerStopping):
        return TurnwireStatusError(
            grpc.StatusCode.UNAVAILABLE, str(error), reason="SHUTTING_DOWN", retry_after_seconds=1.0
        )
    if isinstance(error, TurnNotFound):
        return TurnwireStatusError(
            grpc.StatusCode.NOT_FOUND,
            str(error),
            reason="TURN_NOT_FOUND",
            metadata={"request_id": error.request_id, "expired": str(error.expired).lower()},
        )
    if isinstance(error, TurnNotHere):
        return TurnwireStatusError(
            grpc.StatusCode.UNAVAILABLE, str(error), reason="SERVER_RESTARTED", retry_after_seconds=1.0
        )
    if isinstance(error, SubmissionExpired):
        return TurnwireStatusError(grpc.StatusCode.DEADLINE_EXCEEDED, str(error), reason="EXPIRED")
    if isinstance(error, SubmissionNotFound):
        return TurnwireStatusError(
            grpc.StatusCode.NOT_FOUND,
            str(error),
            reason="SUBMISSION_NOT_FOUND",
            metadata={"submission_id": error.submission_id},
        )
    if isinstance(error, SubmissionConflict):
        return TurnwireStatusError(
            grpc.StatusCode.ALREADY_EXISTS,
            str(error),
            reason="SUBMISSION_CONFLICT",
            metadata={"submission_id": error.submission_id},
        )
    if isinstance(error, SubmissionNotPending):
        return TurnwireStatusError(
            grpc.StatusCode.ABORTED if error.state == "aborted" else grpc.StatusCode.FAILED_PRECONDITION,
            str(error),
            reason="INPUT_NOT_STORED",
            metadata={"submission_id": error.submission_id, "state": error.state},
        )
    if isinstance(error, SlowConsumer):
        return TurnwireStatusError(grpc.StatusCode.RESOURCE_EXHAUSTED, str(error), reason="SLOW_CONSUMER")
    if isinstance(error, StoppedByInput):
        return TurnwireStatusError(
            grpc.StatusCode.ABORTED,
            str(error),
            reason="ROLLED_BACK" if error.rollback else "INTERRUPTED",
            metadata={"interrupting_request_id": error.interrupting_request_id},
        )
    if isinstance(error, ConversationDeleted):
        return TurnwireStatusError(
            grpc.StatusCode.ABORTED,
            str(error),
            reason="CONVERSATION_DELETED",
            metadata={"conversation_id": error.conversation_id},
        )
    if isinstance(error, ConversationNotFound):
        return TurnwireStatusError(
            grpc.StatusCode.NOT_FOUND,
            str(error),
            reason="CONVERSATION_NOT_FOUND",
            metadata={"conversation_id": error.conversation_id},
        )
    if isinstance(error, MessageBeingWritten):
        return TurnwireStatusError(
            grpc.StatusCode.FAILED_PRECONDITION,
            str(error),
            reason="INVALID_FIELD",
            metadata={"message_id": error.message_id, "request_id": error.request_id},
        )
    if isinstance(error, NothingToContinue):
        return TurnwireStatusError(
            grpc.StatusCode.FAILED_PRECONDITION,
            str(error),
            reason="NOTHING_TO_CONTINUE",
            metadata={"last_role": error.last_role},
        )
    if isinstance(error, ModelTimeout):
        return TurnwireStatusError(
            grpc.StatusCode.DEADLINE_EXCEEDED, str(error), reason="MODEL_TIMEOUT", retry_after_seconds=1.0
        )
    if isinstance(error, ProviderError):
        return _provider_status(error)
    if isinstance(error, UnknownModel):
        return TurnwireStatusError(
            grpc.StatusCode.INVALID_ARGUMENT,
            str(error),
            reason="UNKNOWN_MODEL",
            field_violations=[("model", str(error))],
        )
    if isinstance(error, HookError):
        # The client sees the hook's own error message, then the middleware and hook that raised
        # it; both are in the metadata too.
        return TurnwireStatusError(
            grpc.StatusCode.INTERNAL,
            error.client_message,
            reason="HOOK_FAILED",
            metadata={"middleware": error.middleware, "hook": error.hook, "stage": stage},
        )
    if isinstance(error, MessageAlreadyAnswered):
        return TurnwireStatusError(
            grpc.StatusCode.FAILED_PRECONDITION,
            str(error),
            reason="ALREADY_ANSWERED",
            metadata={"message_id": error.message_id},
        )
    if isinstance(error, MessageIdConflict):
        return TurnwireStatusError(
            grpc.StatusCode.ALREADY_EXISTS,
            str(error),
            reason="INVALID_FIELD",
            field_violations=[
                ("message.id", "choose an id not used in this conversation, or leave it empty")
            ],
        )
    if isinstance(error, TurnAlreadyExists):
        return TurnwireStatusError(
            grpc.StatusCode.ALREADY_EXISTS,
            str(error),
            reason="INVALID_FIELD",
            field_violations=[("request_id", "already used by an earlier turn; use a new request_id")],
        )
    if isinstance(error, ToolCallNotFound | ToolCallNotPending | ToolCallExpired | ToolCallsSpanMessages):
        return _tool_call_status(error)
    if isinstance(error, StoreCorrupted):
        return TurnwireStatusError(
            grpc.StatusCode.INTERNAL, f"stored data cannot be read: {error}", reason="DATA_CORRUPTED"
        )
    if isinstance(error, StoreError):
        return TurnwireStatusError(
            grpc.StatusCode.UNAVAILABLE,
            f"store unavailable: {error}",
            reason="STORE_UNAVAILABLE",
            retry_after_seconds=1.0,
        )
    return TurnwireStatusError(
        grpc.StatusCode.INTERNAL,
        f"internal error at stage {stage}: {type(error).__name__}: {error}",
        reason="INTERNAL",
        metadata={"stage": stage},
    )
