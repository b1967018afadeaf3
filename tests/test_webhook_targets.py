"""Which addresses a webhook call may reach, and how a call ends (webhooks/targets.py;
docs/webhooks.md, "Which addresses a call may reach"): checked on the resolved address the
connection uses, literal addresses too; redirects not followed; answers read bounded."""

from __future__ import annotations

import ipaddress
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from pydantic import ValidationError

from turnwire_server.webhooks.settings import WebhookEndpointSettings
from turnwire_server.webhooks.targets import IpNetwork, WebhookCaller, refusal_of

LOOPBACK: list[IpNetwork] = [ipaddress.ip_network("127.0.0.0/8")]


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("93.184.216.34", None),
        ("2606:4700::1111", None),
        ("127.0.0.1", "loopback"),
        ("::1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("169.254.169.254", "link-local"),  # the cloud metadata address
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("100.64.0.1", "non-public"),  # shared address space (carrier-grade NAT)
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped: judged as its IPv4 address
    ],
)
def test_only_public_addresses_pass_by_default(address: str, reason: str | None) -> None:
    assert refusal_of(ipaddress.ip_address(address), []) == reason


def test_allowed_networks_let_their_addresses_through() -> None:
    assert refusal_of(ipaddress.ip_address("127.0.0.1"), LOOPBACK) is None
    assert refusal_of(ipaddress.ip_address("::ffff:127.0.0.1"), LOOPBACK) is None
    assert refusal_of(ipaddress.ip_address("10.0.0.1"), LOOPBACK) == "private"


@pytest.fixture
async def receiver() -> AsyncIterator[str]:
    """A server on loopback: /ok answers 204, /moved redirects to /ok, /big answers 1 MiB."""

    async def ok(_: web.Request) -> web.Response:
        return web.Response(status=204)

    async def moved(_: web.Request) -> web.Response:
        raise web.HTTPFound("/ok")

    async def big(_: web.Request) -> web.Response:
        return web.Response(body=b"x" * (1 << 20))

    app = web.Application()
    app.router.add_post("/ok", ok)
    app.router.add_post("/moved", moved)
    app.router.add_post("/big", big)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"127.0.0.1:{port}"
    await runner.cleanup()


async def _post(url: str, allowed: list[IpNetwork]) -> tuple[int | None, str | None, bool]:
    caller = WebhookCaller(allowed=allowed, timeout_seconds=5, max_response_bytes=1024, max_in_flight=2)
    caller.open()
    try:
        outcome = await caller.post(url, b"{}", {})
    finally:
        await caller.close()
    return outcome.http_status, outcome.error, outcome.refused


async def test_a_name_resolving_to_loopback_is_refused_on_its_resolved_address(receiver: str) -> None:
    port = receiver.rsplit(":", 1)[1]
    status, error, refused = await _post(f"http://localhost:{port}/ok", [])
    assert (status, refused) == (None, True)
    assert error is not None and "resolves only to" in error and "loopback" in error
    assert "127.0.0.1" not in error  # the resolved addresses are not told


async def test_a_literal_address_is_refused_and_an_allowed_one_called(receiver: str) -> None:
    status, error, refused = await _post(f"http://{receiver}/ok", [])
    assert (status, refused) == (None, True) and error is not None and "loopback" in error
    assert await _post(f"http://{receiver}/ok", LOOPBACK) == (204, None, False)


async def test_redirects_are_not_followed_and_answers_are_read_bounded(receiver: str) -> None:
    status, error, refused = await _post(f"http://{receiver}/moved", LOOPBACK)
    assert (status, refused) == (302, False) and error is not None and "not followed" in error
    assert await _post(f"http://{receiver}/big", LOOPBACK) == (200, None, False)


async def test_a_closed_port_is_a_retryable_failure() -> None:
    status, error, refused = await _post("http://127.0.0.1:9/hook", LOOPBACK)
    assert (status, refused) == (None, False) and error is not None and error.startswith("cannot connect")


LEGACY_HOSTS = ["2130706433", "127.1", "0127.0.0.1", "017700000001", "0x7f000001", "0x7f.1", "0X7F.0.0.1"]


@pytest.mark.parametrize("host", LEGACY_HOSTS)
async def test_a_number_that_is_no_dotted_quad_is_refused_not_retried(host: str) -> None:
    """aiohttp never calls these legacy IPv4 forms: the attempt is refused (no retry) and says
    how to write the address, rather than failing as InvalidUrlClientError until the retry
    period ends."""
    status, error, refused = await _post(f"http://{host}:9/hook", LOOPBACK)
    assert (status, refused) == (None, True), error
    assert error is not None and "dotted-quad" in error and host.lower() in error


@pytest.mark.parametrize("host", LEGACY_HOSTS)
def test_an_endpoint_url_with_such_a_number_is_a_configuration_error(host: str) -> None:
    with pytest.raises(ValidationError, match="dotted-quad"):
        WebhookEndpointSettings(url=f"http://{host}/hook", secret_env="SECRET")
    assert WebhookEndpointSettings(url="http://192.0.2.10/hook", secret_env="SECRET").url
