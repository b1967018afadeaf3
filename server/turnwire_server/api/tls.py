"""TLS and mutual TLS for the gRPC server, from the ``tls:`` files, re-read when they change.

The credentials are ``grpc.dynamic_ssl_server_credentials``: gRPC core asks its certificate-config
fetcher for a new configuration at every TLS handshake. The fetcher answers from a ``stat()`` of
the files (modification time, size, inode), so a renewed certificate (cert-manager, a Kubernetes
Secret's symlink swap, a copy over the old file) serves the next connection; SIGHUP re-reads them
at once (:meth:`ServerTls.reload`). Connections already open keep their session. A replacement
that does not load (half written, key not matching) is logged and the files in use are kept.

Contents are checked with the standard library's OpenSSL binding (:mod:`ssl`), so a wrong file is
named at start; gRPC core (BoringSSL) would otherwise fail the port binding with "Failed to bind
to address", naming neither the file nor the fault.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc

from turnwire_server.api.tls_settings import ServerTlsSettings

__all__ = ["ServerTls", "TlsFileError", "load_tls_files"]

log = logging.getLogger("turnwire.tls")

_Stamp = tuple[tuple[int, int, int] | None, ...]


class TlsFileError(Exception):
    """A ``tls:`` file is missing, unreadable or wrong; the message names the setting, the file
    and what to do."""


@dataclass(frozen=True)
class TlsFiles:
    """The PEM bytes of the ``tls:`` files, checked by :func:`load_tls_files`."""

    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None

    def configuration(self) -> grpc.ServerCertificateConfiguration:
        """These files as one gRPC server certificate configuration."""
        return grpc.ssl_server_certificate_configuration(
            [(self.private_key, self.certificate_chain)], root_certificates=self.client_ca
        )


def load_tls_files(settings: ServerTlsSettings) -> TlsFiles:
    """Read and check the files: each exists and is readable; ``cert_file`` holds PEM
    certificates; ``key_file`` is an unencrypted PEM private key of the first of them;
    ``client_ca_file`` (if set) holds PEM certificates. Raises :class:`TlsFileError`."""
    chain = _read("tls.cert_file", settings.cert_file)
    key = _read("tls.key_file", settings.key_file)
    client_ca = (
        None if settings.client_ca_file is None else _read("tls.client_ca_file", settings.client_ca_file)
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _check_certificates("tls.cert_file", settings.cert_file, chain)
    if client_ca is not None:
        assert settings.client_ca_file is not None
        _check_certificates("tls.client_ca_file", settings.client_ca_file, client_ca)
    try:
        context.load_cert_chain(settings.cert_file, settings.key_file, password=_no_password)
    except _EncryptedKey:
        raise TlsFileError(
            f"tls.key_file {settings.key_file}: the private key is encrypted; gRPC needs it unencrypted "
            f"(openssl pkey -in {settings.key_file} -out key.pem), readable only by the sidecar's user"
        ) from None
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise TlsFileError(
                f"tls.key_file {settings.key_file} is not the private key of the certificate in "
                f"tls.cert_file {settings.cert_file}; give the key the certificate was issued for"
            ) from None
        raise TlsFileError(
            f"tls.key_file {settings.key_file}: not a PEM private key ({error.reason or error}); "
            "it must start with -----BEGIN PRIVATE KEY----- (or RSA/EC PRIVATE KEY)"
        ) from None
    return TlsFiles(chain, key, client_ca)


class _EncryptedKey(Exception):
    pass


def _no_password() -> str:
    # Called by OpenSSL only for an encrypted key; without it OpenSSL would prompt on the terminal.
    raise _EncryptedKey


def _read(setting: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise TlsFileError(
            f"{setting} {path}: no such file; check the path (relative: to the working directory)"
        ) from None
    except IsADirectoryError:
        raise TlsFileError(f"{setting} {path} is a directory; give the PEM file inside it") from None
    except OSError as error:
        raise TlsFileError(
            f"{setting} {path}: cannot read it ({error.strerror}); make it readable by the sidecar's user"
        ) from None


def _check_certificates(setting: str, path: Path, pem: bytes) -> None:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem.decode("ascii"))
    except (ssl.SSLError, UnicodeDecodeError):
        raise TlsFileError(
            f"{setting} {path}: no PEM certificate in it; it must hold -----BEGIN CERTIFICATE----- blocks"
        ) from None


class ServerTls:
    """The gRPC server credentials of the ``tls:`` section, re-read when the files change.

    Construct it before serving (raises :class:`TlsFileError` for bad files), bind the port with
    :meth:`server_credentials`, call :meth:`reload` on SIGHUP. Thread-safe: gRPC core calls the
    fetcher on its own threads."""

    def __init__(self, settings: ServerTlsSettings) -> None:
        """Read and check the files (see :func:`load_tls_files`)."""
        self._settings = settings
        self._paths = [
            path for path in (settings.cert_file, settings.key_file, settings.client_ca_file) if path
        ]
        self._lock = threading.Lock()
        self._stamp = self._current_stamp()
        self._initial = load_tls_files(settings).configuration()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self._rejected: _Stamp | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for ``add_secure_port``: TLS with the current files; the client must present
        a certificate signed by ``client_ca_file`` when ``client_auth`` is ``require``."""
        return grpc.dynamic_ssl_server_credentials(
            self._initial,
            self._fetch,
            require_client_authentication=self._settings.client_auth == "require",
        )

    def reload(self) -> bool:
        """Re-read the files now, changed or not (SIGHUP); the next handshake uses them. True when
        they loaded; False when they did not (logged; the files in use stay)."""
        with self._lock:
            return self._load(self._current_stamp(), reason="SIGHUP")

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # gRPC core, at every handshake: a new configuration, or None for "unchanged".
        with self._lock:
            stamp = self._current_stamp()
            if stamp not in (self._stamp, self._rejected):
                self._load(stamp, reason="the files changed")
            pending, self._pending = self._pending, None
            return pending

    def _load(self, stamp: _Stamp, *, reason: str) -> bool:
        try:
            files = load_tls_files(self._settings)
        except TlsFileError as error:
            # Once per change: a half-written file is retried when it changes again.
            self._rejected = stamp
            log.error("TLS files not reloaded (%s), still serving the previous ones: %s", reason, error)
            return False
        self._pending = files.configuration()
        self._stamp = stamp
        self._rejected = None
        log.info("TLS files reloaded (%s): %s", reason, ", ".join(map(str, self._paths)))
        return True

    def _current_stamp(self) -> _Stamp:
        stamps: list[tuple[int, int, int] | None] = []
        for path in self._paths:
            try:
                status = os.stat(path)
            except OSError:
                stamps.append(None)
            else:
                stamps.append((status.st_mtime_ns, status.st_size, status.st_ino))
        return tuple(stamps)
