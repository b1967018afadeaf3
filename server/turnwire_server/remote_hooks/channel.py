"""The channel to a remote hook server (docs/semantics.md §4, remote middleware): one per
configured entry, opened at ``configure_session`` and kept for the process's life, so no hook
call builds a channel, credentials or a connection."""

from __future__ import annotations

from typing import Any

import grpc

from turnwire_server.remote_hooks.settings import RemoteHookSettings

_RECONNECT_OPTIONS = [
    # A server that comes back is found within a second (gRPC's default backoff grows to 120 s),
    # so the breaker's half-open probe meets a live connection rather than a stale backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


def channel_for(settings: RemoteHookSettings) -> grpc.aio.Channel:
    """A channel to ``settings.address``: plaintext, or TLS with the configured files."""
    tls = settings.tls
    if tls is None:
        return grpc.aio.insecure_channel(settings.address, options=_RECONNECT_OPTIONS)
    credentials = grpc.ssl_channel_credentials(
        root_certificates=tls.ca_file.read_bytes() if tls.ca_file else None,
        private_key=tls.key_file.read_bytes() if tls.key_file else None,
        certificate_chain=tls.cert_file.read_bytes() if tls.cert_file else None,
    )
    options: list[tuple[str, Any]] = list(_RECONNECT_OPTIONS)
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.aio.secure_channel(settings.address, credentials, options=options)
