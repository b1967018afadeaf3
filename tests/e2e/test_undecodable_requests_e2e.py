"""Request bytes that do not decode are the caller's mistake: INVALID_ARGUMENT, one quiet log line.

Before: ``b"\\x00"`` to any method, invalid UTF-8 in a string field or a ``Struct`` nested 32+
deep answered ``UNKNOWN`` with a full traceback logged per request (docs/semantics.md §11).
"""

from __future__ import annotations

import grpc
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2
from grpc_status import rpc_status
from support.sidecar import SidecarFactory

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc

METHODS = [
    (m.name, m.server_streaming) for m in chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"].methods
]


def _deep_body(levels: int) -> bytes:
    body = struct_pb2.Struct()
    inner = body
    for _ in range(levels):
        inner = inner.fields["d"].struct_value
    inner.fields["x"].number_value = 1
    request = chat_service_pb2.ChatRequest(conversation_id="c1")
    request.message.parts.add().text.text = "hi"
    request.body.CopyFrom(body)
    return request.SerializeToString()


def _invalid_utf8() -> bytes:
    # ChatRequest.conversation_id (field 1, length-delimited) holding bytes that are not UTF-8.
    return b"\x0a\x02\xff\xfe"


PAYLOADS = {"zero-byte": b"\x00", "invalid-utf8": _invalid_utf8(), "deep-struct": _deep_body(60)}


async def _call(
    channel: grpc.aio.Channel, name: str, streaming: bool, payload: bytes
) -> grpc.aio.AioRpcError:
    path = f"/turnwire.v1.ChatService/{name}"
    identity = lambda data: data  # noqa: E731 - raw bytes on the wire
    try:
        if streaming:
            async for _ in channel.unary_stream(
                path, request_serializer=identity, response_deserializer=identity
            )(payload):
                pass
        else:
            await channel.unary_unary(path, request_serializer=identity, response_deserializer=identity)(
                payload
            )
    except grpc.aio.AioRpcError as error:
        return error
    raise AssertionError(f"{name} accepted undecodable bytes")


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
async def test_undecodable_bytes_are_invalid_argument_on_every_method(
    sidecar_factory: SidecarFactory, payload: str
) -> None:
    sidecar = await sidecar_factory().start()
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        for name, streaming in METHODS:
            if payload != "zero-byte" and name not in ("Chat",):
                continue  # the field-level payloads are ChatRequests
            error = await _call(channel, name, streaming, PAYLOADS[payload])
            assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, (name, error.code(), error.details())
            status = rpc_status.from_call(error)
            assert status is not None
            violations = error_details_pb2.BadRequest()
            assert any(d.Unpack(violations) for d in status.details)
            assert "is not a valid turnwire.v1." in violations.field_violations[0].description
    log = sidecar.log_text()
    assert "Traceback" not in log and "ERROR" not in log


@pytest.mark.parametrize("number", [float("nan"), float("inf"), float("-inf")])
async def test_a_non_finite_number_in_the_body_is_invalid_argument_naming_the_path(
    sidecar_factory: SidecarFactory, number: float
) -> None:
    """Before: NaN or Infinity in a request's body answered UNKNOWN (an unhandled serializer error)."""
    sidecar = await sidecar_factory().start()
    request = chat_service_pb2.ChatRequest(conversation_id="c1")
    request.message.parts.add().text.text = "hi"
    request.body.update({"stats": {"ratio": 1.0}})
    request.body.fields["stats"].struct_value.fields["ratio"].number_value = number
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in stub.Chat(request):
                pass
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        status = rpc_status.from_call(raised.value)
        assert status is not None
        violations = error_details_pb2.BadRequest()
        assert any(d.Unpack(violations) for d in status.details)
        assert violations.field_violations[0].field == "body.stats.ratio"
        conversation = chat_service_pb2.GetConversationRequest(conversation_id="c1")
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetConversation(conversation)
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND  # nothing was stored
