"""gRPC status errors with ``google.rpc`` details (AIP-193).

Every error Turnwire returns carries a ``google.rpc.ErrorInfo`` with domain
``turnwire.dev`` and an UPPER_SNAKE reason from ``turnwire.v1.ErrorReason``;
field problems add ``google.rpc.BadRequest``; errors worth retrying later add
``google.rpc.RetryInfo``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2

DOMAIN = "turnwire.dev"


class TurnwireStatusError(Exception):
    """An error that maps to one gRPC status with details.

    ``code`` is a :class:`grpc.StatusCode`; ``reason`` an ``ErrorReason`` name
    without its prefix (``CONVERSATION_NOT_FOUND``); ``field_violations`` pairs
    of (field path, what to fix); ``retry_after`` seconds for ``RetryInfo``;
    ``metadata`` extra ErrorInfo metadata.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str,
        field_violations: Sequence[tuple[str, str]] = (),
        retry_after: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.field_violations = tuple(field_violations)
        self.retry_after = retry_after
        self.metadata = dict(metadata or {})

    def to_status(self) -> status_pb2.Status:
        """The ``google.rpc.Status`` of this error, details included."""
        return build_status(
            self.code,
            self.message,
            reason=self.reason,
            field_violations=self.field_violations,
            retry_after=self.retry_after,
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
    retry_after: float | None = None,
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
    if retry_after is not None:
        delay = duration_pb2.Duration()
        delay.FromMilliseconds(int(retry_after * 1000))
        packed = any_pb2.Any()
        packed.Pack(error_details_pb2.RetryInfo(retry_delay=delay))
        details.append(packed)
    return status_pb2.Status(code=code.value[0], message=message, details=details)


def status_code_name(status: status_pb2.Status) -> str:
    """The canonical name of ``status.code`` (``INVALID_ARGUMENT``)."""
    return code_pb2.Code.Name(status.code) if status.code in code_pb2.Code.values() else str(status.code)
