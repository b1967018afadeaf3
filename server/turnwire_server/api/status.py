"""Domain errors to gRPC statuses with ``google.rpc`` details (AIP-193): the one place that maps them.

Every error Turnwire returns carries a ``google.rpc.ErrorInfo`` with domain
``turnwire.dev`` and an UPPER_SNAKE reason from ``turnwire.v1.ErrorReason``;
field problems add ``google.rpc.BadRequest``; errors worth retrying later add
``google.rpc.RetryInfo``.

A domain error (:class:`turnwire.errors.DomainError`) says its own reason, status, client message
and details; this module maps them by those attributes, so a new error class needs no edit here.
Only two need what the error alone does not know: a provider error's status follows its
classification (:mod:`turnwire.error_classes`), and a hook error names the turn's stage.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from turnwire.error_classes import OVER_LIMIT, classify_error, never_retryable
from turnwire.errors import CanonicalCode, DomainError, ErrorDetails, ErrorWithStatus
from turnwire.hooks import ErrorStage
from turnwire.providers import ProviderError
from turnwire_client.v1 import error_reason_pb2
from turnwire_server.hooks.chain import HookError

DOMAIN = "turnwire.dev"


class TurnwireStatusError(ErrorWithStatus):
    """An error that maps to one gRPC status with details, as the API layer builds it.

    ``code`` is a :class:`grpc.StatusCode`; ``reason`` an ``ErrorReason`` name
    without its prefix (``CONVERSATION_NOT_FOUND``); ``field_violations`` pairs
    of (field path, what to fix); ``retry_after_seconds`` the ``RetryInfo`` delay;
    ``metadata`` extra ErrorInfo metadata; ``quota_violations`` pairs of (subject, what is
    exceeded) for ``QuotaFailure``.
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
        quota_violations: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(
            message,
            status_code=CanonicalCode[code.name],
            reason=reason,
            field_violations=field_violations,
            retry_after_seconds=retry_after_seconds,
            metadata=metadata,
        )
        self.code = code
        self.quota_violations = tuple(quota_violations)

    def to_status(self) -> status_pb2.Status:
        """The ``google.rpc.Status`` of this error, details included."""
        return build_status(
            self.code,
            self.message,
            reason=self.reason,
            field_violations=self.field_violations,
            retry_after_seconds=self.retry_after_seconds,
            metadata=self.metadata,
            quota_violations=self.quota_violations,
        )


def invalid_argument(
    violations: Sequence[tuple[str, str]], reason: str = "INVALID_FIELD"
) -> TurnwireStatusError:
    """INVALID_ARGUMENT whose message lists each (field, what to fix) pair."""
    message = "; ".join(f"{field}: {description}" for field, description in violations)
    return TurnwireStatusError(
        grpc.StatusCode.INVALID_ARGUMENT, message, reason=reason, field_violations=violations
    )


def invalid_page_token(issued_for: str, same: str = "") -> TurnwireStatusError:
    """INVALID_ARGUMENT (reason ``INVALID_PAGE_TOKEN``) for a ``page_token`` this server did not
    issue ``issued_for`` (``"for this conversation"``, …; "" for any listing), saying to pass
    ``next_page_token`` unchanged (``same``: with what else unchanged) or leave it empty."""
    issued = f"is not a token this server issued{' ' + issued_for if issued_for else ''}"
    return invalid_argument(
        [
            (
                "page_token",
                f"{issued}; pass next_page_token unchanged{' ' + same if same else ''} or leave it empty",
            )
        ],
        reason="INVALID_PAGE_TOKEN",
    )


