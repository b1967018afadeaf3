"""One error model: every error Turnwire may report carries what the client is told about it.

:class:`DomainError` is the base of the engine's, the store's, the providers', the tools' and the
hooks' errors. Each class says, where it is defined, its ``turnwire.v1.ErrorReason``
(:attr:`~DomainError.error_reason`), its default status (:attr:`~DomainError.status_code`, a
:class:`CanonicalCode`), whether the same request may succeed later
(:attr:`~DomainError.retryable`), the message a client may see
(:attr:`~DomainError.client_message`) and its details (:meth:`~DomainError.details`: ``ErrorInfo``
metadata, field violations, a retry delay). The API layer alone turns these into a gRPC status
with ``google.rpc`` details (``turnwire_server/api/status.py``; docs/semantics.md §10), by these
attributes: a new error class gets its status without editing the API.

This module imports neither gRPC nor ``google.rpc``, so the engine and hooks may raise these
errors and stay free of both.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from turnwire_client.v1 import error_reason_pb2

ErrorReason = error_reason_pb2.ErrorReason
"""The generated ``turnwire.v1.ErrorReason`` enum (``ErrorReason.Name(value)``,
``ErrorReason.Value(name)``)."""

ErrorReasonValue: TypeAlias = error_reason_pb2.ErrorReason.ValueType
"""One ``turnwire.v1.ErrorReason`` value (an int), e.g. ``error_reason_pb2.ERROR_REASON_EXPIRED``."""

_REASON_PREFIX = "ERROR_REASON_"


class CanonicalCode(enum.IntEnum):
    """The canonical status codes, with gRPC's names and numbers (``google.rpc.Code``), as the
    domain speaks them: the API maps each to ``grpc.StatusCode`` by name."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


@dataclass(frozen=True, slots=True)
class ErrorDetails:
    """What an error adds to its status: ``metadata`` for ``google.rpc.ErrorInfo``,
    ``field_violations`` (pairs of field path and what to fix) for ``google.rpc.BadRequest``,
    ``retry_after_seconds`` for ``google.rpc.RetryInfo`` (``None``: no RetryInfo), and
    ``quota_violations`` (pairs of the quota's subject and what is exceeded) for
    ``google.rpc.QuotaFailure``."""

    metadata: Mapping[str, str] = field(default_factory=dict)
    field_violations: tuple[tuple[str, str], ...] = ()
    retry_after_seconds: float | None = None
    quota_violations: tuple[tuple[str, str], ...] = ()


class DomainError(Exception):
    """The base of every error Turnwire may report to a client.

    Subclasses set the class attributes (an instance may override them when its own fields
    decide, as :class:`~turnwire_server.engine.errors.StoppedByInput` does):

    - ``error_reason``: the ``turnwire.v1.ErrorReason``; ``ERROR_REASON_UNSPECIFIED`` (the
      default) says the error has no reason of its own, and the client then sees an ``INTERNAL``
      error naming its type and the stage it happened at;
    - ``status_code``: the default status (:class:`CanonicalCode`);
    - ``retryable``: whether the same request may succeed later;

    and override :attr:`client_message` (default: ``str(self)``) and :meth:`details` (default:
    none) when they add to them.
    """

    error_reason: ErrorReasonValue = error_reason_pb2.ERROR_REASON_UNSPECIFIED
    status_code: CanonicalCode = CanonicalCode.INTERNAL
    retryable: bool = False
    retry_delay_seconds: float | None = None

    @property
    def reason_name(self) -> str:
        """The ``ErrorInfo.reason``: the ``ErrorReason`` name without its prefix
        (``CONVERSATION_NOT_FOUND``); ``""`` for ``ERROR_REASON_UNSPECIFIED``."""
        if self.error_reason == error_reason_pb2.ERROR_REASON_UNSPECIFIED:
            return ""
        return ErrorReason.Name(self.error_reason).removeprefix(_REASON_PREFIX)

    @property
    def client_message(self) -> str:
        """The message a client may see (the status message, ``TurnEnd.error``)."""
        return str(self)

    def details(self) -> ErrorDetails:
        """The ``google.rpc`` details of this error (metadata, field violations, retry delay);
        by default only the retry delay."""
        return ErrorDetails(retry_after_seconds=self.retry_delay_seconds)


class ErrorWithStatus(DomainError):
    """A domain error whose status, reason and details are given when it is made, not by its class
    (a hook's :class:`~turnwire.hooks.ChatError`, the API layer's own status errors).

    ``reason`` is an ``ErrorReason`` name without its prefix, sent as given (even a name the enum
    lacks); ``field_violations`` pairs of (field path, what to fix); ``retry_after_seconds`` the
    ``RetryInfo`` delay (``None``: not retryable); ``metadata`` the ``ErrorInfo`` metadata. The
    client sees ``message``.
    """

    error_reason = error_reason_pb2.ERROR_REASON_INTERNAL

    def __init__(
        self,
        message: str,
        *,
        status_code: CanonicalCode,
        reason: str,
        field_violations: Sequence[tuple[str, str]] = (),
        retry_after_seconds: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.field_violations = tuple(field_violations)
        self.retry_after_seconds = retry_after_seconds
        self.metadata = dict(metadata or {})
        self.error_reason = reason_value(reason)
        self.status_code = status_code
        self.retryable = retry_after_seconds is not None
        self.retry_delay_seconds = retry_after_seconds

    @property
    def reason_name(self) -> str:
        return self.reason

    @property
    def client_message(self) -> str:
        return self.message

    def details(self) -> ErrorDetails:
        return ErrorDetails(
            metadata=self.metadata,
            field_violations=self.field_violations,
            retry_after_seconds=self.retry_after_seconds,
        )


def reason_value(name: str) -> ErrorReasonValue:
    """The ``ErrorReason`` of an ``ErrorInfo.reason`` name (``EXPIRED``);
    ``ERROR_REASON_UNSPECIFIED`` for a name the enum does not have."""
    try:
        return ErrorReason.Value(_REASON_PREFIX + name)
    except ValueError:
        return error_reason_pb2.ERROR_REASON_UNSPECIFIED


# --- a tool call's error when the sidecar, not the tool, ended it -----------------------------
# Stored as the call's ``error_text``; the engine writes them, the provider adapters send them to
# the model, and the console tells them apart from a tool's own failure: one definition for all.

ABORTED_TOOL_ERROR = "The tool call was aborted before it finished."
"""The result of a tool call cut off by a cancel, a stall or a failed turn (docs/semantics.md §5)."""

INTERRUPTED_TOOL_ERROR = "The tool call was interrupted before a result was recorded."
"""The result given to a tool call found without one (docs/semantics.md §8)."""

INTERRUPTED_RUNNING_TOOL_ERROR = (
    "The tool call was interrupted while it ran, before a result was recorded: its effect may or "
    "may not have happened, and it was not run again."
)
"""The result of a call that was started (``ToolCallPart.started``) and has no result when its
process died, and whose tool is not idempotent, so it is not run again: the model reads that its
effect is unknown (docs/semantics.md §8, "Tool effects"). Marked ``ToolCallPart.interrupted``."""
