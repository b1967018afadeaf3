"""The ``http:`` section of the configuration (see :mod:`turnwire_server.config`): the HTTP
listener that serves ChatService over the Connect protocol and gRPC-Web (and the doors built on it,
docs/http.md). Declared apart from :mod:`turnwire_server.http.server` so that reading the
configuration imports neither uvicorn nor connectrpc."""

from __future__ import annotations

import ipaddress

from pydantic import Field, field_validator, model_validator

from turnwire_server.config_section import ConfigSection
from turnwire_server.listen_check import host_port

PROTOCOL_REQUEST_HEADERS: tuple[str, ...] = (
    "authorization",
    "content-type",
    "connect-protocol-version",
    "connect-timeout-ms",
    "connect-accept-encoding",
    "connect-content-encoding",
    "grpc-timeout",
    "grpc-accept-encoding",
    "x-grpc-web",
    "x-user-agent",
    "traceparent",
    "tracestate",
    "turnwire-disconnect-policy",
    "turnwire-event-batches",
    "turnwire-parent-request-id",
)
"""Request headers a browser may send cross-origin (CORS ``Access-Control-Allow-Headers``): the
Connect and gRPC-Web protocol headers (connectrpc.com/docs/cors), the bearer token, the W3C trace
context and the metadata the ChatService reads."""

PROTOCOL_RESPONSE_HEADERS: tuple[str, ...] = (
    "grpc-status",
    "grpc-message",
    "grpc-status-details-bin",
    "connect-content-encoding",
    "connect-accept-encoding",
    "content-encoding",
)
"""Response headers a browser script may read (``Access-Control-Expose-Headers``): what gRPC-Web's
trailers-only responses and Connect's streams carry (connectrpc.com/docs/cors)."""


class CorsSettings(ConfigSection):
    """Cross-origin access for browser pages served from another origin (docs/http.md#browsers).

    ``allow_origins`` empty (the default): no CORS header is sent, so only same-origin pages and
    non-browser clients (curl, servers) can call. Authentication is a bearer token in the
    ``authorization`` header, never a cookie, so a cross-site page cannot ride on a user's
    session (no CSRF surface); ``allow_credentials`` only lets a page send the header-less
    credentials a browser holds (TLS client certificates), and is refused with ``*``."""

    allow_origins: list[str] = Field(
        default_factory=list,
        description='origins allowed to call, e.g. "https://app.example.com"; "*" any origin',
    )
    allow_credentials: bool = Field(False, description="let browsers send TLS client certificates")
    allow_headers: list[str] = Field(
        default_factory=list, description="request headers allowed besides the protocol's own"
    )
    expose_headers: list[str] = Field(
        default_factory=list, description="response headers exposed besides the protocol's own"
    )
    max_age_seconds: int = Field(7200, ge=0, le=86400, description="how long a preflight answer is cached")

    @model_validator(mode="after")
    def _no_wildcard_with_credentials(self) -> CorsSettings:
        if self.allow_credentials and "*" in self.allow_origins:
            raise ValueError(
                'allow_credentials needs the origins named: browsers refuse "*" with credentials'
            )
        return self


class HttpSettings(ConfigSection):
    """The HTTP listener (absent ``listen``: off). It serves every ChatService RPC over the
    Connect protocol (JSON and binary, unary and server-streaming, HTTP/1.1) and gRPC-Web, plus
    ``GET /healthz``, with the gRPC listener's ``tls:`` files, ``auth:`` tokens, rate limits,
    call gate, metrics, traces and logs (docs/http.md)."""

    listen: str | None = Field(
        None, description="HOST:PORT of the HTTP listener (Connect, gRPC-Web); unset: off"
    )
    cors: CorsSettings = Field(default_factory=CorsSettings)
    inspector: bool = Field(
        False,
        description="serve the read-only inspector page at /inspector/ (docs/inspector.md); needs listen",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses or networks (CIDR) of the reverse proxies in front of the listener whose "
        "X-Forwarded-For and X-Forwarded-Proto are believed; empty: none, the client is the "
        "connection's peer",
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        return None if value is None else host_port(value, "127.0.0.1:8080")

    @field_validator("trusted_proxies")
    @classmethod
    def _addresses(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"{entry!r} is not an IP address or network: name each proxy by its address "
                    '("10.0.0.7", "2001:db8::7") or a network ("10.0.0.0/8")'
                ) from None
        return value


__all__ = ["PROTOCOL_REQUEST_HEADERS", "PROTOCOL_RESPONSE_HEADERS", "CorsSettings", "HttpSettings"]
