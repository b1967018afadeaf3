"""The standard gRPC health service and server reflection of a real sidecar process."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client.v1 import chat_service_pb2

CHAT_SERVICE = "turnwire.v1.ChatService"
HEALTH_SERVICE = "grpc.health.v1.Health"


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("health-e2e")) as process:
        yield process


async def reflect(
    target: str, *requests: reflection_pb2.ServerReflectionRequest
) -> list[reflection_pb2.ServerReflectionResponse]:
    """Send ``requests`` on one ServerReflectionInfo stream; the responses in order."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = stub.ServerReflectionInfo(iter(requests), timeout=10)
        return [response async for response in call]


@pytest.mark.parametrize("service", ["", CHAT_SERVICE])
async def test_health_check_is_serving(sidecar: SidecarProcess, service: str) -> None:
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_health_check_of_an_unknown_service_is_not_found(sidecar: SidecarProcess) -> None:
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5
            )
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND


async def test_reflection_lists_the_services(sidecar: SidecarProcess) -> None:
    (response,) = await reflect(sidecar.target, reflection_pb2.ServerReflectionRequest(list_services=""))
    assert response.WhichOneof("message_response") == "list_services_response", response
    names = {service.name for service in response.list_services_response.service}
    assert {CHAT_SERVICE, HEALTH_SERVICE} <= names


async def test_reflection_returns_the_chat_service_file_descriptor(sidecar: SidecarProcess) -> None:
    (response,) = await reflect(
        sidecar.target,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=CHAT_SERVICE),
    )
    assert response.WhichOneof("message_response") == "file_descriptor_response", response
    files = {}
    for serialized in response.file_descriptor_response.file_descriptor_proto:
        file = descriptor_pb2.FileDescriptorProto.FromString(serialized)
        files[file.name] = file
    chat_file = files.get("turnwire/v1/chat_service.proto")
    assert chat_file is not None, sorted(files)
    assert chat_file.package == "turnwire.v1"
    (service,) = [s for s in chat_file.service if s.name == "ChatService"]

    # The served contract is the one the client was generated from.
    expected = chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"]
    served = {m.name: (m.input_type, m.output_type, m.server_streaming) for m in service.method}
    assert served == {
        m.name: (
            f".{m.input_type.full_name}",
            f".{m.output_type.full_name}",
            m.server_streaming,
        )
        for m in expected.methods
    }
    assert served["Chat"] == (".turnwire.v1.ChatRequest", ".turnwire.v1.ChatResponse", True)
    assert "turnwire/v1/message.proto" in chat_file.dependency


async def test_reflection_resolves_message_types_of_the_contract(sidecar: SidecarProcess) -> None:
    responses = await reflect(
        sidecar.target,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="turnwire.v1.TurnEvent"),
        reflection_pb2.ServerReflectionRequest(file_by_filename="turnwire/v1/message.proto"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="turnwire.v1.NoSuchThing"),
    )
    assert len(responses) == 3
    event_files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in responses[0].file_descriptor_response.file_descriptor_proto
    ]
    assert "turnwire/v1/event.proto" in {f.name for f in event_files}
    message_files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in responses[1].file_descriptor_response.file_descriptor_proto
    ]
    assert "Message" in {m.name for f in message_files for m in f.message_type}
    assert responses[2].WhichOneof("message_response") == "error_response"
    assert responses[2].error_response.error_code == grpc.StatusCode.NOT_FOUND.value[0]
