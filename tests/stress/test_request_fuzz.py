"""Property: no request a client can send makes an RPC answer UNKNOWN or INTERNAL, and a refused
request changes nothing stored (issue: request bytes and fields that crash the server).

Hypothesis generates ChatService requests (ids of any text, messages of any role and parts,
bodies of any JSON, page tokens of any text) and raw byte payloads, against one real server.
Size: ``TURNWIRE_STRESS_SCALE`` (default 1: a few hundred requests of each kind).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
from google.protobuf import struct_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.sidecar import SidecarProcess

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2

SCALE = int(os.environ.get("TURNWIRE_STRESS_SCALE", "1"))
FORBIDDEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
SERVICE = chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"]
FUZZ = settings(
    max_examples=250 * SCALE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=SCALE == 1,  # CI: the same cases every run
)


@pytest.fixture(scope="module")
def channel(tmp_path_factory: pytest.TempPathFactory) -> Iterator[grpc.Channel]:
    sidecar = SidecarProcess(workdir=tmp_path_factory.mktemp("fuzz"))
    sidecar.start_blocking()
    channel = grpc.insecure_channel(sidecar.target)
    yield channel
    channel.close()
    log = sidecar.log_text()
    sidecar.kill()
    assert "Traceback" not in log, log[-3000:]


@pytest.fixture(scope="module")
def stub(channel: grpc.Channel) -> chat_service_pb2_grpc.ChatServiceStub:
    return chat_service_pb2_grpc.ChatServiceStub(channel)


ids = st.one_of(
    st.text(max_size=140),
    st.from_regex(r"[A-Za-z0-9._:-]{1,20}", fullmatch=True),
    st.sampled_from(["c1", "c\n", "tw-r-1", "", " ", "a" * 129]),
)
json_values = st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@st.composite
def messages(draw: Any) -> message_pb2.Message:
    message = message_pb2.Message(id=draw(ids), role=draw(st.integers(min_value=-1, max_value=5)))
    for _ in range(draw(st.integers(min_value=0, max_value=3))):
        kind = draw(st.sampled_from(["text", "tool_call", "file", "data", "step_start", "reasoning"]))
        part = message.parts.add()
        if kind == "text":
            part.text.text = draw(st.text(max_size=50))
        elif kind == "tool_call":
            part.tool_call.tool_call_id = draw(ids)
            part.tool_call.tool_name = draw(st.text(max_size=10))
            part.tool_call.input_json = draw(st.text(max_size=30))
            part.tool_call.state = draw(st.integers(min_value=0, max_value=9))
        elif kind == "file":
            part.file.media_type = draw(st.text(max_size=10))
            part.file.data = draw(st.binary(max_size=20))
        elif kind == "data":
            part.data.type = draw(st.text(max_size=10))
        elif kind == "step_start":
            part.step_start.SetInParent()
        else:
            part.reasoning.text = draw(st.text(max_size=20))
    return message


def _body(value: Any) -> struct_pb2.Struct:
    body = struct_pb2.Struct()
    if isinstance(value, dict):
        with contextlib.suppress(ValueError, TypeError):
            body.update(value)
    return body


def _conversation(stub: chat_service_pb2_grpc.ChatServiceStub, conversation_id: str) -> Any:
    try:
        return stub.GetConversation(chat_service_pb2.GetConversationRequest(conversation_id=conversation_id))
    except grpc.RpcError as error:
        assert error.code() not in FORBIDDEN, (error.code(), error.details())
        return error.code()


def _turn(call: Any) -> grpc.StatusCode:
    try:
        for response in call:
            end = response.event.turn_end if response.event.HasField("turn_end") else None
            if end is not None and end.HasField("error"):
                assert end.error.code not in (2, 13), end.error.message  # UNKNOWN, INTERNAL in TurnEnd
        return grpc.StatusCode.OK
    except grpc.RpcError as error:
        return error.code()


@FUZZ
@given(conversation_id=ids, request_id=ids, message=messages(), body=json_values, model=st.text(max_size=12))
def test_chat_requests(  # noqa: PLR0917 - hypothesis passes the drawn values as arguments
    stub: chat_service_pb2_grpc.ChatServiceStub,
    conversation_id: str,
    request_id: str,
    message: message_pb2.Message,
    body: Any,
    model: str,
) -> None:
    before = _conversation(stub, conversation_id) if conversation_id.isascii() else None
    request = chat_service_pb2.ChatRequest(
        conversation_id=conversation_id, request_id=request_id, message=message, body=_body(body), model=model
    )
    code = _turn(stub.Chat(request, timeout=30))
    assert code not in FORBIDDEN
    if code != grpc.StatusCode.OK and before is not None:
        assert _conversation(stub, conversation_id) == before  # refused: nothing stored changed


@FUZZ
@given(conversation_id=ids, messages=st.lists(messages(), max_size=3), request_id=ids)
def test_save_messages_and_continue_requests(
    stub: chat_service_pb2_grpc.ChatServiceStub,
    conversation_id: str,
    messages: list[message_pb2.Message],
    request_id: str,
) -> None:
    before = _conversation(stub, conversation_id) if conversation_id.isascii() else None
    save = chat_service_pb2.SaveMessagesRequest(
        conversation_id=conversation_id, request_id=request_id, messages=messages
    )
    code = _turn(stub.SaveMessages(save, timeout=30))
    assert code not in FORBIDDEN
    if code != grpc.StatusCode.OK and before is not None:
        assert _conversation(stub, conversation_id) == before
    again = chat_service_pb2.ContinueLastTurnRequest(conversation_id=conversation_id, request_id=request_id)
    assert _turn(stub.ContinueLastTurn(again, timeout=30)) not in FORBIDDEN


@FUZZ
@given(
    token=st.text(max_size=300) | st.binary(max_size=300).map(lambda b: b.decode("latin-1")),
    size=st.integers(),
)
def test_list_and_cancel_requests(stub: chat_service_pb2_grpc.ChatServiceStub, token: str, size: int) -> None:
    page_size = max(min(size, 2**31 - 1), -(2**31))
    calls: tuple[Callable[[], object], ...] = (
        lambda: stub.ListConversations(
            chat_service_pb2.ListConversationsRequest(page_size=page_size, page_token=token)
        ),
        lambda: stub.CancelChat(chat_service_pb2.CancelChatRequest(request_id=token)),
    )
    for call in calls:
        try:
            call()
        except grpc.RpcError as error:
            assert error.code() not in FORBIDDEN, (error.code(), error.details())


def _raw(data: bytes) -> bytes:
    return data  # the bytes go on the wire as they are


@FUZZ
@given(method=st.sampled_from(list(SERVICE.methods)), payload=st.binary(max_size=200))
def test_raw_bytes(channel: grpc.Channel, method: Any, payload: bytes) -> None:
    path = f"/{SERVICE.full_name}/{method.name}"
    try:
        if method.server_streaming:
            call = channel.unary_stream(path, request_serializer=_raw, response_deserializer=_raw)
            for _ in call(payload, timeout=30):
                pass
        else:
            channel.unary_unary(path, request_serializer=_raw, response_deserializer=_raw)(
                payload, timeout=30
            )
    except grpc.RpcError as error:
        assert error.code() not in FORBIDDEN, (method.name, error.code(), error.details())
