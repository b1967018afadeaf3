"""TLS (and mutual TLS) towards a sidecar that serves it (its ``tls:`` configuration)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import grpc

__all__ = ["TlsOptions"]


@dataclass(frozen=True)
class TlsOptions:
    """How the client does TLS. Every field is optional: ``TlsOptions()`` is TLS with the system's
    root certificates.

    Args:
        ca_file: PEM certificates to trust for the server's certificate instead of the system's
            (the CA that signed the sidecar's ``tls.cert_file``).
        cert_file: PEM client certificate chain, for a sidecar that requires one
            (``tls.client_auth: require``); give ``key_file`` with it.
        key_file: The unencrypted PEM private key of ``cert_file``.
        server_name: The name the server's certificate must carry (and the TLS SNI), when it
            differs from the target's host, e.g. ``turnwire.internal`` for ``10.0.0.5:50051``.

    Raises:
        ValueError: only one of ``cert_file`` and ``key_file`` is given.
    """

    ca_file: str | Path | None = None
    cert_file: str | Path | None = None
    key_file: str | Path | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        """Check that ``cert_file`` and ``key_file`` come together."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS): give both or neither")

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """The files read into gRPC channel credentials. Raises :class:`OSError` (naming the file)
        when one cannot be read."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file),
            private_key=_read(self.key_file),
            certificate_chain=_read(self.cert_file),
        )

    def channel_options(self) -> list[tuple[str, str]]:
        """Channel arguments: the name to verify, when ``server_name`` is set."""
        return [] if self.server_name is None else [("grpc.ssl_target_name_override", self.server_name)]


def _read(path: str | Path | None) -> bytes | None:
    return None if path is None else Path(path).read_bytes()
