"""What the HTTP listener shares with the gRPC one (docs/api/http.md#one-service-two-listeners),
against real ``turnwire serve`` processes: the call gate's slots, the drain window and shutdown
(SIGTERM), and mutual TLS with the ``tls:`` files.

Before issue 35 the sidecar had no HTTP listener: every test here fails to connect.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from pathlib import Path

import httpx2 as httpx
import pytest
import trustme
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from support.connect_calls import ConnectChat, detail_types, error_reason
from support.endless import endless_step
from support.sidecar import SidecarFactory, SidecarProcess, free_port
from support.waiting import wait_until

from turnwire_client import TlsOptions, TurnwireClient
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

SLOW = {
    "providers": {"scripted": {"scripts": {"slow": [endless_step("".join(f"w{i} " for i in range(50)), 40)]}}}
}


def with_http(config: dict[str, object], **http: object) -> dict[str, object]:
    return {**config, "http": {"listen": f"127.0.0.1:{free_port()}", **http}}


def url(sidecar: SidecarProcess, scheme: str = "http") -> str:
    assert sidecar.config is not None
    return f"{scheme}://{sidecar.config['http']['listen']}"


def chat_request(conversation: str) -> chat_service_pb2.ChatRequest:
    return chat_service_pb2.ChatRequest(
        conversation_id=conversation,
        model="scripted:slow",
        message=message_pb2.Message(parts=[message_pb2.Part(text=message_pb2.TextPart(text="go"))]),
    )


async def test_the_call_gate_counts_calls_of_both_listeners(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(with_http({**SLOW, "limits": {"max_concurrent_rpcs": 1}})).start()
    door = ConnectChat(url(sidecar))
    async with TurnwireClient(sidecar.target) as client:
        stream = client.chat("gate-grpc", "go", model="scripted:slow")
        assert (await anext(stream)).HasField("turn_start")  # holds the only slot
        with pytest.raises(ConnectError) as refused:
            async for _ in door.stream("Chat", chat_request("gate-http")):
                pass
        assert refused.value.code == Code.RESOURCE_EXHAUSTED
        assert error_reason(refused.value) == "OVERLOADED"
        assert "google.rpc.RetryInfo" in detail_types(refused.value)
        await stream.aclose()


async def test_sigterm_drains_then_ends_http_streams(sidecar_factory: SidecarFactory) -> None:
    config = with_http({**SLOW, "limits": {"drain_seconds": 3, "shutdown_grace_seconds": 0.5}})
    sidecar = await sidecar_factory(config).start()
    door = ConnectChat(url(sidecar))
    events: list[event_pb2.TurnEvent] = []

    async def read() -> None:
        async for response in door.stream("Chat", chat_request("drained")):
            events.append(response.event)

    reader = asyncio.create_task(read())
    async with httpx.AsyncClient(base_url=url(sidecar)) as http:
        assert (await http.get("/healthz")).status_code == 200
        await wait_until(lambda: len(events) >= 2, timeout=30, what="the HTTP stream started")
        sidecar.send_signal(signal.SIGTERM)

        async def not_serving() -> bool:
            return (await http.get("/healthz")).status_code == 503

        await wait_until(not_serving, timeout=10, what="/healthz said 503 in the drain window")
        # The drain window still takes calls, on this listener too.
        listed = await door.unary("ListConversations", chat_service_pb2.ListConversationsRequest())
        assert [c.conversation_id for c in listed.conversations] == ["drained"]
    await asyncio.wait_for(reader, 30)
    end = events[-1].turn_end
    assert end.status == event_pb2.TURN_STATUS_ABORTED, events[-1]
    assert await sidecar.wait() == 0


async def test_mutual_tls_on_the_http_listener(sidecar_factory: SidecarFactory, tmp_path: Path) -> None:
    ca = trustme.CA()
    (tmp_path / "ca.pem").write_bytes(ca.cert_pem.bytes())
    server = ca.issue_cert("127.0.0.1", "localhost")
    (tmp_path / "server.pem").write_bytes(b"".join(blob.bytes() for blob in server.cert_chain_pems))
    (tmp_path / "server.key").write_bytes(server.private_key_pem.bytes())
    tls = {
        "cert_file": str(tmp_path / "server.pem"),
        "key_file": str(tmp_path / "server.key"),
        "client_ca_file": str(tmp_path / "ca.pem"),
        "client_auth": "require",
    }
    client_cert = ca.issue_cert("client@example")
    cert_file, key_file = _write(tmp_path, "client", client_cert)
    options = TlsOptions(ca_file=tmp_path / "ca.pem", cert_file=cert_file, key_file=key_file)
    sidecar = await sidecar_factory(with_http({"tls": tls}), tls=options).start()
    trusting = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    anonymous = httpx.AsyncClient(verify=trusting)
    with pytest.raises(httpx.TransportError):  # no client certificate: no handshake
        await anonymous.get(f"{url(sidecar, 'https')}/healthz")
    await anonymous.aclose()
    client_cert.configure_cert(trusting)
    async with httpx.AsyncClient(verify=trusting) as http:
        answered = await http.post(
            f"{url(sidecar, 'https')}/turnwire.v1.ChatService/ListConversations",
            headers={"content-type": "application/json"},
            content=b"{}",
        )
    assert answered.status_code == 200 and answered.json() == {}
    async with httpx.AsyncClient() as plain:  # plaintext HTTP to a TLS listener
        with pytest.raises(httpx.TransportError):
            await plain.get(f"{url(sidecar)}/healthz")


def _write(directory: Path, stem: str, cert: trustme.LeafCert) -> tuple[Path, Path]:
    cert_file, key_file = directory / f"{stem}.pem", directory / f"{stem}.key"
    cert_file.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    key_file.write_bytes(cert.private_key_pem.bytes())
    return cert_file, key_file
