"""The server's ``tls:`` files: what a bad file says at start, and when the reload fetcher hands
gRPC core a new configuration (tests/e2e/test_tls_e2e.py runs it all through real processes)."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import grpc
import pytest
import trustme
from cryptography.hazmat.primitives import serialization
from pydantic import ValidationError
from typer.testing import CliRunner

from turnwire_client import TlsOptions, TurnwireClient
from turnwire_server.api.tls import ServerTls, TlsFileError, load_tls_files
from turnwire_server.api.tls_settings import ServerTlsSettings
from turnwire_server.cli import app


def issue(ca: trustme.CA, directory: Path, stem: str = "server") -> ServerTlsSettings:
    """A server certificate of ``ca`` written to ``directory``; the settings naming its files."""
    cert = ca.issue_cert("127.0.0.1")
    cert_file, key_file = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_file.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    key_file.write_bytes(cert.private_key_pem.bytes())
    return ServerTlsSettings(cert_file=cert_file, key_file=key_file)


@pytest.fixture
def settings(tmp_path: Path) -> ServerTlsSettings:
    return issue(trustme.CA(), tmp_path)


def test_good_files_load(settings: ServerTlsSettings, tmp_path: Path) -> None:
    files = load_tls_files(settings)
    assert files.certificate_chain.startswith(b"-----BEGIN CERTIFICATE-----")
    assert files.client_ca is None
    ca_file = tmp_path / "client-ca.pem"
    ca_file.write_bytes(trustme.CA().cert_pem.bytes())
    mutual = settings.model_copy(update={"client_ca_file": ca_file, "client_auth": "require"})
    assert load_tls_files(mutual).client_ca == ca_file.read_bytes()


def test_a_missing_file_is_named(settings: ServerTlsSettings, tmp_path: Path) -> None:
    missing = tmp_path / "missing.crt"
    with pytest.raises(TlsFileError, match=rf"^tls.cert_file {missing}: no such file"):
        load_tls_files(settings.model_copy(update={"cert_file": missing}))


def test_a_directory_is_not_a_file(settings: ServerTlsSettings, tmp_path: Path) -> None:
    with pytest.raises(TlsFileError, match=rf"^tls.key_file {tmp_path} is a directory"):
        load_tls_files(settings.model_copy(update={"key_file": tmp_path}))


def test_an_unreadable_file_says_why(settings: ServerTlsSettings) -> None:
    beyond = settings.key_file / "key.pem"  # a file as a directory: an OSError other than not found
    with pytest.raises(TlsFileError, match=r"cannot read it \(Not a directory\); make it readable"):
        load_tls_files(settings.model_copy(update={"key_file": beyond}))


def test_a_key_of_another_certificate_is_refused(settings: ServerTlsSettings, tmp_path: Path) -> None:
    other = issue(trustme.CA(), tmp_path, "other")
    with pytest.raises(TlsFileError) as raised:
        load_tls_files(settings.model_copy(update={"key_file": other.key_file}))
    assert str(raised.value) == (
        f"tls.key_file {other.key_file} is not the private key of the certificate in tls.cert_file "
        f"{settings.cert_file}; give the key the certificate was issued for"
    )


def test_an_encrypted_key_is_refused_without_a_prompt(settings: ServerTlsSettings) -> None:
    key = serialization.load_pem_private_key(settings.key_file.read_bytes(), password=None)
    settings.key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(TlsFileError, match="the private key is encrypted; gRPC needs it unencrypted"):
        load_tls_files(settings)


@pytest.mark.parametrize("field", ["cert_file", "client_ca_file"])
def test_a_file_without_certificates_is_refused(
    settings: ServerTlsSettings, tmp_path: Path, field: str
) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    update: dict[str, object] = {field: junk}
    if field == "client_ca_file":
        update["client_auth"] = "require"
    with pytest.raises(TlsFileError, match=rf"^tls.{field} {junk}: no PEM certificate in it"):
        load_tls_files(settings.model_copy(update=update))


def test_a_key_file_that_is_no_key_is_refused(settings: ServerTlsSettings) -> None:
    settings.key_file.write_bytes(settings.cert_file.read_bytes())
    with pytest.raises(TlsFileError, match=rf"^tls.key_file {settings.key_file}: not a PEM private key"):
        load_tls_files(settings)


def test_client_auth_and_client_ca_file_go_together(settings: ServerTlsSettings) -> None:
    files = {"cert_file": settings.cert_file, "key_file": settings.key_file}
    with pytest.raises(ValidationError, match="client_auth: require needs client_ca_file"):
        ServerTlsSettings(**files, client_auth="require")
    with pytest.raises(ValidationError, match="client_ca_file is used only with client_auth: require"):
        ServerTlsSettings(**files, client_ca_file=settings.cert_file)


def replace_with(settings: ServerTlsSettings, new: ServerTlsSettings) -> None:
    os.replace(new.cert_file, settings.cert_file)
    os.replace(new.key_file, settings.key_file)


def test_the_fetcher_hands_over_changed_files_once(settings: ServerTlsSettings, tmp_path: Path) -> None:
    tls = ServerTls(settings)
    assert tls._fetch() is None  # unchanged: gRPC keeps what it has
    replace_with(settings, issue(trustme.CA(), tmp_path, "renewed"))
    assert isinstance(tls._fetch(), grpc.ServerCertificateConfiguration)
    assert tls._fetch() is None


def test_a_bad_change_is_logged_once_and_retried_when_it_changes_again(
    settings: ServerTlsSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tls = ServerTls(settings)
    renewed = issue(trustme.CA(), tmp_path, "renewed")
    os.replace(renewed.cert_file, settings.cert_file)  # the key not yet
    with caplog.at_level(logging.ERROR, logger="turnwire.tls"):
        assert tls._fetch() is None
        assert tls._fetch() is None
    assert len(caplog.records) == 1
    assert "TLS files not reloaded (the files changed), still serving the previous ones" in caplog.text
    os.replace(renewed.key_file, settings.key_file)
    assert isinstance(tls._fetch(), grpc.ServerCertificateConfiguration)


def test_reload_rereads_unchanged_files(settings: ServerTlsSettings) -> None:
    tls = ServerTls(settings)
    assert tls.reload() is True
    assert isinstance(tls._fetch(), grpc.ServerCertificateConfiguration)
    settings.key_file.write_text("garbage")
    assert tls.reload() is False


def test_client_tls_options_need_cert_and_key_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cert_file and key_file go together"):
        TlsOptions(cert_file=tmp_path / "client.crt")
    assert TlsOptions(server_name="turnwire.internal").channel_options() == [
        ("grpc.ssl_target_name_override", "turnwire.internal")
    ]


async def test_the_client_takes_tls_or_a_channel_not_both() -> None:
    channel = grpc.aio.insecure_channel("127.0.0.1:1")
    try:
        with pytest.raises(ValueError, match="not with channel"):
            TurnwireClient("127.0.0.1:1", channel=channel, tls=TlsOptions())
    finally:
        await channel.close()


def test_cli_tls_cert_without_key_is_a_usage_error(settings: ServerTlsSettings) -> None:
    result = CliRunner().invoke(app, ["health", "--tls-cert", str(settings.cert_file)])
    assert result.exit_code == 2
    assert "--tls-cert and --tls-key go together" in result.output


def test_cli_tls_file_must_exist(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["health", "--tls-ca", str(tmp_path / "missing.pem")])
    assert result.exit_code == 2
    assert "--tls-ca" in result.output
