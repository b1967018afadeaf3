"""OpenAI's error shape for the OpenAI-compatible door (docs/api/openai.md#errors).

OpenAI answers a refused request with an HTTP status and the body
``{"error": {"message", "type", "param", "code"}}``; its SDKs raise a typed exception by the
status (``BadRequestError`` for 400, ``AuthenticationError`` for 401, ``NotFoundError`` for 404,
``RateLimitError`` for 429 …) and expose the body. A call the servicer refused
(:class:`~turnwire_server.http.calls.CallEnded`) is rendered so: the HTTP status and ``type``
follow its gRPC code, ``code`` is the ``google.rpc.ErrorInfo`` reason in lower case
(``conversation_not_found``), ``param`` the first ``google.rpc.BadRequest`` field, and the
message is the servicer's own (already safe for a client: no secret, store address or other
tenant's data, docs/security.md).
"""

from __future__ import annotations

from typing import Any

import grpc
import orjson
from google.rpc import error_details_pb2, status_pb2
from starlette.responses import Response

from turnwire_server.http.calls import CallEnded
from turnwire_server.http.retry_headers import TURN_RAN, retry_headers

_HTTP: dict[grpc.StatusCode, tuple[int, str]] = {
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.FAILED_PRECONDITION: (400, "invalid_request_error"),
    grpc.StatusCode.OUT_OF_RANGE: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.PERMISSION_DENIED: (403, "permission_error"),
    grpc.StatusCode.NOT_FOUND: (404, "not_found_error"),
    grpc.StatusCode.ALREADY_EXISTS: (409, "invalid_request_error"),
    grpc.StatusCode.ABORTED: (409, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.CANCELLED: (499, "invalid_request_error"),
    grpc.StatusCode.UNIMPLEMENTED: (501, "server_error"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "server_error"),
}
"""gRPC codes to (HTTP status, OpenAI error ``type``); any other code is 500 ``server_error``."""


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(
    status: int, message: str, type_: str, param: str | None = None, code: str | None = None
) -> Response:
    """An HTTP ``status`` answer with OpenAI's error body."""
    return Response(
        orjson.dumps(error_body(message, type_, param, code)),
        status_code=status,
        media_type="application/json",
    )


def bad_request(message: str, param: str | None, code: str = "invalid_value") -> Response:
    """400 ``invalid_request_error``: the request is wrong in ``param``; ``message`` says what to do."""
    return error_response(400, message, "invalid_request_error", param, code)


def _details(ended: CallEnded) -> tuple[str | None, str | None]:
    """The ErrorInfo reason and the first BadRequest field of the call's status details."""
    info = ended.error_info()
    reason = info.reason if info is not None else None
    field = None
    for detail in ended.status_details():
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR) and field is None:
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            if bad.field_violations:
                field = bad.field_violations[0].field
    return reason, field


def ended_error(ended: CallEnded, *, param_names: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI error body of a call the servicer ended with a non-OK status.
    ``param_names`` renames a Turnwire field path's first segment to the door's parameter
    (``conversation_id`` → ``conversation``)."""
    status, type_ = _HTTP.get(ended.code, (500, "server_error"))
    reason, field = _details(ended)
    if field is not None and param_names:
        head, dot, rest = field.partition(".")
        field = param_names.get(head, head) + dot + rest
    return status, error_body(ended.details, type_, field, reason.lower() if reason else None)


def ended_response(
    ended: CallEnded, *, param_names: dict[str, str] | None = None, started: bool = False
) -> Response:
    """:func:`ended_error` as an HTTP answer, with the refusal's retry headers
    (:func:`~turnwire_server.http.retry_headers.retry_headers`); ``started``: the call ended
    after its turn's first event, so the answer also says not to send it again
    (:data:`~turnwire_server.http.retry_headers.TURN_RAN`: the turn was admitted and may run on)."""
    status, body = ended_error(ended, param_names=param_names)
    headers = retry_headers(ended)
    if started:
        headers.update(TURN_RAN)
    return Response(orjson.dumps(body), status_code=status, media_type="application/json", headers=headers)


def turn_error(status: status_pb2.Status) -> dict[str, Any]:
    """The ``error`` of a failed response from a ``TurnEnd.error``: OpenAI's ``ResponseError``
    (``code``: ``rate_limit_exceeded`` for ``RESOURCE_EXHAUSTED``, else ``server_error``; the
    Turnwire reason, lower case, as ``type``)."""
    reason = None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason.lower()
    code = (
        "rate_limit_exceeded"
        if status.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        else "server_error"
    )
    return {"code": code, "message": status.message, "param": None, "type": reason}


__all__ = ["bad_request", "ended_error", "ended_response", "error_body", "error_response", "turn_error"]
