"""The check every HTTP(S) URL setting gets at start-up (provider ``base_url``, MCP ``url``,
the OTLP ``endpoint``): a bad one would otherwise surface only at the first request, as an
internal error of every turn (``OverflowError: port must be 0-65535`` from the socket layer)."""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


def check_http_url(value: str, example: str) -> str:
    """``value`` when it is an ``http``/``https`` URL with a host and a valid port (RFC 3986
    §3.2.3, digits only, 0-65535).

    Raises:
        ValueError: what is wrong and ``example``, for the configuration error's message.
    """
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{value!r} is not an http(s) URL with a host; write it like {example}")
    try:
        parts.port  # noqa: B018 - parsing it is the check
    except ValueError:
        raise ValueError(f"{value!r} has no valid port (0-65535); write it like {example}") from None
    return value


def numeric_host_problem(host: str) -> str | None:
    """What is wrong with ``host`` when it is written as a number but not as a dotted-quad IPv4
    address (every form ``inet_aton(3)`` reads: ``2130706433``, ``127.1``, ``010.0.0.1``,
    ``0x7f000001``, ``0x7f.1``), else None. The system resolver maps these legacy forms onto an
    address no check of the written host saw, and aiohttp refuses the decimal ones, so a webhook
    URL with one is refused where it is given (docs/webhooks.md), not at its first delivery."""
    if not host or not host.isascii():
        return None
    try:
        socket.inet_aton(host)
    except OSError:
        return None  # a name
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        return (
            f"host {host[:64]!r} is a number but not a dotted-quad IPv4 address; write the address "
            "as four decimal octets (192.0.2.10) or use a host name"
        )
    return None
