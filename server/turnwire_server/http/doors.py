"""The HTTP listener's application: its doors behind one CORS layer, and ``GET /healthz``.

A **door** is a set of Starlette routes that speaks one protocol and reaches the RPCs through
:class:`~turnwire_server.http.calls.InProcessCalls` (so through the gRPC server's interceptors
and servicer: the same authentication, tenants, limits, metrics, traces and logs). Adding one
(the OpenAI, AI SDK and AG-UI doors of issue 36, say) is a function ``(DoorContext) -> Door`` in a
module of this package, listed in :data:`turnwire_server.http.server.DOORS`
(docs/http.md#adding-a-door). The Connect and gRPC-Web door (:mod:`.connect_door`) is the first;
it serves every path that starts with a served service's full name.

CORS is Starlette's ``CORSMiddleware`` (preflight answers and the ``Access-Control-*`` headers),
configured by ``http.cors`` with the Connect and gRPC-Web headers always allowed and exposed
(:mod:`turnwire_server.http.settings`). Authentication is the bearer header; no cookie is read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from google.protobuf.descriptor import ServiceDescriptor
from grpc_health.v1 import health_pb2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Mount, Route

from turnwire_server.http.ag_ui_door import AgUiDoor
from turnwire_server.http.ai_sdk_door import AiSdkDoor
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls, metadata_of
from turnwire_server.http.connect_door import ConnectDoor, endpoints_of
from turnwire_server.http.door_requests import UNSERVED_METHODS
from turnwire_server.http.inspector_door import inspector_routes
from turnwire_server.http.openai_chat import ChatCompletionsDoor
from turnwire_server.http.openai_door import ResponsesDoor
from turnwire_server.http.openai_errors import error_response
from turnwire_server.http.settings import PROTOCOL_REQUEST_HEADERS, PROTOCOL_RESPONSE_HEADERS, CorsSettings

HEALTH_CHECK = "/grpc.health.v1.Health/Check"


@dataclass(frozen=True, slots=True)
class DoorContext:
    """What a door is built from: ``calls`` (every served method, through the interceptors),
    the ``services`` served (their descriptors) and ``read_max_bytes``, the largest request
    message taken (``limits.max_receive_message_bytes``, as over gRPC); ``inspector``: serve the
    inspector page (``http.inspector``)."""

    calls: InProcessCalls
    services: Sequence[ServiceDescriptor]
    read_max_bytes: int
    inspector: bool = False


@dataclass(frozen=True, slots=True)
class Door:
    """One protocol's routes; ``name`` appears in the start-up log line."""

    name: str
    routes: Sequence[BaseRoute]


DoorFactory = Callable[[DoorContext], Door]


def connect_door(context: DoorContext) -> Door:
    """Connect and gRPC-Web for every unary and server-streaming method of the services."""
    app = ConnectDoor(
        endpoints_of(context.services, context.calls),
        read_max_bytes=context.read_max_bytes,
        calls=context.calls,
    )
    return Door(
        "Connect, gRPC-Web", [Mount(f"/{service.full_name}", app=app) for service in context.services]
    )


def health_door(context: DoorContext) -> Door:
    """``GET /healthz``: 200 ``SERVING`` while the sidecar serves, 503 otherwise (the drain
    window, shutdown): the gRPC health service's overall status, for HTTP load balancers."""

    async def healthz(request: Request) -> Response:
        call = DoorCallInfo(metadata_of(request.headers.items()))
        try:
            response = await context.calls.unary(HEALTH_CHECK, health_pb2.HealthCheckRequest(), call)
        except CallEnded as ended:
            return PlainTextResponse(f"{ended.code.name}\n", status_code=503)
        name = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)  # type: ignore[attr-defined]
        return PlainTextResponse(f"{name}\n", status_code=200 if name == "SERVING" else 503)

    return Door("health", [Route("/healthz", healthz, methods=["GET"])])


