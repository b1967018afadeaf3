"""A refusal that never reads the request: what an unauthenticated caller can make the server hold.

gRPC's asyncio server reads a unary request whole (up to ``limits.max_receive_message_bytes``,
16 MiB by default) and deserializes it before it runs the method's handler, even a handler an
interceptor put there to refuse the call. A request-streaming handler instead gets an iterator
that reads nothing until it is iterated. :func:`refusing_handler` is therefore request-streaming
whatever the method's shape (on the wire every gRPC call is one HTTP/2 stream, so the client
cannot tell) and ends the call at once. What the client sends meanwhile is held by gRPC core
only up to the stream's HTTP/2 flow-control window, which
:func:`turnwire_server.app.grpc_options` keeps at its initial 64 KiB (``grpc.http2.bdp_probe``
off); the rest is never accepted. ``bench/refused_uploads.py`` measures it
(``bench/refused_uploads.md``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import grpc

Context = Any  # grpc.aio.ServicerContext; grpc is untyped


def refusing_handler(handler: Any, status: grpc.Status) -> Any:
    """A handler that ends every call of ``handler``'s method with ``status`` (a
    :class:`grpc.Status`, details included) before reading any of its request (see the module
    docstring). :func:`declared_shape` gives the refused method's own shape."""

    async def refuse(_requests: Any, context: Context) -> None:
        await context.abort_with_status(status)

    factory = (
        grpc.stream_stream_rpc_method_handler
        if handler.response_streaming
        else grpc.stream_unary_rpc_method_handler
    )
    refusal = factory(refuse, request_deserializer=None, response_serializer=handler.response_serializer)
    return _Refusal(**refusal._asdict(), declared=(handler.request_streaming, handler.response_streaming))


class _Refusal(NamedTuple):
    """A ``grpc.RpcMethodHandler`` (gRPC reads these by attribute) that remembers the shape of the
    method it refuses."""

    request_streaming: bool
    response_streaming: bool
    request_deserializer: Any
    response_serializer: Any
    unary_unary: Any
    unary_stream: Any
    stream_unary: Any
    stream_stream: Any
    declared: tuple[bool, bool]


def declared_shape(handler: Any) -> tuple[bool, bool]:
    """``(request_streaming, response_streaming)`` of the method ``handler`` serves: its own, or
    for a :func:`refusing_handler` the refused method's."""
    if isinstance(handler, _Refusal):
        return handler.declared
    return handler.request_streaming, handler.response_streaming


__all__ = ["declared_shape", "refusing_handler"]
