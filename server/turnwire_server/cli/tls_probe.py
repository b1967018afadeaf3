"""Why a client command could not reach a sidecar, when gRPC only says "Socket closed": one TLS
handshake of the CLI's own tells a plaintext connection that the sidecar wants TLS, and a TLS
connection without a client certificate that the sidecar wants one (mutual TLS). A TLS
connection to a plaintext sidecar is told from gRPC's own message (``WRONG_VERSION_NUMBER``).

Asked only after a call failed without reaching the sidecar, so a working command never pays
for it. The TypeScript client does the same (``clients/node/src/tls_probe.ts``).
"""

from __future__ import annotations

import socket
import ssl
from typing import Literal

from turnwire_client import TlsOptions

__all__ = ["explain_tls_mismatch"]

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
"""The HTTP/2 connection preface and an empty SETTINGS frame (RFC 9113 §3.4): a gRPC server
answers with its own SETTINGS."""

_CERTIFICATE_ALERTS = ("CERTIFICATE_REQUIRED", "HANDSHAKE_FAILURE", "BAD_CERTIFICATE")
"""The TLS alerts of a server that requires a client certificate (TLS 1.3; TLS 1.2's)."""

Outcome = Literal["no-tls", "certificate-required", "accepted", "unknown"]


def explain_tls_mismatch(
    target: str, tls: TlsOptions | None, message: str, *, timeout_seconds: float = 3.0
) -> str | None:
    """What the failure ``message`` of a call to ``target`` (``HOST:PORT``), connected with ``tls``
    (None: plaintext), says about a TLS mismatch: a sentence naming what the sidecar wants and the
    options that give it, or None when there is none to find (or no answer in
    ``timeout_seconds``)."""
    where = f"the sidecar at {target}"
    if tls is not None and "WRONG_VERSION_NUMBER" in message:
        return f"{where} does not speak TLS (it serves plaintext): leave out --tls and the --tls-* options"
    if tls is not None and tls.cert_file is not None:
        return None
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return None
    outcome = _probe(host.strip("[]"), int(port), tls, timeout_seconds)
    if tls is None and outcome in ("accepted", "certificate-required"):
        return (
            f"{where} wants TLS, and this command connected in plaintext: pass --tls-ca CA_FILE "
            "(or --tls when a public CA signed its certificate)"
        )
    if tls is not None and outcome == "certificate-required":
        return (
            f"{where} wants a client certificate (mutual TLS), and this command presented none: "
            "pass --tls-cert CERT_FILE --tls-key KEY_FILE"
        )
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
    except TimeoutError:
        return "unknown"
    except OSError:
        return "unknown"


def _certificate_alert(error: ssl.SSLError) -> bool:
    return any(alert in f"{error.reason} {error}".upper() for alert in _CERTIFICATE_ALERTS)
