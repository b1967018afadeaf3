"""Why a call could not reach a sidecar, when gRPC only says "Socket closed": a TLS mismatch.

One TLS handshake of the client's own tells a plaintext connection that the sidecar wants TLS,
and a TLS connection without a client certificate that the sidecar wants one (mutual TLS). A TLS
connection to a plaintext sidecar is told from gRPC's own message (``WRONG_VERSION_NUMBER``).
Asked only after a call failed ``UNAVAILABLE`` before any answer, so a working connection never
pays for it. The explanation is written once, here: the client library says it with its own
arguments (:data:`CLIENT_FIXES`), the ``turnwire`` CLI with its options; the TypeScript
(``clients/node/src/tls_probe.ts``) and Go (``clients/go/turnwire/tls_mismatch.go``) clients say
the same sentences.
"""

from __future__ import annotations

import enum
import socket
import ssl
from dataclasses import dataclass
from typing import Literal

from turnwire_client.tls import TlsOptions

__all__ = ["CLIENT_FIXES", "TlsFixes", "TlsMismatch", "find_tls_mismatch"]

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""The HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 §3.4): a gRPC server
answers with its own SETTINGS."""

_CERTIFICATE_ALERTS = ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE")
"""The TLS alerts of a server that requires a client certificate (TLS 1.3; TLS 1.2's)."""

Outcome = Literal["no-tls", "certificate-required", "accepted", "unknown"]


@dataclass(frozen=True)
class TlsFixes:
    """How the caller says each fix, in its own terms (arguments, command-line options).

    Attributes:
        who: Who connected ("this client", "this command").
        use_tls: How to connect with TLS.
        add_certificate: How to present a client certificate.
        drop_tls: How to connect in plaintext.
    """

    who: str
    use_tls: str
    add_certificate: str
    drop_tls: str


CLIENT_FIXES = TlsFixes(
    who="this client",
    use_tls="pass tls=TlsOptions(ca_file=...) (or TlsOptions() when a public CA signed its certificate)",
    add_certificate="pass tls=TlsOptions(ca_file=..., cert_file=..., key_file=...)",
    drop_tls="leave out tls",
)
"""The fixes in the Python client's arguments."""


class TlsMismatch(enum.Enum):
    """What the sidecar wants that the connection did not give."""

    WANTS_TLS = "wants-tls"
    """A plaintext connection to a sidecar that serves TLS."""
    WANTS_CLIENT_CERTIFICATE = "wants-client-certificate"
    """A TLS connection without a client certificate to a sidecar that requires one."""
    SERVES_PLAINTEXT = "serves-plaintext"
    """A TLS connection to a plaintext sidecar."""

    def explain(self, target: str, fixes: TlsFixes = CLIENT_FIXES) -> str:
        """The sentence for ``target``: what the sidecar wants and ``fixes``' way to give it."""
        where = f"the sidecar at {target}"
        if self is TlsMismatch.WANTS_TLS:
            return f"{where} wants TLS, and {fixes.who} connected in plaintext: {fixes.use_tls}"
        if self is TlsMismatch.WANTS_CLIENT_CERTIFICATE:
            return (
                f"{where} wants a client certificate (mutual TLS), and {fixes.who} presented none: "
                f"{fixes.add_certificate}"
            )
        return f"{where} does not speak TLS (it serves plaintext): {fixes.drop_tls}"


def find_tls_mismatch(
    target: str, tls: TlsOptions | None, message: str, *, timeout_seconds: float = 3.0
) -> TlsMismatch | None:
    """The TLS mismatch that the failure ``message`` of a call to ``target`` (``HOST:PORT``),
    connected with ``tls`` (None: plaintext), comes from, or None when there is none to find
    (another target form, a connection that presented a certificate, no answer within
    ``timeout_seconds``). Blocks for at most about ``timeout_seconds`` (one connection and
    handshake); never raises."""
    if tls is not None and "WRONG_VERSION_NUMBER" in message:
        return TlsMismatch.SERVES_PLAINTEXT
    if tls is not None and tls.cert_file is not None:
        return None
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return None
    outcome = _probe(host.strip("[]"), int(port), tls, timeout_seconds)
    if tls is None and outcome in ("accepted", "certificate-required"):
        return TlsMismatch.WANTS_TLS
    if tls is not None and outcome == "certificate-required":
        return TlsMismatch.WANTS_CLIENT_CERTIFICATE
    return None


def _probe(host: str, port: int, tls: TlsOptions | None, timeout_seconds: float) -> Outcome:
    """One TLS handshake (the certificate not checked: this only asks what the server speaks),
    then the HTTP/2 preface; what the server did."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    server_name = (tls.server_name if tls is not None else None) or host
    try:
        with socket.create_connection((host, port), timeout=timeout_seconds) as raw:
            try:
                secured = context.wrap_socket(raw, server_hostname=server_name)
            except ssl.SSLError as error:
                return "certificate-required" if _certificate_alert(error) else "no-tls"
            except OSError:
                return "no-tls"
            with secured:
                secured.sendall(_H2_PREFACE)
                try:
                    answered = secured.recv(1)
                except ssl.SSLError as error:
                    return "certificate-required" if _certificate_alert(error) else "unknown"
                except (ConnectionError, ssl.SSLEOFError):
                    return "certificate-required"  # dropped right after the handshake
                return "accepted" if answered else "certificate-required"
    except OSError:  # TimeoutError included
        return "unknown"


def _certificate_alert(error: ssl.SSLError) -> bool:
    return any(alert in f"{error.reason} {error}".upper() for alert in _CERTIFICATE_ALERTS)
