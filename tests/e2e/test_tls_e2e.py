"""TLS and mutual TLS on a real ``turnwire serve`` process, with certificates made by the test
(trustme): who connects and who is refused, the client and the CLI over TLS, reflection (v1 and
v1alpha) over TLS with buf curl, and the reload of renewed files (SIGHUP, and a file change)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.buf_curl import list_services
from support.sidecar import SidecarFactory, SidecarProcess, run_turnwire, running_sidecar
from support.waiting import wait_until

from turnwire_client import (
    SyncTurnwireClient,
    TlsMismatchError,
    TlsOptions,
    TurnwireClient,
    TurnwireError,
    collect,
)
from turnwire_client.tls_mismatch import TlsMismatch
from turnwire_client.v1 import event_pb2


@dataclass(frozen=True)
class Leaf:
    """A certificate chain and its key, as PEM files."""

    cert_file: Path
    key_file: Path


def write_ca(ca: trustme.CA, path: Path) -> Path:
    """``ca``'s certificate as a PEM file at ``path``."""
    path.write_bytes(ca.cert_pem.bytes())
    return path


def write_leaf(cert: trustme.LeafCert, directory: Path, stem: str) -> Leaf:
    """``cert``'s chain (leaf first) and key as ``stem.crt`` and ``stem.key`` in ``directory``."""
    leaf = Leaf(directory / f"{stem}.crt", directory / f"{stem}.key")
    leaf.cert_file.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    leaf.key_file.write_bytes(cert.private_key_pem.bytes())
    return leaf


def server_leaf(ca: trustme.CA, directory: Path, stem: str = "server") -> Leaf:
    """A server certificate of ``ca`` for 127.0.0.1 and localhost."""
    return write_leaf(ca.issue_cert("127.0.0.1", "localhost"), directory, stem)


async def health_code(target: str, tls: TlsOptions | None) -> grpc.StatusCode:
    """One health Check on a new channel (so a new handshake): OK when it answered SERVING,
    else the call's status code."""
    if tls is None:
        channel = grpc.aio.insecure_channel(target)
    else:
        channel = grpc.aio.secure_channel(target, tls.channel_credentials(), options=tls.channel_options())
    async with channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    return grpc.StatusCode.OK


async def chat_status(target: str, tls: TlsOptions | None, conversation: str) -> int:
    """The TurnEnd status of one scripted chat turn."""
    async with TurnwireClient(target, tls=tls) as client:
        result = await collect(client.chat(conversation, "Hello over TLS", timeout=30))
    return result.status


# -- TLS (no client certificate) ------------------------------------------------------------


@dataclass(frozen=True)
class TlsServer:
    sidecar: SidecarProcess
    ca_file: Path
    directory: Path


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsServer]:
    directory = tmp_path_factory.mktemp("tls-e2e")
    ca = trustme.CA()
    ca_file = write_ca(ca, directory / "ca.pem")
    leaf = server_leaf(ca, directory)
    config = {"tls": {"cert_file": str(leaf.cert_file), "key_file": str(leaf.key_file)}}
    with running_sidecar(directory, config, tls=TlsOptions(ca_file=ca_file)) as sidecar:
        yield TlsServer(sidecar, ca_file, directory)


async def test_a_client_trusting_the_ca_chats_over_tls(tls_server: TlsServer) -> None:
    status = await chat_status(tls_server.sidecar.target, TlsOptions(ca_file=tls_server.ca_file), "tls-1")
    assert status == event_pb2.TURN_STATUS_COMPLETED
    assert "listening on 127.0.0.1" in tls_server.sidecar.log_text()
    assert ", TLS (store" in tls_server.sidecar.log_text()


async def test_a_plaintext_client_is_refused(tls_server: TlsServer) -> None:
    assert await health_code(tls_server.sidecar.target, None) == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(TurnwireError) as raised:
        await chat_status(tls_server.sidecar.target, None, "tls-plaintext")
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_client_that_does_not_trust_the_servers_ca_is_refused(tls_server: TlsServer) -> None:
    other_ca = write_ca(trustme.CA(), tls_server.directory / "other-ca.pem")
    code = await health_code(tls_server.sidecar.target, TlsOptions(ca_file=other_ca))
    assert code == grpc.StatusCode.UNAVAILABLE


async def test_the_server_name_option_checks_the_name_in_the_certificate(tls_server: TlsServer) -> None:
    target = tls_server.sidecar.target
    named = TlsOptions(ca_file=tls_server.ca_file, server_name="localhost")
    assert await health_code(target, named) == grpc.StatusCode.OK
    wrong = TlsOptions(ca_file=tls_server.ca_file, server_name="someone-else.example")
    assert await health_code(target, wrong) == grpc.StatusCode.UNAVAILABLE


