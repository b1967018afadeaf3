"""ChatService over the HTTP listener from Python: connectrpc's client (Connect or gRPC-Web, JSON
or binary) for any method, by name, with the generated ``google.protobuf`` messages.

The client is connect-py's own (pyqwest transport), independent of the server's door except for
the codecs, which only wrap ``google.protobuf``'s serializers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from connectrpc.client import ConnectClient
from connectrpc.errors import ConnectError
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.protocol import ProtocolType
from google.protobuf import message_factory
from google.protobuf.message import Message
from google.rpc import error_details_pb2
from pyqwest import Client as HTTPClient
from pyqwest import HTTPTransport

from turnwire_client.v1 import chat_service_pb2
from turnwire_server.http.connect_door import ProtoBinaryCodec, ProtoJsonCodec

CHAT_SERVICE = chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"]
PROTOCOLS = {"connect": ProtocolType.CONNECT, "grpc-web": ProtocolType.GRPC_WEB}


def method_info(name: str) -> MethodInfo[Any, Any]:
    """The MethodInfo of ChatService's method ``name``."""
    method = CHAT_SERVICE.methods_by_name[name]
    return MethodInfo(
        name=name,
        service_name=CHAT_SERVICE.full_name,
        input=message_factory.GetMessageClass(method.input_type),
        output=message_factory.GetMessageClass(method.output_type),
        idempotency_level=IdempotencyLevel.UNKNOWN,
        stream_type=StreamType.SERVER_STREAM if method.server_streaming else StreamType.UNARY,
    )


@dataclass
class ConnectChat:
    """Calls to ``base_url`` (``http://HOST:PORT``) over ``protocol`` (``connect`` or
    ``grpc-web``) in ``encoding`` (``json`` or ``proto``), with ``token`` as the bearer."""

    base_url: str
    protocol: str = "connect"
    encoding: str = "json"
    token: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    fresh_connection: bool = False
    """Each call on a new connection (a transport of its own) rather than the shared pool's."""

    @contextlib.asynccontextmanager
    async def _client(self) -> AsyncIterator[ConnectClient]:
        codec = ProtoJsonCodec() if self.encoding == "json" else ProtoBinaryCodec()
        transport = HTTPTransport() if self.fresh_connection else None
        http_client = HTTPClient(transport) if transport is not None else None
        try:
            async with ConnectClient(
                self.base_url,
                codec=codec,
                protocol=PROTOCOLS[self.protocol],
                send_compression=None,
                http_client=http_client,
            ) as client:
                yield client
        finally:
            if transport is not None:
                await transport.aclose()

    def _headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.token is not None:
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    async def unary(self, name: str, request: Message) -> Any:
        """The response of unary method ``name``; raises ConnectError."""
        async with self._client() as client:
            return await client.execute_unary(
                request=request, method=method_info(name), headers=self._headers()
            )

    async def stream(self, name: str, request: Message) -> AsyncIterator[Any]:
        """The responses of streaming method ``name`` as they come; raises ConnectError."""
        async with self._client() as client:
            async for response in client.execute_server_stream(
                request=request, method=method_info(name), headers=self._headers()
            ):
                yield response


def error_reason(error: ConnectError) -> str:
    """The ErrorInfo reason among ``error``'s details ("" when none)."""
    for detail in error.details:
        if detail.type_name == "google.rpc.ErrorInfo":
            return str(error_details_pb2.ErrorInfo.FromString(detail.message_bytes).reason)
    return ""


def detail_types(error: ConnectError) -> list[str]:
    """The type names of ``error``'s details, in order."""
    return [detail.type_name for detail in error.details]
