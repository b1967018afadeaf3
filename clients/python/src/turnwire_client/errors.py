"""Errors of the Turnwire client: gRPC failures and turns that ended in error.

Both carry the ``google.rpc`` details Turnwire sends (``ErrorInfo`` with domain
``turnwire.dev``, ``BadRequest`` field violations), unpacked into attributes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from turnwire_client.tls import TlsOptions
from turnwire_client.tls_mismatch import TlsMismatch, find_tls_mismatch

__all__ = ["ERROR_DOMAIN", "ProtocolError", "TlsMismatchError", "TurnwireError", "explain_unreachable"]

ERROR_DOMAIN = "turnwire.dev"
"""The ``google.rpc.ErrorInfo.domain`` of every error Turnwire sends."""

_DETAILS_KEY = "grpc-status-details-bin"


class TurnwireError(Exception):
    """A failed Turnwire call, or a turn that ended in error.

    Attributes:
        code: The gRPC status code (``grpc.StatusCode``), e.g. ``INVALID_ARGUMENT``,
            ``NOT_FOUND``, or ``UNAVAILABLE`` when the sidecar cannot be reached.
        message: The human-readable status message.
        reason: ``google.rpc.ErrorInfo.reason`` (an ``ErrorReason`` name without the
            ``ERROR_REASON_`` prefix, e.g. ``"CONVERSATION_NOT_FOUND"``), or ``""`` when the
            status carried no ErrorInfo (transport failures, deadlines, client-side errors).
        domain: ``ErrorInfo.domain`` (``"turnwire.dev"`` for Turnwire errors), or ``""``.
        error_metadata: ``ErrorInfo.metadata`` as a plain dict (empty when absent).
        field_violations: ``(field, description)`` pairs from ``google.rpc.BadRequest``.
        retry_delay: ``google.rpc.RetryInfo.retry_delay`` in seconds (e.g. an overloaded
            sidecar's or a rate limit's), or ``None`` when the server did not say retrying
            later helps.
        status: The full ``google.rpc.Status`` when the server sent one, else ``None``.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        domain: str = "",
        error_metadata: Mapping[str, str] | None = None,
        field_violations: Sequence[tuple[str, str]] = (),
        retry_delay: float | None = None,
        status: status_pb2.Status | None = None,
    ) -> None:
        """Build an error; usually done by :meth:`from_rpc_error` or :meth:`from_status`."""
        self.code = code
        self.message = message
        self.reason = reason
        self.domain = domain
        self.error_metadata: dict[str, str] = dict(error_metadata or {})
        self.field_violations: list[tuple[str, str]] = list(field_violations)
        self.retry_delay = retry_delay
        self.status = status
        super().__init__(str(self))

    def __str__(self) -> str:
        """``CODE [REASON]: message``, plus ``; field: description`` for each violation the
        message does not already state (it states one that it names the field of and whose
        description it holds, in whatever words around them: ``model 'x' names provider 'x',
        which is not configured`` states the violation of ``model`` with that description)."""
        head = self.code.name if isinstance(self.code, grpc.StatusCode) else str(self.code)
        if self.reason:
            head += f" [{self.reason}]"
        text = f"{head}: {self.message}" if self.message else head
        for field_path, description in self.field_violations:
            if not (description in self.message and field_path in self.message):
                text += f"; {field_path}: {description}"
        return text

    @classmethod
    def from_status(cls, status: status_pb2.Status) -> TurnwireError:
        """Build an error from a ``google.rpc.Status`` (e.g. ``TurnEnd.error``).

        Unpacks ``ErrorInfo``, ``BadRequest`` and ``RetryInfo`` from ``status.details``; other detail types
        are kept only in :attr:`status`. An unknown numeric code maps to ``UNKNOWN``.
        """
        reason = ""
        domain = ""
        metadata: dict[str, str] = {}
        violations: list[tuple[str, str]] = []
        retry_delay: float | None = None
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                reason, domain, metadata = info.reason, info.domain, dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad_request = error_details_pb2.BadRequest()
                detail.Unpack(bad_request)
                violations.extend((v.field, v.description) for v in bad_request.field_violations)
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry_info = error_details_pb2.RetryInfo()
                detail.Unpack(retry_info)
                retry_delay = retry_info.retry_delay.ToTimedelta().total_seconds()
        return cls(
            _status_code(status.code),
            status.message,
            reason=reason,
            domain=domain,
            error_metadata=metadata,
            field_violations=violations,
            retry_delay=retry_delay,
            status=status,
        )

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> TurnwireError:
        """Build an error from a failed call (``grpc.aio.AioRpcError`` or a sync ``grpc.Call``).

        The rich status comes from the ``grpc-status-details-bin`` trailing metadata (via
        ``grpc_status.rpc_status.from_call``); the call's own code and details win when the
        two disagree, and a call without details yields an error with empty ``reason``.
        """
        code: grpc.StatusCode = error.code()
        message: str = error.details() or ""
        rich: status_pb2.Status | None
        try:
            rich = rpc_status.from_call(error)
        except ValueError:
            # Code or message of the rich status disagree with the call's; keep its details.
            rich = _details_from_metadata(error.trailing_metadata())
        if rich is None:
            return cls(code, message)
        parsed = cls.from_status(rich)
        parsed.code = code
        parsed.message = message
        parsed.args = (str(parsed),)
        return parsed


