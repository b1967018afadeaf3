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
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import httpx2 as httpx
import pytest
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarProcess, running_sidecar
from support.tokens import new_token

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
