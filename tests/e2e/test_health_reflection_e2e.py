"""The standard gRPC health service and server reflection of a real sidecar process."""

from __future__ import annotations

import json
from collections.abc import Iterator

import grpc
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase
from support.buf_curl import buf_curl, list_services
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client.v1 import chat_service_pb2

CHAT_SERVICE = "turnwire.v1.ChatService"
HEALTH_SERVICE = "grpc.health.v1.Health"
REFLECTION_SERVICES = ("grpc.reflection.v1.ServerReflection", "grpc.reflection.v1alpha.ServerReflection")


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    with running_sidecar(tmp_path_factory.mktemp("health-e2e")) as process:
        yield process


REFLECTION_VERSIONS = ["v1", "v1alpha"]


async def reflect(
    target: str, *requests: reflection_pb2.ServerReflectionRequest, version: str = "v1alpha"
) -> list[reflection_pb2.ServerReflectionResponse]:
    """Send ``requests`` on one ServerReflectionInfo stream of reflection ``version``; the
    responses in order. (v1's messages are v1alpha's, field for field, under another package.)"""
    async with grpc.aio.insecure_channel(target) as channel:
        info = channel.stream_stream(
            f"/grpc.reflection.{version}.ServerReflection/ServerReflectionInfo",
            request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
            response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
        )
        call = info(iter(requests), timeout=10)
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


@pytest.mark.parametrize("version", REFLECTION_VERSIONS)
async def test_reflection_lists_the_services(sidecar: SidecarProcess, version: str) -> None:
    (response,) = await reflect(
        sidecar.target, reflection_pb2.ServerReflectionRequest(list_services=""), version=version
    )
    assert response.WhichOneof("message_response") == "list_services_response", response
    names = {service.name for service in response.list_services_response.service}
    assert names == {CHAT_SERVICE, HEALTH_SERVICE, *REFLECTION_SERVICES}


@pytest.mark.parametrize("version", REFLECTION_VERSIONS)
async def test_reflection_returns_the_chat_service_file_descriptor(
    sidecar: SidecarProcess, version: str
) -> None:
    (response,) = await reflect(
        sidecar.target,
        reflection_pb2.ServerReflectionRequest(file_containing_symbol=CHAT_SERVICE),
        version=version,
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


@pytest.mark.parametrize("service", REFLECTION_SERVICES)
async def test_reflection_describes_both_reflection_services(sidecar: SidecarProcess, service: str) -> None:
    (response,) = await reflect(
        sidecar.target, reflection_pb2.ServerReflectionRequest(file_containing_symbol=service), version="v1"
    )
    assert response.WhichOneof("message_response") == "file_descriptor_response", response
    (file,) = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in response.file_descriptor_response.file_descriptor_proto
    ]
    package = service.rpartition(".")[0]
    assert file.package == package
    if package == "grpc.reflection.v1":
        assert file.name == "grpc/reflection/v1/reflection.proto"  # as in grpc-proto
    (method,) = file.service[0].method
    assert (method.input_type, method.output_type) == (
        f".{package}.ServerReflectionRequest",
        f".{package}.ServerReflectionResponse",
    )


@pytest.mark.parametrize("protocol", ["grpc-v1", "grpc-v1alpha"])
async def test_buf_curl_lists_and_calls_through_each_reflection_version(
    sidecar: SidecarProcess, protocol: str
) -> None:
    url = f"http://{sidecar.target}"
    services = await list_services(url, protocol, "--http2-prior-knowledge")
    assert services == sorted([CHAT_SERVICE, HEALTH_SERVICE, *REFLECTION_SERVICES])
    # A call whose schema comes from reflection alone.
    out = await buf_curl(
        "--http2-prior-knowledge", "--reflect-protocol", protocol, "-d", "{}", f"{url}/{HEALTH_SERVICE}/Check"
    )
    assert json.loads(out) == {"status": "SERVING"}


def test_grpcio_reflections_own_client_reads_the_contract(sidecar: SidecarProcess) -> None:
    with grpc.insecure_channel(sidecar.target) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert set(database.get_services()) == {CHAT_SERVICE, HEALTH_SERVICE, *REFLECTION_SERVICES}
        pool = descriptor_pool.DescriptorPool(database)
        chat = pool.FindServiceByName(CHAT_SERVICE).methods_by_name["Chat"]
    assert chat.output_type.full_name == "turnwire.v1.ChatResponse"