async def test_cli_health_and_chat_over_tls(tls_server: TlsServer) -> None:
    target = tls_server.sidecar.target
    health = await run_turnwire("health", "--target", target, "--tls-ca", str(tls_server.ca_file))
    assert (health.code, health.stdout.strip()) == (0, "SERVING"), health.stderr
    # The environment variables are the flags' equivalents.
    chat = await run_turnwire(
        "chat",
        "cli-tls",
        "Hello",
        env={"TURNWIRE_TARGET": target, "TURNWIRE_TLS_CA": str(tls_server.ca_file)},
    )
    assert chat.code == 0, chat.stdout + chat.stderr
    assert "COMPLETED" in chat.stdout
    history = await run_turnwire(
        "history", "cli-tls", "--target", target, "--tls-ca", str(tls_server.ca_file)
    )
    assert history.code == 0, history.stderr
    assert "Hello" in history.stdout
    listing = await run_turnwire("conversations", "--target", target, "--tls-ca", str(tls_server.ca_file))
    assert listing.code == 0, listing.stderr
    assert "cli-tls" in listing.stdout
    # Reached over TLS: "no such turn" (1), not "cannot reach" (3).
    cancel = await run_turnwire(
        "cancel", "no-such-turn", "--target", target, "--tls-ca", str(tls_server.ca_file)
    )
    assert cancel.code == 1, cancel.stdout + cancel.stderr
    plaintext = await run_turnwire("conversations", "--target", target)
    assert plaintext.code == 3, plaintext.stdout


async def test_cli_health_without_tls_reports_unreachable(tls_server: TlsServer) -> None:
    health = await run_turnwire("health", "--target", tls_server.sidecar.target, "--timeout", "3")
    assert (health.code, health.stdout.strip()) == (1, "unreachable")


@pytest.mark.parametrize("protocol", ["grpc-v1", "grpc-v1alpha"])
async def test_reflection_over_tls_with_buf_curl(tls_server: TlsServer, protocol: str) -> None:
    url = f"https://{tls_server.sidecar.target}"
    services = await list_services(url, protocol, "--cacert", str(tls_server.ca_file))
    assert services == [
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
        "grpc.reflection.v1alpha.ServerReflection",
        "turnwire.v1.ChatService",
    ]


# -- mutual TLS -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MtlsServer:
    sidecar: SidecarProcess
    ca_file: Path
    client: Leaf
    directory: Path


@pytest.fixture(scope="module")
def mtls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsServer]:
    directory = tmp_path_factory.mktemp("mtls-e2e")
    server_ca, client_ca = trustme.CA(), trustme.CA()
    ca_file = write_ca(server_ca, directory / "ca.pem")
    leaf = server_leaf(server_ca, directory)
    client = write_leaf(client_ca.issue_cert("app@example.com"), directory, "client")
    config = {
        "tls": {
            "cert_file": str(leaf.cert_file),
            "key_file": str(leaf.key_file),
            "client_ca_file": str(write_ca(client_ca, directory / "client-ca.pem")),
            "client_auth": "require",
        }
    }
    tls = TlsOptions(ca_file=ca_file, cert_file=client.cert_file, key_file=client.key_file)
    with running_sidecar(directory, config, tls=tls) as sidecar:
        yield MtlsServer(sidecar, ca_file, client, directory)


async def test_mtls_a_client_with_a_certificate_of_the_client_ca_chats(mtls_server: MtlsServer) -> None:
    tls = TlsOptions(
        ca_file=mtls_server.ca_file,
        cert_file=mtls_server.client.cert_file,
        key_file=mtls_server.client.key_file,
    )
    assert await chat_status(mtls_server.sidecar.target, tls, "mtls-1") == event_pb2.TURN_STATUS_COMPLETED
    assert ", mutual TLS (store" in mtls_server.sidecar.log_text()


async def test_mtls_a_client_without_a_certificate_is_refused(mtls_server: MtlsServer) -> None:
    code = await health_code(mtls_server.sidecar.target, TlsOptions(ca_file=mtls_server.ca_file))
    assert code == grpc.StatusCode.UNAVAILABLE
    with pytest.raises(TurnwireError) as raised:
        await chat_status(mtls_server.sidecar.target, TlsOptions(ca_file=mtls_server.ca_file), "mtls-nocert")
    assert raised.value.code == grpc.StatusCode.UNAVAILABLE


async def test_mtls_a_client_certificate_of_another_ca_is_refused(mtls_server: MtlsServer) -> None:
    stranger = write_leaf(trustme.CA().issue_cert("app@example.com"), mtls_server.directory, "stranger")
    tls = TlsOptions(ca_file=mtls_server.ca_file, cert_file=stranger.cert_file, key_file=stranger.key_file)
    assert await health_code(mtls_server.sidecar.target, tls) == grpc.StatusCode.UNAVAILABLE


