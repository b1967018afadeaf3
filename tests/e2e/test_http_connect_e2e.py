"""The HTTP listener (docs/http.md) against a real ``turnwire serve`` with ``http.listen`` and
``auth:`` on: every ChatService RPC over Connect and gRPC-Web, JSON and binary; a turn started
on one listener cancelled, resumed and read on the other; tenants; CORS; and the curl commands
of docs/http.md, run as written.

Before issue 35 the sidecar had no HTTP listener: every test here fails to connect.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import subprocess
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx2 as httpx
import pytest
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from google.protobuf import message_factory
from prometheus_client.parser import text_string_to_metric_families
from support.connect_calls import CHAT_SERVICE, ConnectChat, detail_types, error_reason
from support.endless import endless_step
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarProcess, free_port, running_sidecar
from support.tokens import new_token
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

TOKEN_A = new_token()
TOKEN_B = new_token()
DOCS = Path(__file__).resolve().parents[2] / "docs" / "api" / "http.md"
ORIGIN = "https://app.example"

SCRIPTS = {
    "echo": [{"text": "answered over any door"}],
    "slow": [endless_step("".join(f"w{i} " for i in range(50)), 40)],
}


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("http-connect-e2e")
    tokens = {TOKEN_A: ("alice", "tenant-a"), TOKEN_B: ("bob", "tenant-b")}
    config = http_sidecar_config(workdir, tokens, SCRIPTS, cors={"allow_origins": [ORIGIN]})
    config["metrics"] = {"enabled": True, "listen": f"127.0.0.1:{free_port()}"}
    with running_sidecar(workdir, config) as process:
        yield process


def base_url(sidecar: SidecarProcess) -> str:
    return http_base(sidecar)


def text(value: str) -> message_pb2.Message:
    return message_pb2.Message(parts=[message_pb2.Part(text=message_pb2.TextPart(text=value))])


@pytest.fixture
async def grpc_a(sidecar: SidecarProcess) -> AsyncIterator[TurnwireClient]:
    async with TurnwireClient(sidecar.target, token=TOKEN_A) as client:
        yield client


@pytest.mark.parametrize(("protocol", "encoding"), [("connect", "json"), ("grpc-web", "proto")])
async def test_every_rpc_reaches_the_servicer(sidecar: SidecarProcess, protocol: str, encoding: str) -> None:
    """An empty request to each method answers what the servicer's validation answers over
    gRPC (INVALID_ARGUMENT with ErrorInfo and BadRequest, or a plain answer), never
    UNIMPLEMENTED or a 404."""
    door = ConnectChat(base_url(sidecar), protocol, encoding, TOKEN_A)
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        for method in CHAT_SERVICE.methods:
            request_class = message_factory.GetMessageClass(method.input_type)  # any file's message
            path = f"/{CHAT_SERVICE.full_name}/{method.name}"
            metadata = (("authorization", f"Bearer {TOKEN_A}"),)
            if method.server_streaming:
                grpc_call = channel.unary_stream(path, request_class.SerializeToString, lambda b: b)
            else:
                grpc_call = channel.unary_unary(path, request_class.SerializeToString, lambda b: b)
            try:
                reply = grpc_call(request_class(), metadata=metadata)
                if method.server_streaming:
                    async for _ in reply:
                        pass
                else:
                    await reply
                expected: object = "OK"
            except grpc.aio.AioRpcError as error:
                expected = error.code().name, error.details()
            try:
                if method.server_streaming:
                    async for _ in door.stream(method.name, request_class()):
                        pass
                else:
                    await door.unary(method.name, request_class())
                got: object = "OK"
            except ConnectError as error:
                got = error.code.name.replace("CANCELED", "CANCELLED"), error.message
                assert not (error.code == Code.INVALID_ARGUMENT and not detail_types(error)), error
            assert got == expected, method.name


@pytest.mark.parametrize(
    ("protocol", "encoding"), [("connect", "json"), ("connect", "proto"), ("grpc-web", "json")]
)
async def test_chat_streams_the_turn(sidecar: SidecarProcess, protocol: str, encoding: str) -> None:
    door = ConnectChat(base_url(sidecar), protocol, encoding, TOKEN_A)
    conversation = f"chat-{protocol}-{encoding}"
    events = [
        response.event
        async for response in door.stream(
            "Chat", chat_service_pb2.ChatRequest(conversation_id=conversation, message=text("hi"))
        )
    ]
    kinds = [event.WhichOneof("event") for event in events]
    assert kinds[0] == "turn_start" and kinds[-1] == "turn_end", kinds
    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    assert "".join(e.text_delta.delta for e in events if e.HasField("text_delta")) == "answered over any door"
    stored = await door.unary(
        "GetConversation", chat_service_pb2.GetConversationRequest(conversation_id=conversation)
    )
    assert [m.role for m in stored.conversation.messages] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
    ]


async def test_a_grpc_turn_is_cancelled_resumed_and_read_over_connect(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    door = ConnectChat(base_url(sidecar), token=TOKEN_A)
    stream = grpc_a.chat("cross-1", "go", model="scripted:slow", request_id="cross-1-r")
    first = await anext(stream)  # the turn is stored and running
    assert first.HasField("turn_start")
    seen: list[event_pb2.TurnEvent] = []
    async for response in door.stream(
        "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id="cross-1-r")
    ):
        seen.append(response.event)
        if len(seen) == 3:
            break
    assert [e.sequence_number for e in seen] == [1, 2, 3]
    cancelled = await door.unary("CancelChat", chat_service_pb2.CancelChatRequest(request_id="cross-1-r"))
    assert cancelled.cancelled
    grpc_events = [first, *[event async for event in stream]]
    assert grpc_events[-1].turn_end.status == event_pb2.TURN_STATUS_ABORTED
    replayed = [
        response.event
        async for response in door.stream(
            "ResumeTurn", chat_service_pb2.ResumeTurnRequest(request_id="cross-1-r")
        )
    ]
    assert [e.SerializeToString() for e in replayed] == [e.SerializeToString() for e in grpc_events]


async def test_a_connect_turn_is_cancelled_resumed_and_read_over_grpc(
    sidecar: SidecarProcess, grpc_a: TurnwireClient
) -> None:
    door = ConnectChat(base_url(sidecar), encoding="proto", token=TOKEN_A)
    request = chat_service_pb2.ChatRequest(
        conversation_id="cross-2", message=text("go"), model="scripted:slow", request_id="cross-2-r"
    )
    events: list[event_pb2.TurnEvent] = []

    async def read() -> None:
        async for response in door.stream("Chat", request):
            events.append(response.event)

    reader = asyncio.create_task(read())
    await wait_until(lambda: len(events) >= 3, timeout=30, what="the Connect stream started")
    resumed = grpc_a.resume_turn("cross-2-r", after_sequence_number=1)
    assert (await anext(resumed)).sequence_number == 2
    await resumed.aclose()
    assert await grpc_a.cancel_chat("cross-2-r")
    await asyncio.wait_for(reader, 30)
    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_ABORTED
    replayed = await collect(grpc_a.resume_turn("cross-2-r"))
    assert [e.SerializeToString() for e in replayed.events] == [e.SerializeToString() for e in events]
    conversation = await grpc_a.get_conversation("cross-2")
    assert conversation.messages[0].parts[0].text.text == "go"


async def test_tenants_and_tokens_hold_over_connect(sidecar: SidecarProcess, grpc_a: TurnwireClient) -> None:
    await collect(grpc_a.chat("alice-only", "mine"))
    as_b = ConnectChat(base_url(sidecar), token=TOKEN_B)
    as_a = ConnectChat(base_url(sidecar), token=TOKEN_A)
    request = chat_service_pb2.GetConversationRequest(conversation_id="alice-only")
    nowhere = chat_service_pb2.GetConversationRequest(conversation_id="nowhere-at-all")
    with pytest.raises(ConnectError) as other:
        await as_b.unary("GetConversation", request)
    with pytest.raises(ConnectError) as missing:
        await as_b.unary("GetConversation", nowhere)
    # Another tenant's id answers as an id nobody has (the message names the id asked for).
    assert other.value.code == missing.value.code == Code.NOT_FOUND
    assert other.value.message == missing.value.message.replace("nowhere-at-all", "alice-only")
    assert "tenant-a" not in other.value.message
    mine = await as_a.unary("GetConversation", request)
    assert mine.conversation.conversation_id == "alice-only"
    listed = await as_b.unary("ListConversations", chat_service_pb2.ListConversationsRequest())
    assert "alice-only" not in [c.conversation_id for c in listed.conversations]
    # No token, or a token in a cookie (no cookie is read): UNAUTHENTICATED, before the servicer.
    for door in (
        ConnectChat(base_url(sidecar)),
        ConnectChat(base_url(sidecar), headers={"cookie": f"authorization=Bearer {TOKEN_A}"}),
    ):
        with pytest.raises(ConnectError) as refused:
            await door.unary("GetConversation", request)
        assert refused.value.code == Code.UNAUTHENTICATED
        assert error_reason(refused.value) == "TOKEN_MISSING"


async def test_cors_preflight_and_exposed_headers(sidecar: SidecarProcess) -> None:
    url = f"{base_url(sidecar)}/turnwire.v1.ChatService/Chat"
    async with httpx.AsyncClient() as http:
        preflight = await http.options(
            url,
            headers={
                "origin": ORIGIN,
                "access-control-request-method": "POST",
                "access-control-request-headers": "authorization,content-type,connect-protocol-version",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == ORIGIN
        elsewhere = await http.options(
            url, headers={"origin": "https://evil.example", "access-control-request-method": "POST"}
        )
        assert "access-control-allow-origin" not in elsewhere.headers
        answered = await http.post(
            f"{base_url(sidecar)}/turnwire.v1.ChatService/ListConversations",
            headers={
                "origin": ORIGIN,
                "content-type": "application/json",
                "authorization": f"Bearer {TOKEN_A}",
            },
            content=b"{}",
        )
        assert answered.status_code == 200
        exposed = {h.strip().lower() for h in answered.headers["access-control-expose-headers"].split(",")}
        assert {"grpc-status", "grpc-message", "grpc-status-details-bin"} <= exposed


async def test_bad_requests_say_what_to_fix(sidecar: SidecarProcess) -> None:
    url = f"{base_url(sidecar)}/turnwire.v1.ChatService/GetConversation"
    headers = {"authorization": f"Bearer {TOKEN_A}"}
    async with httpx.AsyncClient() as http:
        broken = await http.post(
            url, headers={**headers, "content-type": "application/json"}, content=b'{"conver'
        )
        assert broken.status_code == 400
        answer = broken.json()
        assert answer["code"] == "invalid_argument"
        assert answer["message"].startswith(
            "the request body is not a turnwire.v1.GetConversationRequest in JSON"
        )
        assert [detail["type"] for detail in answer["details"]] == ["google.rpc.BadRequest"]
        native = await http.post(
            url, headers={**headers, "content-type": "application/grpc"}, content=b"\0" * 5
        )
        assert native.status_code == 415 and "gRPC listener" in native.text
        unknown = await http.post(f"{base_url(sidecar)}/turnwire.v1.ChatService/Nope", content=b"{}")
        assert unknown.status_code == 404
        # The inspector page is off unless http.inspector is on (docs/inspector.md).
        assert (await http.get(f"{base_url(sidecar)}/inspector/")).status_code == 404


def handled(sidecar: SidecarProcess, method: str, code: str) -> float:
    """``grpc_server_handled_total`` of ChatService ``method`` ending ``code``, from /metrics."""
    assert sidecar.config is not None
    with urllib.request.urlopen(f"http://{sidecar.config['metrics']['listen']}/metrics", timeout=10) as page:
        text = page.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "grpc_server_handled_total"
        and sample.labels.get("grpc_method") == method
        and sample.labels.get("grpc_code") == code
    )


async def test_http_calls_count_in_the_rpc_metrics(sidecar: SidecarProcess) -> None:
    before = handled(sidecar, "ListConversations", "OK"), handled(sidecar, "GetConversation", "NotFound")
    door = ConnectChat(base_url(sidecar), token=TOKEN_B)
    await door.unary("ListConversations", chat_service_pb2.ListConversationsRequest())
    with pytest.raises(ConnectError):
        await door.unary("GetConversation", chat_service_pb2.GetConversationRequest(conversation_id="none"))
    after = handled(sidecar, "ListConversations", "OK"), handled(sidecar, "GetConversation", "NotFound")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def doc_commands() -> list[str]:
    """The ``curl`` commands of docs/http.md's "From curl" section, as written there."""
    section = DOCS.read_text().split("## From curl", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [
        command.strip()
        for block in blocks
        for command in block.split("\n\n")
        if command.strip().startswith("curl")
    ]


async def test_the_documented_curl_commands_work(sidecar: SidecarProcess) -> None:
    commands = doc_commands()
    assert len(commands) >= 3, commands
    listen = base_url(sidecar).removeprefix("http://")
    outputs = []
    for command in commands:
        line = command.replace("127.0.0.1:8080", listen).replace("$TOKEN", TOKEN_A).replace("\\\n", " ")
        done = await asyncio.to_thread(
            subprocess.run, shlex.split(line), capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, (line, done.stderr)
        outputs.append(done.stdout)
    submitted, *_, read = outputs
    assert '"accepted":true' in submitted
    assert "ROLE_ASSISTANT" in read or "ROLE_USER" in read
