"""The standard gRPC services served beside ChatService: health and server reflection.

Both are registered here, and only here, so that whatever guards ChatService (authentication)
can leave them open by name: :data:`STANDARD_SERVICES`.

Reflection is served in both versions: ``grpc.reflection.v1`` (current; grpcurl, buf curl and
Postman try it first) and ``grpc.reflection.v1alpha`` (older clients). grpcio-reflection
(checked: 1.85.1, the newest release) implements only v1alpha (grpc/grpc#38576). The two protocol
versions are the same messages under another package name (the v1 proto is the v1alpha one
renamed, field for field), so the library's v1alpha servicer answers v1 calls unchanged: v1 is
that servicer registered under the v1 method name, and the v1 file descriptor (for clients that
describe the reflection service itself) is the v1alpha one renamed.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

__all__ = [
    "HEALTH_SERVICE",
    "LIVENESS",
    "REFLECTION_V1",
    "REFLECTION_V1ALPHA",
    "STANDARD_SERVICES",
    "add_standard_services",
]

HEALTH_SERVICE: str = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
"""``grpc.health.v1.Health``."""
REFLECTION_V1ALPHA: str = reflection.SERVICE_NAME
"""``grpc.reflection.v1alpha.ServerReflection``."""
REFLECTION_V1 = "grpc.reflection.v1.ServerReflection"
"""The current reflection service (grpc-proto ``grpc/reflection/v1/reflection.proto``)."""
LIVENESS = "turnwire.liveness"
"""The health status name a liveness probe asks (docs/operate/deploy.md): SERVING from start-up
until the graceful stop closes the listener, through the drain window and while the store's
database is unreachable, which turn ``""`` and ChatService NOT_SERVING (readiness). A liveness
probe on ``""`` would restart every replica during a database outage, cutting off the turns
that wait for it to store their answers."""
STANDARD_SERVICES: tuple[str, ...] = (HEALTH_SERVICE, REFLECTION_V1, REFLECTION_V1ALPHA)
"""The services :func:`add_standard_services` registers, by full name."""

_V1_FILE = "grpc/reflection/v1/reflection.proto"


def add_standard_services(server: grpc.aio.Server, services: Sequence[str]) -> health_aio.HealthServicer:
    """Register health and reflection (v1 and v1alpha) on ``server``.

    ``services``: the full names of the application services also registered, listed by
    reflection beside the standard ones. Returns the health servicer, whose statuses the caller
    sets (it starts with only ``""`` SERVING)."""
    health = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    _register_v1_descriptor()
    servicer = reflection.aio.ReflectionServicer((*services, *STANDARD_SERVICES))
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                REFLECTION_V1,
                {
                    "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                        servicer.ServerReflectionInfo,
                        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
                    )
                },
            ),
        )
    )
    return health


def _register_v1_descriptor() -> None:
    """Add the v1 reflection file to the default descriptor pool (which reflection serves) unless
    something, such as a grpcio-reflection that ships v1, already did."""
    pool = descriptor_pool.Default()
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    file = descriptor_pb2.FileDescriptorProto()
    reflection_pb2.DESCRIPTOR.CopyToProto(file)
    old, new = f".{file.package}.", ".grpc.reflection.v1."
    file.name = _V1_FILE
    file.package = "grpc.reflection.v1"
    # The v1 file's own options (grpc-proto); v1alpha's say deprecated.
    file.options.Clear()
    file.options.go_package = "google.golang.org/grpc/reflection/grpc_reflection_v1"
    file.options.java_multiple_files = True
    file.options.java_package = "io.grpc.reflection.v1"
    file.options.java_outer_classname = "ServerReflectionProto"
    for message in file.message_type:
        for field in message.field:
            if field.HasField("type_name"):
                field.type_name = field.type_name.replace(old, new, 1)
    for service in file.service:
        for method in service.method:
            method.input_type = method.input_type.replace(old, new, 1)
            method.output_type = method.output_type.replace(old, new, 1)
    pool.Add(file)
