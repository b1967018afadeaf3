"""The server's interceptors (``api/rpc_observer.py``, ``api/admission.py``) wrap a method's
handler once, not per call (issue 33: a call's cost before its handler runs), and the one
wrapper still observes and admits each call on its own."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.api import metrics
from turnwire_server.api.admission import CallGate
from turnwire_server.api.rpc_observer import RpcObserver

METHOD = "/turnwire.v1.ChatService/GetConversation"


class _Details:
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata: tuple[tuple[str, str], ...] = ()


def _handler() -> Any:
    async def answer(request: Any, context: Any) -> Any:
        return chat_service_pb2.GetConversationResponse()

    return grpc.unary_unary_rpc_method_handler(
        answer,
        request_deserializer=chat_service_pb2.GetConversationRequest.FromString,
        response_serializer=chat_service_pb2.GetConversationResponse.SerializeToString,
    )


async def test_each_interceptor_wraps_a_handler_once_and_a_new_handler_again() -> None:
    first, second = _handler(), _handler()
    for interceptor in (RpcObserver(), CallGate(4)):
        handing: list[Any] = [first]

        async def continuation(details: Any, handing: list[Any] = handing) -> Any:
            return handing[0]

        wrapped = await interceptor.intercept_service(continuation, _Details(METHOD))
        assert wrapped is not first
        assert await interceptor.intercept_service(continuation, _Details(METHOD)) is wrapped
        handing[0] = second  # another handler for the method (a server that replaced it)
        rewrapped = await interceptor.intercept_service(continuation, _Details(METHOD))
        assert rewrapped is not wrapped and rewrapped is not second
        handing[0] = None  # an unknown method passes through
        assert await interceptor.intercept_service(continuation, _Details("/x.Y/Z")) is None


@contextlib.asynccontextmanager
async def _serving(gate: CallGate) -> AsyncIterator[str]:
    server = grpc.aio.server(interceptors=[RpcObserver(), gate])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("turnwire.v1.ChatService", {"GetConversation": _handler()}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_calls_through_the_kept_wrappers_are_each_counted_and_admitted() -> None:
    gate = CallGate(4)
    started = metrics.STARTED.labels("unary", "turnwire.v1.ChatService", "GetConversation")
    handled = metrics.HANDLED.labels("unary", "turnwire.v1.ChatService", "GetConversation", "OK")
    before = (started._value.get(), handled._value.get())
    async with _serving(gate) as address:
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(
                METHOD,
                request_serializer=chat_service_pb2.GetConversationRequest.SerializeToString,
                response_deserializer=chat_service_pb2.GetConversationResponse.FromString,
            )
            for _ in range(3):
                await call(chat_service_pb2.GetConversationRequest(conversation_id="c"))
        assert gate.open_calls == 0 and gate.tracked_calls == 0  # every call's slot released
    assert (started._value.get(), handled._value.get()) == (before[0] + 3, before[1] + 3)
