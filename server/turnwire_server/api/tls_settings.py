"""The ``tls:`` section of the configuration (see :mod:`turnwire_server.config`): the gRPC
server's certificate files, read by :mod:`turnwire_server.api.tls`; declared apart from it so
that reading the configuration does not import gRPC."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from turnwire_server.config_section import ConfigSection

ClientAuth = Literal["none", "require"]
"""Whether the server asks for a client certificate: ``none`` (plain TLS) or ``require`` (mutual
TLS: a certificate signed by ``tls.client_ca_file`` or no connection). grpcio's server credentials
offer only these two of gRPC core's modes (``require_client_auth``), so there is no ``request``."""


class ServerTlsSettings(ConfigSection):
    """TLS for the gRPC server (absent: plaintext). PEM files: ``cert_file`` the certificate chain
    (leaf first), ``key_file`` its unencrypted private key, ``client_ca_file`` the CAs whose client
    certificates ``client_auth: require`` accepts. The files are re-read when they change (checked
    at each new connection) and on SIGHUP; a bad replacement is logged and the old one kept.
    Their contents are checked at start (:mod:`turnwire_server.api.tls`)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth: ClientAuth = Field("none", description="none: plain TLS; require: mutual TLS")

    @model_validator(mode="after")
    def _client_ca(self) -> ServerTlsSettings:
        if self.client_auth == "require" and self.client_ca_file is None:
            raise ValueError(
                "client_auth: require needs client_ca_file (the CA that signs client certificates)"
            )
        if self.client_auth == "none" and self.client_ca_file is not None:
            raise ValueError(
                "client_ca_file is used only with client_auth: require (mutual TLS); "
                "set that or drop the file"
            )
        return self
