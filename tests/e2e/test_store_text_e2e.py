"""A NUL character in a client string is the caller's error on both stores, and no client-visible
message names the store's address (issue 32, item 3).

PostgreSQL's ``text`` cannot hold NUL; SQLite's can. A model id (on an entry without an
allow-list) or an idempotency key with one answered ``UNAVAILABLE STORE_UNAVAILABLE`` (retryable)
with the PostgreSQL user, host, port and database in the message, and was stored on SQLite. Both
now answer ``INVALID_ARGUMENT`` naming the field. Every other string of every RPC's request, with
a NUL in it, must not make any RPC answer ``UNAVAILABLE`` or name the store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import grpc
import pytest
from google.protobuf import message as protobuf_message
from google.protobuf import message_factory
from google.rpc import error_details_pb2, status_pb2
from support.sidecar import SidecarFactory, SidecarProcess
from support.stores import postgres_database

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2

NUL = "x\x00y"
SERVICE = chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"]
CONFIG = {
    "providers": {
        # No allow-list: any model name passes the provider and reaches the store.
        "open": {
            "type": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": None,
            "max_retries": 0,
        },
        "scripted": {"scripts": {"demo": [{"text": "hi"}]}},
    }
}
TEXT_COLUMNS = {
    "Chat": ["model"],
    "SaveMessages": ["model"],
    "ContinueLastTurn": ["model"],
    "SubmitMessages": ["model", "idempotency_key"],
}
"""The RPCs whose request is otherwise valid here, and its strings that land in a text column."""


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
        return
    request.applymarker(pytest.mark.postgres)
    with postgres_database() as url:
        yield url


def _base(method: Any) -> Any:
    """A request of ``method`` valid apart from the field under test."""
    request: Any = _new(method.input_type)
    fields = method.input_type.fields_by_name
    if "conversation_id" in fields:
        request.conversation_id = "c-nul"
    if "message" in fields:
        request.message.role = message_pb2.ROLE_USER
        request.message.parts.add().text.text = "hi"
    if "messages" in fields:
        message = request.messages.add(role=message_pb2.ROLE_USER)
        message.parts.add().text.text = "hi"
    if "model" in fields:
        request.model = "scripted:demo"
    return request


def _new(descriptor: Any) -> protobuf_message.Message:
    return message_factory.GetMessageClass(descriptor)()


async def _call(
    channel: grpc.aio.Channel, method: Any, request: protobuf_message.Message
) -> status_pb2.Status:
    """The RPC's outcome as a status: the call's, or the error of a turn its stream ended with."""
    path = f"/{SERVICE.full_name}/{method.name}"
    response_class = type(_new(method.output_type))
    serialize, deserialize = request.SerializeToString, response_class.FromString
    try:
        if method.server_streaming:
            last = None
            async for response in channel.unary_stream(path, serialize, deserialize)(request):
                last = response
            event = getattr(last, "event", None)
            if event is not None and event.HasField("turn_end") and event.turn_end.HasField("error"):
                return status_pb2.Status(code=event.turn_end.error.code, message=event.turn_end.error.message)
        else:
            await channel.unary_unary(path, serialize, deserialize)(request)
    except grpc.aio.AioRpcError as error:
        details = [
            value for key, value in error.trailing_metadata() or () if key == "grpc-status-details-bin"
        ]
        if details:
            return status_pb2.Status.FromString(details[0])
        return status_pb2.Status(code=error.code().value[0], message=error.details() or "")
    return status_pb2.Status()


def _violations(status: status_pb2.Status) -> list[str]:
    fields = []
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            fields += [violation.field for violation in bad.field_violations]
    return fields


async def test_a_nul_in_any_client_string_is_the_callers_error_on_both_stores(
    sidecar_factory: SidecarFactory, store_url: str | None
) -> None:
    sidecar: SidecarProcess = await sidecar_factory(config=CONFIG, store_url=store_url).start()
    address = urlsplit(store_url) if store_url else None
    private = (
        [f"{address.hostname}:{address.port}", address.path.strip("/"), "postgresql://"] if address else []
    )
    private.append(str(sidecar.db_path))
    outcomes: dict[str, status_pb2.Status] = {}
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        await stub.Chat(_base(SERVICE.methods_by_name["Chat"])).read()  # the conversation exists
        for method in SERVICE.methods:
            for field in method.input_type.fields:
                if field.type != field.TYPE_STRING or field.is_repeated:
                    continue
                request = _base(method)
                # A model id names a provider without an allow-list: only the NUL is wrong.
                setattr(request, field.name, f"open:{NUL}" if field.name == "model" else NUL)
                outcomes[f"{method.name}.{field.name}"] = await _call(channel, method, request)
    assert len(outcomes) >= 25, sorted(outcomes)
    unavailable = grpc.StatusCode.UNAVAILABLE.value[0]
    for where, status in outcomes.items():
        assert status.code != unavailable, (where, status.message, sidecar.log_text()[-2000:])
        for text in private:
            assert text not in status.message, (where, status.message)
    for rpc, names in TEXT_COLUMNS.items():
        for name in names:
            refused = outcomes[f"{rpc}.{name}"]
            assert refused.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], (rpc, name, refused)
            assert name in _violations(refused), (rpc, name, refused)
    assert "Traceback" not in sidecar.log_text()
