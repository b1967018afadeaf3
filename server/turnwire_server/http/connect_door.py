"""The Connect and gRPC-Web door: every method of the served gRPC services over HTTP.

The protocol work (Connect unary and streaming, gRPC-Web, JSON and binary codecs, compression,
``connect-timeout-ms`` / ``grpc-timeout`` deadlines, GET for side-effect-free methods, error
bodies and trailers) is connectrpc's (the ``connectrpc`` package, connect-py), an ASGI
application. Its code generator is a protoc plugin this repository's offline build cannot run,
and it would only restate the services, so the endpoints are built here from the service
descriptors of the generated ``google.protobuf`` modules (:func:`endpoints_of`): one endpoint per
method, each handing the decoded request to :class:`~turnwire_server.http.calls.InProcessCalls`,
the gRPC server's own interceptors and servicer. A new RPC in the protos is served here with no
change.

Errors: a call that ends with a gRPC status becomes a Connect error with the same code, message
and ``google.rpc`` details (ErrorInfo, BadRequest, RetryInfo …, as ``google.rpc.Status``
carries them over gRPC); an exception the servicer did not turn into a status is ``INTERNAL``
with a fixed message (its text never reaches the client, as over gRPC). A body that does not
decode is ``INVALID_ARGUMENT`` naming the message type and what is wrong
(docs/http.md#errors).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc
import orjson
from connectrpc.code import Code
from connectrpc.codec import Codec
from connectrpc.errors import ConnectError, ErrorDetail
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.request import RequestContext
from connectrpc.server import ConnectASGIApplication, Endpoint
from google.protobuf import descriptor_pb2, json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.rpc import error_details_pb2
from protobuf.wkt import Any as WireAny

from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls, metadata_of, peer_of

log = logging.getLogger("turnwire.http")


_CODES: dict[grpc.StatusCode, Code] = {
    grpc.StatusCode.CANCELLED: Code.CANCELED,
    **{status: Code[status.name] for status in grpc.StatusCode if status.name in Code.__members__},
}
"""gRPC status codes to Connect codes: the same numbers and names (Connect spells CANCELED)."""

_IDEMPOTENCY = {
    descriptor_pb2.MethodOptions.NO_SIDE_EFFECTS: IdempotencyLevel.NO_SIDE_EFFECTS,
    descriptor_pb2.MethodOptions.IDEMPOTENT: IdempotencyLevel.IDEMPOTENT,
}


def _bad_body(message_class: type[Message], codec: str, error: Exception) -> ConnectError:
    name = message_class.DESCRIPTOR.full_name
    description = f"the request body is not a {name} in {codec}: {error}"
    detail = error_details_pb2.BadRequest(
        field_violations=[error_details_pb2.BadRequest.FieldViolation(field="body", description=description)]
    )
    return ConnectError(
        Code.INVALID_ARGUMENT, description, [_wire(detail.DESCRIPTOR.full_name, detail.SerializeToString())]
    )


class ProtoBinaryCodec(Codec[Message, Message]):
    """Binary protobuf over the generated ``google.protobuf`` classes (Connect's ``proto``)."""

    def name(self) -> str:
        """``proto``."""
        return "proto"

    def encode(self, message: Message) -> bytes:
        """The wire bytes of ``message``."""
        return message.SerializeToString()

    def decode(self, data: bytes | bytearray, message_class: type[Message]) -> Message:
        """``data`` parsed; raises ConnectError ``INVALID_ARGUMENT`` saying what is wrong."""
        try:
            return message_class.FromString(bytes(data))
        except DecodeError as error:
            raise _bad_body(message_class, "binary protobuf", error) from None


class ProtoJsonCodec(Codec[Message, Message]):
    """The protobuf JSON mapping (lowerCamelCase names; either spelling read; unknown fields
    ignored, as connect-go and connect-es do), compact."""

    def name(self) -> str:
        """``json``."""
        return "json"

    def encode(self, message: Message) -> bytes:
        """``message`` as compact JSON text."""
        return orjson.dumps(json_format.MessageToDict(message))

    def decode(self, data: bytes | bytearray, message_class: type[Message]) -> Message:
        """``data`` parsed; raises ConnectError ``INVALID_ARGUMENT`` saying what is wrong."""
        message = message_class()
        try:
            json_format.Parse(bytes(data) or b"{}", message, ignore_unknown_fields=True)
        except (json_format.ParseError, UnicodeDecodeError, RecursionError) as error:
            raise _bad_body(message_class, "JSON", error) from None
        return message


def _wire(type_name: str, value: bytes) -> ErrorDetail:
    return ErrorDetail(WireAny(type_url=f"type.googleapis.com/{type_name}", value=value))


def connect_error(ended: CallEnded) -> ConnectError:
    """The Connect error of a call that ended with a gRPC status: its code, message and the
    ``google.rpc.Status`` details of its ``grpc-status-details-bin`` trailer."""
    details = [_wire(any_.type_url.rpartition("/")[2], any_.value) for any_ in ended.status_details()]
    return ConnectError(_CODES.get(ended.code, Code.UNKNOWN), ended.details, details)


_CALL_INFOS: weakref.WeakKeyDictionary[RequestContext[Any, Any], DoorCallInfo] = weakref.WeakKeyDictionary()
"""Each Connect call's :class:`DoorCallInfo`, by its request context (one per call, dropped with it)."""


def _call_info(ctx: RequestContext[Any, Any]) -> DoorCallInfo:
    """The :class:`DoorCallInfo` of the call of ``ctx``: one object for the call, so the token that
    :class:`_TokenFirst` verified is not verified again when the endpoint makes the call."""
    found = _CALL_INFOS.get(ctx)
    if found is not None:
        return found
    remaining = ctx.timeout_ms
    deadline = None if remaining is None else time.monotonic() + remaining / 1000
    address = ctx.client_address  # connectrpc's "HOST:PORT", an IPv6 host unbracketed
    host, _, port = (address or "").rpartition(":")
    peer = peer_of(host, port)
    call = DoorCallInfo(metadata_of(ctx.request_headers.allitems(), event_batches=True), peer, deadline)
    _CALL_INFOS[ctx] = call
    return call


def _method_info(service: ServiceDescriptor, method: MethodDescriptor) -> MethodInfo[Any, Any]:
    if method.client_streaming:
        kind = StreamType.BIDI_STREAM if method.server_streaming else StreamType.CLIENT_STREAM
    else:
        kind = StreamType.SERVER_STREAM if method.server_streaming else StreamType.UNARY
    level = _IDEMPOTENCY.get(method.GetOptions().idempotency_level, IdempotencyLevel.UNKNOWN)
    return MethodInfo(
        name=method.name,
        service_name=service.full_name,
        input=message_factory.GetMessageClass(method.input_type),
        output=message_factory.GetMessageClass(method.output_type),
        idempotency_level=level,
        stream_type=kind,
    )


def endpoints_of(
    services: Sequence[ServiceDescriptor], calls: InProcessCalls
) -> dict[str, Endpoint[Any, Any]]:
    """One Connect endpoint per unary or server-streaming method of ``services``, by URL path
    (``/package.Service/Method``), each calling the method through ``calls``. Client- and
    bidi-streaming methods are left out (Connect over HTTP/1.1 and gRPC-Web cannot carry them;
    ChatService has none)."""
    endpoints: dict[str, Any] = {}  # connectrpc's endpoint union is private
    for service in services:
        for method in service.methods:
            if method.client_streaming:
                continue
            path = f"/{service.full_name}/{method.name}"
            info = _method_info(service, method)
            if method.server_streaming:
                endpoints[path] = Endpoint.server_stream(info, _streaming(path, calls))
            else:
                endpoints[path] = Endpoint.unary(info, _unary(path, calls))
    return endpoints


def _unary(path: str, calls: InProcessCalls) -> Any:
    async def call(request: Message, ctx: RequestContext[Any, Any]) -> Message:
        try:
            return await calls.unary(path, request, _call_info(ctx))
        except CallEnded as ended:
            raise connect_error(ended) from None
        except ConnectError:
            raise
        except Exception:
            log.exception("%s over HTTP failed", path)
            raise ConnectError(Code.INTERNAL, "internal error") from None

    return call


def _streaming(path: str, calls: InProcessCalls) -> Any:
    async def call(request: Message, ctx: RequestContext[Any, Any]) -> AsyncIterator[Message]:
        try:
            async for response in calls.stream(path, request, _call_info(ctx)):
                yield response
        except CallEnded as ended:
            raise connect_error(ended) from None
        except ConnectError:
            raise
        except Exception:
            log.exception("%s over HTTP failed", path)
            raise ConnectError(Code.INTERNAL, "internal error") from None

    return call


class _TokenFirst:
    """A connectrpc metadata interceptor: a call its token does not admit is refused before its
    request is read (:meth:`InProcessCalls.refusal`), so a caller without a valid token costs
    no more than its headers, as over gRPC (docs/operate/authentication.md)."""

    def __init__(self, calls: InProcessCalls) -> None:
        self._calls = calls

    async def on_start(self, ctx: RequestContext[Any, Any]) -> None:
        """Refuse the call (a ConnectError) when its token does not admit it."""
        method = f"/{ctx.method.service_name}/{ctx.method.name}"
        refused = await self._calls.refusal(method, _call_info(ctx))
        if refused is not None:
            raise connect_error(refused)

    async def on_end(self, _token: None, _ctx: RequestContext[Any, Any], _error: Exception | None, /) -> None:
        """Nothing to do at the call's end."""


def _is_native_grpc(content_type: bytes) -> bool:
    kind = content_type.split(b";")[0].strip().lower()
    return kind == b"application/grpc" or kind.startswith(b"application/grpc+")


async def _refuse_native_grpc(send: Any) -> None:
    body = b"native gRPC is served on the gRPC listener (listen:), not here; use Connect or gRPC-Web\n"
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"accept-post", b"application/json, application/proto"),
    ]
    await send({"type": "http.response.start", "status": 415, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ConnectDoor(ConnectASGIApplication[None]):
    """The ASGI application serving ``endpoints`` (:func:`endpoints_of`) over Connect and
    gRPC-Web; request messages up to ``read_max_bytes`` (larger: ``RESOURCE_EXHAUSTED``), read
    only once ``calls`` found the caller's token good (:class:`_TokenFirst`)."""

    def __init__(self, endpoints: Mapping[str, Any], *, read_max_bytes: int, calls: InProcessCalls) -> None:
        super().__init__(
            service=None,
            endpoints=lambda _service: endpoints,
            read_max_bytes=read_max_bytes,
            codecs=[ProtoBinaryCodec(), ProtoJsonCodec()],
            interceptors=[_TokenFirst(calls)],
        )
        self._paths = tuple(endpoints)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Serve one ASGI call; native gRPC (``application/grpc``, which needs HTTP/2 trailers)
        is answered 415 saying where it is served, rather than failing inside connectrpc."""
        if scope["type"] == "http":
            for name, value in scope.get("headers", ()):
                if name == b"content-type" and _is_native_grpc(value):
                    await _refuse_native_grpc(send)
                    return
        await super().__call__(scope, receive, send)

    @property
    def path(self) -> str:
        """Where it is mounted: the root (each endpoint's path is its full method name)."""
        return "/"

    @property
    def paths(self) -> tuple[str, ...]:
        """The URL path of every method served."""
        return self._paths


__all__ = ["ConnectDoor", "ProtoBinaryCodec", "ProtoJsonCodec", "connect_error", "endpoints_of"]
