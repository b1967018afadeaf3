"""What an HTTP door request checks, it checks once (``api/door_checks.py``), and no check is lost.

The doors run in process over a stub ChatService behind the gRPC server's real interceptors
(RpcObserver, AccessInterceptor with static tokens, CallGate). Before: every door request verified
its bearer token twice or more (``InProcessCalls.refusal`` before the body, then each call it made:
with JWT auth a signature check each), the call gate walked the JSON of a request whose body the
door had already bounded, a Responses retry with its ``Idempotency-Key`` opened ``ResumeTurn`` twice,
a token refused before the body of ``/v1/chat/completions`` was counted under ``Chat`` (the door runs
``SaveMessages``), and uvicorn believed ``X-Forwarded-For`` from any process on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc
import httpx2 as httpx
import pytest
from prometheus_client import REGISTRY
from support.event_logs import turn_events
from support.sidecar import free_port

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc
from turnwire_server.access_settings import AuthSettings
from turnwire_server.api import admission
from turnwire_server.api.access import AccessInterceptor
from turnwire_server.api.admission import CallGate
from turnwire_server.api.authentication import Authenticator, token_digest
from turnwire_server.api.caller import Caller
from turnwire_server.api.json_depth import MAX_JSON_DEPTH, too_deep_field
from turnwire_server.api.rpc_observer import RpcObserver
from turnwire_server.http.calls import CallEnded, DoorCallInfo, InProcessCalls, MethodTable, metadata_of
from turnwire_server.http.doors import (
    DoorContext,
    ag_ui_door,
    ai_sdk_door,
    build_app,
    connect_door,
    openai_door,
)
from turnwire_server.http.server import start_http
from turnwire_server.http.settings import CorsSettings, HttpSettings

TOKEN = "door-checks-token-0123456789"
SERVICE = "/turnwire.v1.ChatService/"


def _events(request: Any) -> list[Any]:
    kinds: list[dict[str, Any]] = [
        {"turn_start": {"message_id": "m-a", "model": "scripted:echo"}},
        {"step_start": {}},
        {"text_start": {"id": "t"}},
        {"text_delta": {"id": "t", "delta": "hello"}},
        {"text_end": {"id": "t"}},
        {"step_finish": {"usage": {"input_tokens": 1, "output_tokens": 1}}},
        {"turn_end": {"status": "TURN_STATUS_COMPLETED"}},
    ]
    return turn_events(kinds, request.conversation_id or "c", request.request_id or "r")


class _Servicer(chat_service_pb2_grpc.ChatServiceServicer):
    """A turn of a few events for every turn call and ``ResumeTurn``; records each call's method,
    the peer it came from and what :func:`too_deep_field` says of its request. Every method is
    asyncio's, as the sidecar's are (the interceptors pass synchronous handlers through unwrapped)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.peers: list[str] = []
        self.too_deep: list[str | None] = []

    async def _turn(self, method: str, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls.append(method)
        self.peers.append(context.peer())
        self.too_deep.append(too_deep_field(request))
        for event in _events(request):
            yield chat_service_pb2.ChatResponse(event=event)

    async def Chat(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self._turn("Chat", request, context):
            yield response

    async def SaveMessages(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self._turn("SaveMessages", request, context):
            yield response

    async def SubmitToolResults(self, request: Any, context: Any) -> AsyncIterator[Any]:
        async for response in self._turn("SubmitToolResults", request, context):
            yield response

    async def ResumeTurn(self, request: Any, context: Any) -> AsyncIterator[Any]:
        self.calls.append("ResumeTurn")
        for event in _events(chat_service_pb2.ChatRequest(request_id=request.request_id)):
            yield chat_service_pb2.ResumeTurnResponse(event=event)

    async def GetSubmission(self, request: Any, context: Any) -> Any:
        self.calls.append("GetSubmission")
        await context.abort(grpc.StatusCode.NOT_FOUND, "no such submission")

    async def GetConversation(self, request: Any, context: Any) -> Any:
        self.calls.append("GetConversation")
        return chat_service_pb2.GetConversationResponse()

    async def SubmitMessages(self, request: Any, context: Any) -> Any:
        self.calls.append("SubmitMessages")
        return chat_service_pb2.SubmitMessagesResponse()

    async def DeleteConversation(self, request: Any, context: Any) -> Any:
        self.calls.append("DeleteConversation")
        return chat_service_pb2.DeleteConversationResponse()


class _CountingAuthenticator:
    """An :class:`Authenticator` (static tokens) that counts the tokens it verifies."""

    def __init__(self) -> None:
        document = {"tokens": [{"sha256": token_digest(TOKEN), "principal": "p", "tenant": "t"}]}
        self._inner = Authenticator.from_settings(
            AuthSettings(enabled=True, tokens_env="TOKENS"), {"TOKENS": json.dumps(document)}
        )
        self.verified = 0

    def authenticate(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> Caller:
        self.verified += 1
        return self._inner.authenticate(metadata)


class _Doors:
    def __init__(self) -> None:
        self.servicer = _Servicer()  # type: ignore[abstract]  # the doors call only these methods
        self.authenticator = _CountingAuthenticator()
        table = MethodTable()
        chat_service_pb2_grpc.add_ChatServiceServicer_to_server(self.servicer, table)
        access = AccessInterceptor(self.authenticator, None)  # type: ignore[arg-type]
        self.calls = InProcessCalls(table, [RpcObserver(), access, CallGate(8)])
        service = chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"]
        self.context = DoorContext(self.calls, [service], 1 << 20)
        doors = [connect_door, openai_door, ag_ui_door, ai_sdk_door]
        self.app = build_app(self.context, doors, CorsSettings())

    def client(self, token: str = TOKEN) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app),
            base_url="http://door",
            headers={"authorization": f"Bearer {token}"},
            timeout=10,
        )


@pytest.fixture
def doors() -> _Doors:
    return _Doors()


def nested(levels: int) -> Any:
    """A JSON value nesting ``levels`` objects deep."""
    value: Any = "leaf"
    for _ in range(levels):
        value = {"k": value}
    return value


def _requests(depth: int) -> list[tuple[str, dict[str, Any], dict[str, str]]]:
    """A turn request to each door that takes a body: the body nests ``depth`` levels in all, in
    each place a door copies into a request's JSON (``Struct``) fields."""
    inner = depth - 3  # a tool's parameters sit 3 levels into the body ({tools: [{parameters}]})
    message = [
        {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi"}], "metadata": nested(depth - 3)}
    ]
    return [
        (
            "/v1/responses",
            {
                "model": "m",
                "input": "hi",
                "extra": nested(depth - 1),
                "tools": [{"type": "function", "name": "f", "parameters": nested(inner)}],
            },
            {},
        ),
        (
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": "hi"}],
                "metadata": nested(depth - 1),
                "tools": [{"type": "function", "function": {"name": "f", "parameters": nested(depth - 4)}}],
            },
            {},
        ),
        (
            "/v1/ag-ui",
            {
                "threadId": "t1",
                "runId": "r1",
                "messages": [{"id": "m1", "role": "user", "content": "hi"}],
                "tools": [{"name": "f", "description": "", "parameters": nested(inner)}],
                "context": [],
                "state": nested(depth - 1),
                "forwardedProps": {},
            },
            {"accept": "text/event-stream"},
        ),
        (
            "/v1/ai-sdk/chat",
            {
                "id": "c1",
                "messages": message,
                "extra": nested(depth - 1),
                "tools": {"f": {"inputSchema": nested(depth - 3)}},
            },
            {},
        ),
    ]


async def test_a_door_request_verifies_its_token_once(doors: _Doors) -> None:
    async with doors.client() as http:
        for path, body, headers in _requests(4):
            before = doors.authenticator.verified
            answer = await http.post(path, json=body, headers=headers)
            assert answer.status_code == 200, (path, answer.text)
            assert doors.authenticator.verified - before == 1, path
        # A request that reads no body and makes two calls (GetSubmission, then ResumeTurn).
        before = doors.authenticator.verified
        assert (await http.get("/v1/responses/resp-1")).status_code == 200
        assert doors.authenticator.verified - before == 1
        # Connect: the token checked before the request is read, then the call.
        before = doors.authenticator.verified
        answer = await http.post(f"{SERVICE}GetConversation", json={"conversationId": "c"})
        assert answer.status_code == 200, answer.text
        assert doors.authenticator.verified - before == 1
    async with doors.client("wrong-token-0123456789") as http:  # still checked on every route
        for path, body, headers in _requests(4):
            assert (await http.post(path, json=body, headers=headers)).status_code == 401, path
        assert (await http.get("/v1/responses/resp-1")).status_code == 401
        answer = await http.post(f"{SERVICE}GetConversation", json={"conversationId": "c"})
        assert answer.status_code == 401


async def test_other_metadata_is_verified_again(doors: _Doors) -> None:
    call = DoorCallInfo(metadata_of([("authorization", f"Bearer {TOKEN}")]))
    assert await doors.calls.refusal(SERVICE + "Chat", call) is None
    assert call.checks.caller_for(call.metadata) == Caller("p", "t")
    other = dataclasses.replace(call, metadata=metadata_of([("authorization", "Bearer forged-0123456789")]))
    with pytest.raises(CallEnded) as refused:
        await doors.calls.unary(SERVICE + "GetConversation", chat_service_pb2.GetConversationRequest(), other)
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


async def test_a_door_request_walks_its_json_once_and_connect_still_gets_the_gates_check(
    doors: _Doors, monkeypatch: pytest.MonkeyPatch
) -> None:
    walks: list[str] = []

    def counted(message: Any, limit: int = MAX_JSON_DEPTH) -> str | None:
        walks.append(type(message).__name__)
        return too_deep_field(message, limit)

    monkeypatch.setattr(admission, "too_deep_field", counted)
    async with doors.client() as http:
        # Bodies nested as deep as taken: every request made of them is within the gate's bound.
        for path, body, headers in _requests(MAX_JSON_DEPTH):
            answer = await http.post(path, json=body, headers=headers)
            assert answer.status_code == 200, (path, answer.text)
        assert doors.servicer.too_deep == [None] * 4
        assert walks == []  # the doors bounded the bodies: the gate did not walk them again
        for path, body, headers in _requests(MAX_JSON_DEPTH + 1):  # one level more: the door's 400
            answer = await http.post(path, json=body, headers=headers)
            assert answer.status_code == 400 and "more than 32 levels deep" in answer.text, (
                path,
                answer.text,
            )
        answer = await http.post(
            f"{SERVICE}SubmitMessages",
            json={"conversationId": "c", "messages": [{"role": "ROLE_USER", "metadata": nested(33)}]},
        )
        assert walks == ["SubmitMessagesRequest"]  # Connect decodes its own requests: the gate checks
        assert answer.status_code == 400, answer.text
        assert answer.json()["message"].startswith("messages[0].metadata: nests JSON objects and arrays more")


async def test_a_retry_with_its_idempotency_key_opens_resume_turn_once(doors: _Doors) -> None:
    async with doors.client() as http:
        answer = await http.post(
            "/v1/responses", json={"model": "m", "input": "hi"}, headers={"idempotency-key": "k1"}
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["output"][0]["content"][0]["text"] == "hello"
        assert doors.servicer.calls == ["ResumeTurn"]  # the earlier response, read once


def _handled(method: str, code: str) -> float:
    labels = {"grpc_type": "server_stream", "grpc_service": "turnwire.v1.ChatService"}
    value = REGISTRY.get_sample_value(
        "grpc_server_handled_total", {**labels, "grpc_method": method, "grpc_code": code}
    )
    return value or 0.0


async def test_a_token_refused_before_the_body_counts_under_the_routes_method(doors: _Doors) -> None:
    before = {method: _handled(method, "Unauthenticated") for method in ("Chat", "SaveMessages")}
    async with doors.client("wrong-token-0123456789") as http:
        answer = await http.post(
            "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]}
        )
        assert answer.status_code == 401
    after = {method: _handled(method, "Unauthenticated") for method in ("Chat", "SaveMessages")}
    assert (after["SaveMessages"] - before["SaveMessages"], after["Chat"] - before["Chat"]) == (1, 0)


@pytest.mark.parametrize(("trusted", "peer"), [(None, "127.0.0.1"), (["127.0.0.0/8"], "203.0.113.9")])
async def test_forwarded_headers_name_the_client_only_from_a_trusted_proxy(
    doors: _Doors, trusted: list[str] | None, peer: str
) -> None:
    """A real request over a socket from 127.0.0.1 carrying ``X-Forwarded-For``: by default the
    peer the servicer sees is the connection's; behind a listed proxy, the address it forwards."""
    listen = f"127.0.0.1:{free_port()}"
    settings = (
        HttpSettings(listen=listen)
        if trusted is None
        else HttpSettings(listen=listen, trusted_proxies=trusted)
    )
    listener = await start_http(settings, doors.context, None, shared_port=False, doors=[openai_door])
    try:
        async with httpx.AsyncClient(base_url=f"http://{settings.listen}", timeout=10) as http:
            answer = await http.post(
                "/v1/responses",
                json={"model": "m", "input": "hi"},
                headers={"authorization": f"Bearer {TOKEN}", "x-forwarded-for": "203.0.113.9"},
            )
        assert answer.status_code == 200, answer.text
        assert doors.servicer.peers[-1].split(":")[1] == peer
    finally:
        await listener.stop(5)


def test_a_trusted_proxy_is_an_address_or_a_network() -> None:
    assert HttpSettings(trusted_proxies=["10.0.0.7", "10.0.0.0/8", "2001:db8::/32"]).trusted_proxies
    with pytest.raises(ValueError, match=r"'proxy\.internal' is not an IP address or network"):
        HttpSettings(trusted_proxies=["proxy.internal"])
