"""Hostile input on the HTTP listener, against a real ``turnwire serve`` with ``auth:`` on and
every door: what a caller without a token, or with malformed input, can make the sidecar hold or
store.

- A caller without a valid token is refused before its request body is read, on every door that
  takes one (Connect unary and streaming, gRPC-Web, the OpenAI, AG-UI and AI SDK doors), as over
  gRPC (docs/operate/authentication.md). Before, every door read up to 16 MiB first: eight such
  requests at once raised the sidecar's peak memory by 110-160 MB.
- A request head (request line and headers) past 64 KiB is refused 431 and its connection
  closed (docs/api/http.md#errors). Before, a header of any size was held: three 100 MB headers
  took the sidecar from 110 to 485 MB.
- JSON nested deeper than 32 levels is refused ``INVALID_ARGUMENT`` / 400 naming the field, and
  nothing is stored (docs/security.md). Before, the AG-UI, AI SDK and Chat Completions doors
  answered 500, and over Connect a submission or schedule nested 40-48 levels deep was stored and
  then answered ``INTERNAL`` to every read, ``ListSchedules`` included.
- A caller that leaves mid-body makes one log line without a traceback (before: an ERROR line
  with Starlette's traceback per request).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx2 as httpx
import pytest
from google.protobuf import struct_pb2
from google.rpc import error_details_pb2, status_pb2
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import new_token
from support.waiting import wait_until

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2

TOKEN = new_token()
SCRIPTS = {"echo": [{"text": "answered"}]}
ANSWER_WITHIN = 20.0
"""Seconds a refusal may take to arrive; a door that waits for the 15 MB body never answers."""


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    workdir = tmp_path_factory.mktemp("http-hostile-e2e")
    config = http_sidecar_config(workdir, {TOKEN: ("alice", "tenant-a")}, SCRIPTS, inspector=True)
    with running_sidecar(workdir, config) as process:
        yield process


def address(sidecar: SidecarProcess) -> tuple[str, int]:
    host, _, port = http_base(sidecar).removeprefix("http://").rpartition(":")
    return host, int(port)


async def answer_to_head(sidecar: SidecarProcess, head: bytes, body: bytes, marker: bytes) -> bytes:
    """What the listener answers to ``head`` and the start ``body`` of a larger body, read until
    ``marker`` shows (or the connection closes), within :data:`ANSWER_WITHIN` seconds."""
    reader, writer = await asyncio.open_connection(*address(sidecar))
    received = b""

    async def until_marker() -> None:
        nonlocal received
        with contextlib.suppress(ConnectionError):  # the listener closed the connection
            while marker not in received:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                received += chunk

    try:
        with contextlib.suppress(ConnectionError):  # closed before it was all sent
            writer.write(head + body)
            await writer.drain()
        await asyncio.wait_for(until_marker(), ANSWER_WITHIN)
    finally:
        writer.close()
    return received


# (path, content type, the answer's status line, a marker of the refusal in the answer)
DOORS = [
    ("/turnwire.v1.ChatService/GetConversation", "application/json", b"401", b'"unauthenticated"'),
    ("/turnwire.v1.ChatService/SubmitMessages", "application/proto", b"401", b'"unauthenticated"'),
    ("/turnwire.v1.ChatService/Chat", "application/connect+json", b"200", b'"unauthenticated"'),
    ("/turnwire.v1.ChatService/Chat", "application/grpc-web+proto", b"200", b"grpc-status: 16"),
    ("/v1/responses", "application/json", b"401", b"token_missing"),
    ("/v1/chat/completions", "application/json", b"401", b"token_missing"),
    ("/v1/ag-ui", "application/json", b"401", b"token_missing"),
    ("/v1/ai-sdk/chat", "application/json", b"401", b"needs a bearer token"),
]


@pytest.mark.parametrize(("path", "content_type", "status", "marker"), DOORS)
async def test_a_caller_without_a_token_is_refused_before_its_body_is_read(
    sidecar: SidecarProcess, path: str, content_type: str, status: bytes, marker: bytes
) -> None:
    head = (
        f"POST {path} HTTP/1.1\r\nhost: turnwire\r\naccept: */*\r\ncontent-type: {content_type}\r\n"
        "content-length: 15000000\r\n\r\n"
    ).encode()
    # 1 KiB of a 15 MB body: the refusal must come without the rest.
    answer = await answer_to_head(sidecar, head, b"{" + b" " * 1024, marker)
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]
    assert marker in answer, answer[-400:]


async def test_a_wrong_token_is_refused_before_the_body_too(sidecar: SidecarProcess) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: turnwire\r\ncontent-type: application/json\r\n"
        b"authorization: Bearer not-a-token-of-this-server\r\ncontent-length: 15000000\r\n\r\n"
    )
    answer = await answer_to_head(sidecar, head, b"{" + b" " * 1024, b"token_invalid")
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


async def answer_while_sending(sidecar: SidecarProcess, request: bytes) -> bytes:
    """The listener's whole answer (to its end of file) to ``request``, after which the caller
    goes on sending 1 MiB, a piece at a time, each after the last went out: a reset instead of
    reading and dropping it (which can discard the answer unread, RFC 9112 §9.6) fails the
    writes."""
    reader, writer = await asyncio.open_connection(*address(sidecar))
    try:
        writer.write(request)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), ANSWER_WITHIN)
        for _ in range(16):
            writer.write(b"a" * (64 << 10))
            await writer.drain()
            await asyncio.sleep(0)
    finally:
        writer.close()
    return answer


async def test_a_refused_caller_still_sending_reads_the_whole_answer_and_is_not_reset(
    sidecar: SidecarProcess,
) -> None:
    # A head past the bound, then the caller keeps sending (as a client still writing its
    # request does): closed at once, the listener's kernel resets the connection at the next
    # segment.
    head = b"GET /healthz HTTP/1.1\r\nhost: turnwire\r\nx-padding: " + b"a" * (80 << 10)
    answer = await answer_while_sending(sidecar, head)
    assert answer.startswith(b"HTTP/1.1 431") and answer.endswith(b"bytes)\n"), answer[:200]


async def test_a_request_that_does_not_parse_gets_its_400_whole_while_the_caller_sends(
    sidecar: SidecarProcess,
) -> None:
    request = b"GET /healthz HTTP/1.1\r\nhost turnwire\r\n\r\n" + b"a" * (256 << 10)
    answer = await answer_while_sending(sidecar, request)
    assert answer.startswith(b"HTTP/1.1 400") and b"Invalid HTTP request" in answer, answer[:200]


async def test_a_request_head_past_64_kib_is_refused_431(sidecar: SidecarProcess) -> None:
    for path in ("/healthz", "/inspector/", "/v1/responses/resp-1"):
        head = f"GET {path} HTTP/1.1\r\nhost: turnwire\r\nx-padding: ".encode()
        answer = await answer_to_head(sidecar, head, b"a" * (2 << 20), b"\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
    # Heads within the bound, and bodies of any size up to the message limit, are served, on
    # one connection one request after another.
    async with httpx.AsyncClient(base_url=http_base(sidecar), timeout=30) as client:
        for _ in range(3):
            listed = await client.post(
                "/turnwire.v1.ChatService/ListConversations",
                content=json.dumps({"pageSize": 1, "padding": "x" * 300_000}),
                headers={"authorization": f"Bearer {TOKEN}", "content-type": "application/json"},
            )
            assert listed.status_code == 200, listed.text
            health = await client.get("/healthz", headers={"x-padding": "y" * 16_000})
            assert health.status_code == 200, health.text


def nested(levels: int) -> Any:
    """A JSON object ``levels`` objects deep."""
    value: Any = 1
    for _ in range(levels):
        value = {"a": value}
    return value


def submit_body(conversation: str, body: Any, submission: str = "") -> dict[str, Any]:
    """A SubmitMessagesRequest in JSON (a schedule's input without ``submission``)."""
    request = {
        "conversationId": conversation,
        "messages": [{"parts": [{"text": {"text": "hi"}}]}],
        "body": body,
    }
    return request | ({"submissionId": submission} if submission else {})


def bad_request_fields(answer: httpx.Response) -> list[str]:
    """The fields of the BadRequest detail of a Connect error body."""
    fields: list[str] = []
    for detail in answer.json().get("details", []):
        if detail["type"] == "google.rpc.BadRequest":
            raw = detail["value"]
            bad = error_details_pb2.BadRequest.FromString(base64.b64decode(raw + "=" * (-len(raw) % 4)))
            fields += [violation.field for violation in bad.field_violations]
    return fields


async def test_json_nested_past_32_levels_is_refused_and_nothing_is_stored(sidecar: SidecarProcess) -> None:
    headers = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
    rpc = "/turnwire.v1.ChatService/"
    async with httpx.AsyncClient(base_url=http_base(sidecar), timeout=30) as client:
        for levels in (33, 40, 48):
            submitted = await client.post(
                rpc + "SubmitMessages",
                json=submit_body(f"conv-{levels}", nested(levels), f"deep-{levels}"),
                headers=headers,
            )
            assert submitted.status_code == 400, submitted.text
            assert "more than 32 levels deep" in submitted.json()["message"]
            assert bad_request_fields(submitted) == ["body"]
            read = await client.post(
                rpc + "GetSubmission", json={"submissionId": f"deep-{levels}"}, headers=headers
            )
            assert read.status_code == 404, read.text
            schedule = {
                "scheduleId": f"deep-{levels}",
                "schedule": {"cron": "0 0 1 1 *", "input": submit_body(f"fire-{levels}", nested(levels))},
            }
            created = await client.post(rpc + "CreateSchedule", json=schedule, headers=headers)
            assert created.status_code == 400, created.text
            assert bad_request_fields(created) == ["schedule.input.body"]
        listed = await client.post(rpc + "ListSchedules", json={}, headers=headers)
        assert listed.status_code == 200 and listed.json() == {}, listed.text

        # 32 levels are taken, stored and read back.
        accepted = await client.post(
            rpc + "SubmitMessages", json=submit_body("conv-32", nested(32), "deep-32"), headers=headers
        )
        assert accepted.status_code == 200, accepted.text
        read = await client.post(rpc + "GetSubmission", json={"submissionId": "deep-32"}, headers=headers)
        assert read.status_code == 200, read.text
        schedule = {
            "scheduleId": "deep-32",
            "schedule": {"cron": "0 0 1 1 *", "input": submit_body("f32", nested(32))},
        }
        created = await client.post(rpc + "CreateSchedule", json=schedule, headers=headers)
        assert created.status_code == 200, created.text
        listed = await client.post(rpc + "ListSchedules", json={}, headers=headers)
        assert [s["scheduleId"] for s in listed.json()["schedules"]] == ["deep-32"], listed.text

        # The JSON doors refuse a body nested deeper than 32 levels with their own 400.
        turn = [{"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}]
        doors: list[tuple[str, dict[str, Any], dict[str, str]]] = [
            ("/v1/responses", {"input": "hi", "text": nested(32)}, {}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "metadata": nested(32)},
                {},
            ),
            (
                "/v1/ag-ui",
                {
                    "threadId": "deep-thread",
                    "runId": "deep-run",
                    "messages": [{"id": "m1", "role": "user", "content": "hi"}],
                    "tools": [],
                    "context": [],
                    "state": nested(40),
                    "forwardedProps": {},
                },
                {"accept": "text/event-stream"},
            ),
            ("/v1/ai-sdk/chat", {"id": "deep-chat", "messages": turn, "extra": nested(40)}, {}),
        ]
        for path, body, more in doors:
            answer = await client.post(path, json=body, headers={**headers, **more})
            assert answer.status_code == 400, (path, answer.status_code, answer.text)
            assert "more than 32 levels deep" in answer.text, (path, answer.text)
        # One level less is a turn like any other.
        fine = await client.post(
            "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "hi"}], "metadata": nested(31)},
            headers=headers,
        )
        assert fine.status_code == 200, fine.text


def struct_of(levels: int) -> struct_pb2.Struct:
    """A Struct whose JSON nests ``levels`` objects deep (the Struct itself is the first)."""
    struct = struct_pb2.Struct()
    struct.update(nested(levels))
    return struct


async def test_grpc_refuses_json_nested_past_32_levels(sidecar: SidecarProcess) -> None:
    metadata = (("authorization", f"Bearer {TOKEN}"),)
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        message = message_pb2.Message(
            parts=[message_pb2.Part(text=message_pb2.TextPart(text="hi"))], metadata=struct_of(33)
        )
        call = stub.Chat(
            chat_service_pb2.ChatRequest(conversation_id="grpc-deep", message=message), metadata=metadata
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            async for _ in call:
                pass
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
        assert raised.value.details().startswith("message.metadata: nests JSON"), raised.value.details()
        trailer = dict(raised.value.trailing_metadata() or ())["grpc-status-details-bin"]
        status = status_pb2.Status.FromString(trailer)
        assert any(detail.Is(error_details_pb2.BadRequest.DESCRIPTOR) for detail in status.details)
        with pytest.raises(grpc.aio.AioRpcError) as missing:
            await stub.GetConversation(
                chat_service_pb2.GetConversationRequest(conversation_id="grpc-deep"), metadata=metadata
            )
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND


async def test_a_caller_that_leaves_mid_body_makes_one_line_and_no_traceback(tmp_path: Path) -> None:
    """A caller that closes the connection before its whole body made an ERROR line with a
    Starlette traceback on the OpenAI, AG-UI and AI SDK doors, one per request; now an INFO
    line at most every 10 s (the rest at DEBUG), naming the route and how much arrived."""
    config = http_sidecar_config(tmp_path, {TOKEN: ("alice", "tenant-a")}, SCRIPTS)
    config["logging"] = {"level": "debug"}
    with running_sidecar(tmp_path, config) as process:
        paths = ("/v1/responses", "/v1/chat/completions", "/v1/ag-ui", "/v1/ai-sdk/chat")
        for path in paths:
            _reader, writer = await asyncio.open_connection(*address(process))
            writer.write(
                f"POST {path} HTTP/1.1\r\nhost: turnwire\r\naccept: text/event-stream\r\n"
                f"authorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\n"
                "content-length: 1000\r\n\r\n{".encode()
            )
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        def reported() -> list[str]:
            return [
                line
                for line in process.log_text().splitlines()
                if "the client closed the connection after 1 bytes of its body" in line
            ]

        await wait_until(lambda: len(reported()) == len(paths), what="a line for each of the 4 callers")
        lines = reported()
        assert {path for path in paths if any(f"POST {path}:" in line for line in lines)} == set(paths)
        assert "Traceback" not in process.log_text()
        assert "Exception in ASGI application" not in process.log_text()
