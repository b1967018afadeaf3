"""One webhook HTTP call, guarded against server-side request forgery (docs/webhooks.md, "Which
addresses a call may reach").

The host is resolved for each attempt (no DNS cache) and every address is checked; only the
addresses that pass are handed to the connection, so the address checked is the address
connected to (a name that resolves to a public address at the check and a private one at the
connect cannot slip through: there is no second resolution). An address passes when it is
public (``ipaddress``'s ``is_global``, not multicast) or inside one of the configured
``allowed_networks``; private, loopback, link-local, unspecified, reserved and shared (CGNAT)
addresses are refused by default, IPv4-mapped IPv6 addresses as their IPv4 address. A literal IP
host is checked the same way. Redirects are never followed (a 3xx is a failed attempt); each
call is bounded by the timeout and reads at most ``max_response_bytes`` of the answer.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import ThreadedResolver

from turnwire_server.url_check import numeric_host_problem

__all__ = ["CallOutcome", "TargetRefused", "WebhookCaller", "refusal_of"]

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_USER_AGENT: Final = "turnwire-webhooks/1"


class TargetRefused(Exception):
    """The target may not be called: the message says why, without any address the operator
    did not write (it is stored with the attempt and listed to the client)."""


def refusal_of(address: IpAddress, allowed: Sequence[IpNetwork]) -> str | None:
    """Why ``address`` may not be connected to (``"loopback"``, ``"private"`` …), or None when it
    may: public, or inside one of ``allowed``."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in allowed if network.version == address.version):
        return None
    for kind, flag in (
        ("unspecified", address.is_unspecified),
        ("loopback", address.is_loopback),
        ("link-local", address.is_link_local),
        ("multicast", address.is_multicast),
        ("private", address.is_private),
        ("reserved", address.is_reserved),
    ):
        if flag:
            return kind
    return None if address.is_global else "non-public"


class _CheckedResolver(AbstractResolver):
    """Resolves as aiohttp does, then keeps only the addresses :func:`refusal_of` passes."""

    def __init__(self, allowed: Sequence[IpNetwork]) -> None:
        self._inner = ThreadedResolver()
        self._allowed = tuple(allowed)

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        passed, refused = [], set()
        for result in found:
            reason = refusal_of(ipaddress.ip_address(result["host"].split("%", 1)[0]), self._allowed)
            if reason is None:
                passed.append(result)
            else:
                refused.add(reason)
        if not passed:
            raise TargetRefused(
                f"the target's host resolves only to {' and '.join(sorted(refused))} addresses, which "
                "webhooks do not call unless webhooks.allowed_networks includes them"
            )
        return passed

    async def close(self) -> None:
        await self._inner.close()


@dataclass(frozen=True, slots=True)
class CallOutcome:
    """How a call ended: the HTTP status (None without an answer) and, unless it was a 2xx, why
    it failed. ``refused``: the target may not be called at all (retrying cannot help)."""

    http_status: int | None
    error: str | None
    refused: bool = False

    @property
    def delivered(self) -> bool:
        """A 2xx answer (Standard Webhooks: any 2xx is success)."""
        return self.http_status is not None and 200 <= self.http_status < 300


class WebhookCaller:
    """POSTs webhook bodies. ``allowed``: the non-public networks that may be reached;
    ``timeout_seconds`` bounds a whole call (connect, send, answer); ``max_response_bytes``
    bounds what is read of an answer (the rest is dropped with the connection); ``max_in_flight``
    bounds open connections. Open with :meth:`open` in the event loop, close with :meth:`close`.
    """

    def __init__(
        self,
        *,
        allowed: Sequence[IpNetwork],
        timeout_seconds: float,
        max_response_bytes: int,
        max_in_flight: int,
    ) -> None:
        self._allowed = tuple(allowed)
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._max_response_bytes = max_response_bytes
        self._max_in_flight = max_in_flight
        self._session: aiohttp.ClientSession | None = None

    def open(self) -> None:
        """Create the HTTP session (in the running event loop)."""
        connector = aiohttp.TCPConnector(
            resolver=_CheckedResolver(self._allowed),
            use_dns_cache=False,  # every attempt resolves and checks anew
            limit=self._max_in_flight,
            force_close=True,  # a kept-alive connection would skip the next attempt's check
        )
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, headers={"User-Agent": _USER_AGENT}
        )

    async def close(self) -> None:
        """Close the session (open calls fail)."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def check_literal(self, url: str) -> None:
        """Raise :class:`TargetRefused` when ``url``'s host is an IP address that may not be
        called (a literal address never reaches the resolver), or a number that is not one
        (:func:`numeric_host_problem`)."""
        host = urlsplit(url).hostname or ""
        if (problem := numeric_host_problem(host)) is not None:
            raise TargetRefused(f"the target's {problem}")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return  # a name: checked by the resolver, on the addresses connected to
        reason = refusal_of(address, self._allowed)
        if reason is not None:
            raise TargetRefused(
                f"the target's host is a {reason} address, which webhooks do not call unless "
                "webhooks.allowed_networks includes it"
            )

    async def post(self, url: str, body: bytes, headers: dict[str, str]) -> CallOutcome:
        """POST ``body`` to ``url`` once. Never raises for the call's own failures: they are the
        outcome (refused target, timeout, connection error, non-2xx answer)."""
        if self._session is None:
            raise RuntimeError("WebhookCaller.open() was not called")
        try:
            self.check_literal(url)
            async with self._session.post(
                url,
                data=body,
                headers={"Content-Type": "application/json", **headers},
                allow_redirects=False,
            ) as response:
                await response.content.read(self._max_response_bytes)  # bounded; the rest is dropped
                status = response.status
        except TargetRefused as refused:
            return CallOutcome(None, str(refused), refused=True)
        except aiohttp.ClientConnectorError as error:
            if isinstance(error.os_error, TargetRefused):
                return CallOutcome(None, str(error.os_error), refused=True)
            return CallOutcome(
                None, f"cannot connect: {error.os_error.strerror or type(error.os_error).__name__}"
            )
        except TimeoutError:
            return CallOutcome(None, f"no answer within {self._timeout.total:g} s")
        except aiohttp.ClientError as error:
            return CallOutcome(None, f"call failed: {type(error).__name__}")
        if 200 <= status < 300:
            return CallOutcome(status, None)
        if 300 <= status < 400:
            return CallOutcome(status, f"HTTP {status}: redirects are not followed")
        return CallOutcome(status, f"HTTP {status}")
