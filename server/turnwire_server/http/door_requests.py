"""What every HTTP door does with a request before its protocol's own work: who calls
(:func:`call_info`), its body read within the size limit once the caller's token is admitted
(:func:`read_body`), a JSON answer, a ``Struct`` of a JSON object (a turn's ``body``), and the id
an ``Idempotency-Key`` makes (:func:`keyed_id`), the methods of a door's catch-all route. Used by
the OpenAI, AG-UI and AI SDK doors."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from typing import Any

import orjson
from google.protobuf import struct_pb2
from starlette.requests import ClientDisconnect, Request
from starlette.responses import PlainTextResponse, Response

from turnwire_server.api.rpc_logging import Throttled
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls, metadata_of, peer_of
from turnwire_server.http.openai_errors import ended_response, error_response

_SERVICE = "/turnwire.v1.ChatService/"

UNSERVED_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]
"""The methods a door's catch-all route answers, for the paths and methods under its prefix it
does not serve (``HEAD`` comes with ``GET``; ``OPTIONS`` is CORS's)."""


def call_info(request: Request) -> DoorCallInfo:
    """The :class:`DoorCallInfo` of an HTTP request: its headers as metadata, its peer."""
    client = request.client
    peer = peer_of(client.host, client.port) if client else "unknown"
    return DoorCallInfo(metadata_of(request.headers.items()), peer)


log = logging.getLogger("turnwire.http")

_left_mid_body = Throttled(log, logging.INFO)
"""Callers that close the connection before their whole body: one INFO line per 10 s, the rest
at DEBUG (a caller can do it at will, so never a traceback and never a line each)."""


def _too_large(message: str) -> Response:
    return error_response(413, message, "invalid_request_error", None, "request_too_large")


async def read_body(
    request: Request,
    call: DoorCallInfo,
    limit: int,
    calls: InProcessCalls,
    *,
    method: str,
    too_large: Callable[[str], Response] = _too_large,
    refused: Callable[[CallEnded], Response] = ended_response,
) -> bytes | Response:
    """The body of ``request`` (whose :class:`DoorCallInfo` is ``call``), or once it passes
    ``limit`` bytes (read no further) the 413 answer ``too_large`` makes of a message saying so
    (OpenAI's error body unless given).

    The caller's token is checked first (:meth:`InProcessCalls.refusal`, as for a call of
    ``method``, the ChatService method the route maps to: a refusal is counted under it): a request
    it does not admit is answered what ``refused`` makes of the refusal (OpenAI's error body unless
    given) with none of its body read, so a caller without a valid token costs no more than its
    headers, as over gRPC (docs/operate/authentication.md). The token is verified there once for
    the request: make its calls with ``call``."""
    ended = await calls.refusal(_SERVICE + method, call)
    if ended is not None:
        return refused(ended)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                return too_large(
                    f"the body is larger than the sidecar takes ({limit} bytes, "
                    "limits.max_receive_message_bytes)"
                )
            chunks.append(chunk)
    except ClientDisconnect:
        # The caller left mid-body: nothing to answer, and nothing for the operator to fix.
        _left_mid_body.event(
            "%s %s: the client closed the connection after %d bytes of its body; nothing was run",
            request.method,
            request.url.path,
            size,
        )
        return PlainTextResponse("the client closed the connection before its whole body\n", status_code=400)
    return b"".join(chunks)


def json_response(value: Any) -> Response:
    """200 with ``value`` as JSON."""
    return Response(orjson.dumps(value), media_type="application/json")


def struct_of(values: dict[str, Any]) -> struct_pb2.Struct:
    """``values`` as a ``google.protobuf.Struct`` (a turn's ``body``)."""
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def keyed_id(prefix: str, key: str) -> str:
    """The id (``prefix`` then 32 hex digits) of the requests sent with ``Idempotency-Key: key``:
    the same for every retry, so they answer one response or completion
    (docs/api/openai.md#retries-and-idempotency-keys). Per tenant: store keys carry the tenant."""
    return prefix + hashlib.sha256(key.encode()).hexdigest()[:32]


__all__ = ["UNSERVED_METHODS", "call_info", "json_response", "keyed_id", "read_body", "struct_of"]