async def test_mtls_cli_health_with_a_client_certificate(mtls_server: MtlsServer) -> None:
    target = mtls_server.sidecar.target
    ca = str(mtls_server.ca_file)
    refused = await run_turnwire("health", "--target", target, "--tls-ca", ca, "--timeout", "3")
    assert (refused.code, refused.stdout.strip()) == (1, "unreachable")
    health = await run_turnwire(
        "health",
        "--target",
        target,
        "--tls-ca",
        ca,
        "--tls-cert",
        str(mtls_server.client.cert_file),
        "--tls-key",
        str(mtls_server.client.key_file),
    )
    assert (health.code, health.stdout.strip()) == (0, "SERVING"), health.stderr


async def test_mtls_reflection_with_buf_curl(mtls_server: MtlsServer) -> None:
    flags = ("--cacert", str(mtls_server.ca_file), "--cert", str(mtls_server.client.cert_file))
    url = f"https://{mtls_server.sidecar.target}"
    services = await list_services(url, "grpc-v1", *flags, "--key", str(mtls_server.client.key_file))
    assert "turnwire.v1.ChatService" in services


# -- reload ---------------------------------------------------------------------------------


def replace_files(leaf: Leaf, new: Leaf) -> None:
    """Put ``new``'s files in ``leaf``'s place the way a renewal does: each written beside, then
    renamed over the old one (atomic per file)."""
    for source, target in ((new.cert_file, leaf.cert_file), (new.key_file, leaf.key_file)):
        os.replace(source, target)


@pytest.mark.parametrize("trigger", ["sighup", "file change"])
async def test_renewed_files_from_a_new_ca_are_served_after_a_reload(
    sidecar_factory: SidecarFactory, tmp_path: Path, trigger: str
) -> None:
    old_ca, new_ca = trustme.CA(), trustme.CA()
    old_ca_file = write_ca(old_ca, tmp_path / "old-ca.pem")
    new_ca_file = write_ca(new_ca, tmp_path / "new-ca.pem")
    leaf = server_leaf(old_ca, tmp_path)
    config = {"tls": {"cert_file": str(leaf.cert_file), "key_file": str(leaf.key_file)}}
    sidecar = await sidecar_factory(config=config, tls=TlsOptions(ca_file=old_ca_file)).start()
    trusts_new = TlsOptions(ca_file=new_ca_file)
    assert await health_code(sidecar.target, trusts_new) == grpc.StatusCode.UNAVAILABLE

    replace_files(leaf, server_leaf(new_ca, tmp_path, "renewed"))
    if trigger == "sighup":
        # No connection until the reload is logged: it is the signal's, not a handshake's.
        sidecar.send_signal(signal.SIGHUP)
        await wait_until(
            lambda: "TLS files reloaded (SIGHUP)" in sidecar.log_text(), timeout=10, what="the SIGHUP reload"
        )

    async def new_ca_accepted() -> bool:
        return bool(await health_code(sidecar.target, trusts_new) == grpc.StatusCode.OK)

    await wait_until(
        new_ca_accepted, timeout=20, interval=0.2, what="a client trusting only the new CA connects"
    )
    assert await health_code(sidecar.target, TlsOptions(ca_file=old_ca_file)) == grpc.StatusCode.UNAVAILABLE
    assert "TLS files reloaded" in sidecar.log_text()
    assert await chat_status(sidecar.target, trusts_new, "after-reload") == event_pb2.TURN_STATUS_COMPLETED
    assert await sidecar.terminate() == 0


