"""A door call's peer is named as gRPC names one (``context.peer()``), so log lines read alike
whichever way a call came: ``ipv4:HOST:PORT``, ``ipv6:[HOST]:PORT``; before, the HTTP doors wrote
``ipv4:`` before an IPv6 client's address too (``ipv4:::1:5555``)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.requests import Request

from turnwire_server.http.calls import peer_of
from turnwire_server.http.connect_door import _call_info
from turnwire_server.http.door_requests import call_info


@pytest.mark.parametrize(
    ("client", "peer"),
    [
        (("127.0.0.1", 5555), "ipv4:127.0.0.1:5555"),
        (("::1", 5555), "ipv6:[::1]:5555"),
        (("2001:db8::7", 443), "ipv6:[2001:db8::7]:443"),
        (None, "unknown"),  # a unix socket's client
    ],
)
def test_an_http_doors_peer_is_named_as_grpc_names_it(client: Any, peer: str) -> None:
    request = Request({"type": "http", "method": "POST", "path": "/", "headers": [], "client": client})
    assert call_info(request).peer == peer


class _Context:
    """What the Connect door reads of connectrpc's RequestContext."""

    def __init__(self, address: str | None) -> None:
        self.client_address = address  # connectrpc's "HOST:PORT", an IPv6 host unbracketed
        self.timeout_ms = None
        self.request_headers = _Headers()


class _Headers:
    def allitems(self) -> list[tuple[str, str]]:
        return []


@pytest.mark.parametrize(
    ("address", "peer"),
    [("127.0.0.1:5555", "ipv4:127.0.0.1:5555"), ("::1:5555", "ipv6:[::1]:5555"), (None, "unknown")],
)
def test_a_connect_calls_peer_is_named_as_grpc_names_it(address: str | None, peer: str) -> None:
    assert _call_info(_Context(address)).peer == peer  # type: ignore[arg-type]


def test_peer_of_without_a_host_is_unknown() -> None:
    assert peer_of("", 0) == "unknown"