class TlsMismatchError(TurnwireError):
    """A call that could not reach the sidecar because the connection's TLS does not match the
    sidecar's: it wants TLS, or a client certificate, or serves plaintext
    (:class:`~turnwire_client.tls_mismatch.TlsMismatch`). Its code is ``UNAVAILABLE``; its
    message says what the sidecar wants and the client argument that gives it, then gRPC's own
    words in parentheses.

    Attributes:
        mismatch: What the sidecar wants.
        target: The sidecar's address.
        transport_message: gRPC's message (``"Socket closed"``, a TLS error).
    """

    def __init__(self, mismatch: TlsMismatch, target: str, transport_message: str) -> None:
        """Build the error of ``mismatch`` for the sidecar at ``target``."""
        self.mismatch = mismatch
        self.target = target
        self.transport_message = transport_message
        explanation = mismatch.explain(target)
        super().__init__(
            grpc.StatusCode.UNAVAILABLE,
            f"{explanation} ({transport_message})" if transport_message else explanation,
        )


def explain_unreachable(error: TurnwireError, target: str, tls: TlsOptions | None) -> TurnwireError:
    """``error``, or a :class:`TlsMismatchError` when it is a call that failed ``UNAVAILABLE``
    without an answer of the sidecar at ``target`` (connected with ``tls``; None: plaintext) and
    a TLS handshake of its own finds the mismatch
    (:func:`~turnwire_client.tls_mismatch.find_tls_mismatch`: blocks up to about 3 s, only in
    that case). Never raises."""
    if error.code != grpc.StatusCode.UNAVAILABLE or error.reason or isinstance(error, TlsMismatchError):
        return error
    mismatch = find_tls_mismatch(target, tls, error.message)
    return error if mismatch is None else TlsMismatchError(mismatch, target, error.message)


class ProtocolError(TurnwireError):
    """A turn's event stream broke the contract.

    Raised by :func:`collect` when sequence numbers are not ``1, 2, 3, ...`` without gaps,
    when events of one stream name different conversations or request ids, when an event
    follows the ``TurnEnd``, or when the stream ends without a ``TurnEnd``. Its ``code`` is
    ``grpc.StatusCode.INTERNAL`` and its ``reason`` is ``""``.
    """

    def __init__(self, message: str) -> None:
        """Build a protocol error with the given description."""
        super().__init__(grpc.StatusCode.INTERNAL, message)


def _status_code(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


def _details_from_metadata(metadata: Any) -> status_pb2.Status | None:
    for key, value in metadata or ():
        if key == _DETAILS_KEY:
            return status_pb2.Status.FromString(value)
    return None