async def test_a_bad_replacement_is_logged_and_the_files_in_use_stay(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca_file = write_ca(ca, tmp_path / "ca.pem")
    leaf = server_leaf(ca, tmp_path)
    config = {"tls": {"cert_file": str(leaf.cert_file), "key_file": str(leaf.key_file)}}
    sidecar = await sidecar_factory(config=config, tls=TlsOptions(ca_file=ca_file)).start()

    # A renewal caught half way: the new certificate, the old key.
    os.replace(server_leaf(trustme.CA(), tmp_path, "half").cert_file, leaf.cert_file)
    sidecar.send_signal(signal.SIGHUP)
    await wait_until(
        lambda: "TLS files not reloaded" in sidecar.log_text(), timeout=10, what="the rejected reload logged"
    )
    assert "is not the private key of the certificate" in sidecar.log_text()
    assert await health_code(sidecar.target, TlsOptions(ca_file=ca_file)) == grpc.StatusCode.OK
    assert sidecar.returncode is None


# -- bad configuration ----------------------------------------------------------------------


async def test_a_missing_key_file_fails_the_start_naming_the_file(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    leaf = server_leaf(trustme.CA(), tmp_path)
    missing = tmp_path / "nowhere.key"
    sidecar = sidecar_factory(config={"tls": {"cert_file": str(leaf.cert_file), "key_file": str(missing)}})
    with pytest.raises(Exception, match="exited with code 1"):
        await sidecar.start()
    assert f"cannot start: tls.key_file {missing}: no such file" in sidecar.log_text()
    assert not sidecar.db_path.exists()  # checked before the store is touched


async def test_mutual_tls_without_a_client_ca_is_a_configuration_error(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    leaf = server_leaf(trustme.CA(), tmp_path)
    config = {
        "tls": {"cert_file": str(leaf.cert_file), "key_file": str(leaf.key_file), "client_auth": "require"}
    }
    sidecar = sidecar_factory(config=config)
    with pytest.raises(Exception, match="exited with code 2"):
        await sidecar.start()
    assert "client_auth: require needs client_ca_file" in sidecar.log_text()


async def test_cli_says_which_side_of_a_tls_mismatch_it_is_on(
    tls_server: TlsServer, mtls_server: MtlsServer, sidecar_factory: SidecarFactory
) -> None:
    """Issue 32 item 17: each mismatch printed "cannot reach the sidecar … is `turnwire serve`
    running? (… Socket closed)" (or a TLS error and a gRPC C-core log line): it now says what the
    sidecar wants and which options give it."""
    plaintext = await run_turnwire("conversations", "--target", tls_server.sidecar.target)
    assert plaintext.code == 3, plaintext
    assert "wants TLS, and this command connected in plaintext: pass --tls-ca CA_FILE" in plaintext.stderr
    assert "is `turnwire serve` running?" not in plaintext.stderr

    ca = str(mtls_server.ca_file)
    no_certificate = await run_turnwire(
        "conversations", "--target", mtls_server.sidecar.target, "--tls-ca", ca
    )
    assert no_certificate.code == 3, no_certificate
    assert "wants a client certificate (mutual TLS)" in no_certificate.stderr, no_certificate.stderr
    assert "pass --tls-cert CERT_FILE --tls-key KEY_FILE" in no_certificate.stderr

    plain = await sidecar_factory().start()
    tls_to_plain = await run_turnwire("chat", "c", "hi", "--target", plain.target, "--tls-ca", ca)
    assert tls_to_plain.code == 3, tls_to_plain
    assert "does not speak TLS (it serves plaintext): leave out --tls" in tls_to_plain.stderr
    assert "ssl_transport_security" not in tls_to_plain.stderr  # no C-core log line


async def test_the_client_library_says_which_side_of_a_tls_mismatch_it_is_on(
    tls_server: TlsServer, mtls_server: MtlsServer, sidecar_factory: SidecarFactory
) -> None:
    """Issue 32 item 17, the Python client: each mismatch raised ``UNAVAILABLE`` "Socket closed"
    (or a raw TLS error); it is now a :class:`TlsMismatchError` saying what the sidecar wants and
    which argument gives it, from a stream and a unary call, async and sync alike."""
    plain = await sidecar_factory().start()
    ca = TlsOptions(ca_file=mtls_server.ca_file)
    cases = [
        (
            tls_server.sidecar.target,
            None,
            TlsMismatch.WANTS_TLS,
            "wants TLS, and this client connected in plaintext: pass tls=TlsOptions(",
        ),
        (
            mtls_server.sidecar.target,
            ca,
            TlsMismatch.WANTS_CLIENT_CERTIFICATE,
            "wants a client certificate (mutual TLS), and this client presented none: "
            "pass tls=TlsOptions(ca_file=..., cert_file=..., key_file=...)",
        ),
        (
            plain.target,
            ca,
            TlsMismatch.SERVES_PLAINTEXT,
            "does not speak TLS (it serves plaintext): leave out tls",
        ),
    ]
    for target, tls, mismatch, words in cases:
        async with TurnwireClient(target, tls=tls) as client:
            with pytest.raises(TlsMismatchError) as streamed:
                await collect(client.chat("tls-mismatch", "hello", timeout=10))
            with pytest.raises(TlsMismatchError) as unary:
                await client.list_conversations(timeout=10)
        with SyncTurnwireClient(target, tls=tls) as sync_client, pytest.raises(TlsMismatchError) as synced:
            sync_client.chat("tls-mismatch", "hello", timeout=10).collect()
        for raised in (streamed, unary, synced):
            error = raised.value
            assert (error.code, error.mismatch) == (grpc.StatusCode.UNAVAILABLE, mismatch), error
            assert words in error.message, error.message
            assert error.message.startswith(f"the sidecar at {target} "), error.message