def build_status(
    code: grpc.StatusCode,
    message: str,
    *,
    reason: str,
    field_violations: Sequence[tuple[str, str]] = (),
    retry_after_seconds: float | None = None,
    metadata: Mapping[str, str] | None = None,
    quota_violations: Sequence[tuple[str, str]] = (),
) -> status_pb2.Status:
    """A ``google.rpc.Status`` with ErrorInfo (always), BadRequest, QuotaFailure and RetryInfo
    (when given)."""
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
    if quota_violations:
        quota = error_details_pb2.QuotaFailure(
            violations=[
                error_details_pb2.QuotaFailure.Violation(subject=subject, description=description)
                for subject, description in quota_violations
            ]
        )
        packed = any_pb2.Any()
        packed.Pack(quota)
        details.append(packed)
    if retry_after_seconds is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(retry_after_seconds * 1000))
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(packed)
    return status_pb2.Status(code=code.value[0], message=message, details=details)


def _provider_status(error: ProviderError) -> tuple[CanonicalCode, ErrorDetails]:
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
        code = CanonicalCode.RESOURCE_EXHAUSTED
    elif kind in OVER_LIMIT or kind in ("invalid_request_transcript", "invalid_request"):
        code = CanonicalCode.INVALID_ARGUMENT
    elif kind == "not_found":
        code = CanonicalCode.NOT_FOUND
    elif (error.retryable and not never) or kind in ("overloaded", "server_error", "transient"):
        code = CanonicalCode.UNAVAILABLE
    else:
        code = CanonicalCode.INTERNAL
    metadata = {"provider": error.provider, "provider_error_class": kind}
    if error.status:  # none when no HTTP answer came (a timeout, a connection refused or cut)
        metadata["http_status"] = str(error.status)
    if error.type:
        metadata["provider_error_type"] = error.type
    if error.code:
        metadata["provider_error_code"] = error.code
    # RetryInfo only when the same request may succeed later; a rate limit always may, unless it is
    # a request above the whole limit.
    retry_after_seconds = None
    if not never and (error.retryable or kind == "rate_limit"):
        retry_after_seconds = 1.0 if error.retry_after_seconds is None else error.retry_after_seconds
    return code, ErrorDetails(metadata=metadata, retry_after_seconds=retry_after_seconds)


def _names_a_reason(error: DomainError) -> bool:
    # The class, not the instance: an instance may refine its class's reason (StoppedByInput's
    # ROLLED_BACK) or carry one the enum lacks (a ChatError's), but a class without one has none.
    return type(error).error_reason != error_reason_pb2.ERROR_REASON_UNSPECIFIED


def status_error_of(error: BaseException, stage: ErrorStage = "turn") -> TurnwireStatusError:
    """The status a client sees for ``error`` raised at ``stage``: the code, message and details.

    A :class:`~turnwire.errors.DomainError` that names its reason maps by its attributes (a
    :class:`~turnwire.hooks.ChatError` returned by ``on_chat_error`` among them); anything else
    is INTERNAL, naming the error's type and the stage.
    """
    if isinstance(error, TurnwireStatusError):
        return error
    if not isinstance(error, DomainError) or not _names_a_reason(error):
        return TurnwireStatusError(
            grpc.StatusCode.INTERNAL,
            f"internal error at stage {stage}: {type(error).__name__}: {error}",
            reason="INTERNAL",
            metadata={"stage": stage},
        )
    if isinstance(error, ProviderError):
        code, details = _provider_status(error)
    else:
        code, details = error.status_code, error.details()
    metadata = dict(details.metadata)
    if isinstance(error, HookError):
        metadata["stage"] = stage
    return TurnwireStatusError(
        grpc.StatusCode[code.name],
        error.client_message,
        reason=error.reason_name,
        field_violations=details.field_violations,
        retry_after_seconds=details.retry_after_seconds,
        metadata=metadata,
        quota_violations=details.quota_violations,
    )


def status_of(error: BaseException, stage: ErrorStage) -> status_pb2.Status:
    """The ``google.rpc.Status`` (with details) a client sees for ``error`` raised at ``stage``:
    in a ``TurnEnd`` event, or as the call's status before a turn starts."""
    return status_error_of(error, stage).to_status()