def openai_door(context: DoorContext) -> Door:
    """OpenAI's Responses and Chat Completions (``/v1/responses``, ``/v1/chat/completions``): the
    OpenAI SDKs get the sidecar's turns
    (:mod:`turnwire_server.http.openai_door`, docs/api/openai.md)."""
    responses = ResponsesDoor(context.calls, context.read_max_bytes)
    chat = ChatCompletionsDoor(context.calls, context.read_max_bytes)
    return Door("OpenAI", [*responses.routes(), *chat.routes()])


async def _unserved(request: Request) -> Response:
    """OpenAI's 404 error body for a ``/v1/`` path no door serves, naming what is served."""
    return error_response(
        404,
        f"{request.method} {request.url.path} is not served by this sidecar; its OpenAI-compatible door "
        "serves POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel and "
        "POST /v1/chat/completions (docs/api/openai.md; models, files, embeddings, conversations and "
        "input items are not served: read a conversation with GetConversation)",
        "invalid_request_error",
        None,
        "unknown_url",
    )


def openai_unserved_door(context: DoorContext) -> Door:
    """The last door: any other ``/v1/`` path or method answers OpenAI's 404 error body, which the
    OpenAI SDKs raise as ``NotFoundError`` with its message (``client.models.list()``,
    ``responses.input_items.list`` …), rather than a plain-text ``Not Found`` they show as
    ``Error code: 404``. Matched last, so every door's own routes come first, the catch-alls of
    the AI SDK and AG-UI doors included (``/v1/ai-sdk/…``, ``/v1/ag-ui/…``: each in its own
    door's error shape)."""
    return Door("", [Route("/v1/{path:path}", _unserved, methods=UNSERVED_METHODS)])


def ag_ui_door(context: DoorContext) -> Door:
    """AG-UI (``POST /v1/ag-ui``): ``@ag-ui/client``'s ``HttpAgent`` runs the sidecar's turns
    (:mod:`turnwire_server.http.ag_ui_door`, docs/api/ag-ui.md)."""
    return Door("AG-UI", AgUiDoor(context.calls, context.read_max_bytes).routes())


def ai_sdk_door(context: DoorContext) -> Door:
    """The Vercel AI SDK's UI message stream (``/v1/ai-sdk/chat``): ``useChat`` and the AI SDK's
    ``Chat`` with their default transport get the sidecar's turns
    (:mod:`turnwire_server.http.ai_sdk_door`, docs/api/ai-sdk.md)."""
    return Door("AI SDK", AiSdkDoor(context.calls, context.read_max_bytes).routes())


def inspector_door(context: DoorContext) -> Door:
    """The inspector page at ``/inspector/`` when ``http.inspector`` is on, else no route
    (:mod:`turnwire_server.http.inspector_door`, docs/inspector.md)."""
    return Door("inspector" if context.inspector else "", inspector_routes() if context.inspector else [])


def build_app(context: DoorContext, doors: Sequence[DoorFactory], cors: CorsSettings) -> Starlette:
    """The listener's ASGI application: ``doors`` built from ``context``, in order (the first
    route that matches a path wins), behind CORS when ``cors.allow_origins`` names any."""
    built = [factory(context) for factory in doors]
    middleware = []
    if cors.allow_origins:
        middleware.append(
            Middleware(
                CORSMiddleware,
                allow_origins=cors.allow_origins,
                allow_credentials=cors.allow_credentials,
                allow_methods=["GET", "POST"],
                allow_headers=[*PROTOCOL_REQUEST_HEADERS, *cors.allow_headers],
                expose_headers=[*PROTOCOL_RESPONSE_HEADERS, *cors.expose_headers],
                max_age=cors.max_age_seconds,
            )
        )
    app = Starlette(routes=[route for door in built for route in door.routes], middleware=middleware)
    app.state.doors = tuple(door.name for door in built if door.name)
    return app


__all__ = [
    "Door",
    "DoorContext",
    "DoorFactory",
    "ag_ui_door",
    "ai_sdk_door",
    "build_app",
    "connect_door",
    "health_door",
    "inspector_door",
    "openai_door",
    "openai_unserved_door",
]
