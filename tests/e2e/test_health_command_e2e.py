"""``turnwire health`` and ``turnwire --version``, run as commands against real sidecar processes.

``turnwire health`` is what the Docker ``HEALTHCHECK`` (and scripts) run: one word on stdout,
exit status 0 only for SERVING, 1 for everything else (Docker reserves 2).
"""

from __future__ import annotations

import asyncio
import signal
import socket
from importlib.metadata import version

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from support.sidecar import SidecarFactory, free_port, run_turnwire
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2
from turnwire_server.health_check import check_health

CHAT_SERVICE = "turnwire.v1.ChatService"

SLOW_TURN_CONFIG = {
    # The turn streams for about 10 s after SIGTERM, well within its grace: it must outlast
    # starting the `turnwire health` process (seconds on a loaded machine), then complete.
    "limits": {"shutdown_grace_seconds": 30},
    "providers": {"scripted": {"scripts": {"slow": [{"text": "word " * 25, "delay_ms": 400}]}}},
}


async def test_version_prints_the_installed_package_version() -> None:
    run = await run_turnwire("--version")
    assert (run.code, run.stdout) == (0, f"turnwire {version('turnwire')}\n"), run.stderr


@pytest.mark.parametrize("service", ["", CHAT_SERVICE])
async def test_a_serving_sidecar_is_serving(sidecar_factory: SidecarFactory, service: str) -> None:
    sidecar = await sidecar_factory().start()
    run = await run_turnwire("health", "--target", sidecar.target, "--service", service)
    assert (run.code, run.stdout, run.stderr) == (0, "SERVING\n", "")


async def test_the_target_comes_from_turnwire_target(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory().start()
    run = await run_turnwire("health", env={"TURNWIRE_TARGET": sidecar.target})
    assert (run.code, run.stdout) == (0, "SERVING\n"), run.stderr


async def test_an_unknown_service_is_not_healthy(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory().start()
    run = await run_turnwire("health", "--target", sidecar.target, "--service", "no.such.Service")
    assert (run.code, run.stdout) == (1, "SERVICE_UNKNOWN\n")
    assert f"{sidecar.target}: the health service does not know service 'no.such.Service'" in run.stderr


async def test_an_unreachable_target_names_the_target() -> None:
    target = f"127.0.0.1:{free_port()}"  # nothing listens there
    run = await run_turnwire("health", "--target", target, "--timeout", "2")
    assert (run.code, run.stdout) == (1, "unreachable\n")
    # Said as it happened: refused at once, not "within 2 s" (a fresh-user trial).
    assert run.stderr.startswith(
        f"turnwire: cannot reach {target}: the connection was refused at once "
        "(is the sidecar running and listening there?) (UNAVAILABLE:"
    ), run.stderr
    assert "within" not in run.stderr


async def test_a_target_that_never_answers_says_no_answer_within_the_timeout() -> None:
    with socket.socket() as silent:  # accepts connections (the kernel's backlog), never speaks
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        target = f"127.0.0.1:{silent.getsockname()[1]}"
        answer = await asyncio.to_thread(check_health, target, timeout=1)
    assert answer.status == "unreachable"
    assert answer.detail.startswith(
        f"cannot reach {target}: no answer within 1 s (--timeout) (DEADLINE_EXCEEDED"
    ), answer.detail


async def test_a_draining_sidecar_is_not_healthy_while_its_turn_finishes(
    sidecar_factory: SidecarFactory,
) -> None:
    """On SIGTERM health turns NOT_SERVING and gRPC stops taking calls at once (app.py), so a new
    check sees a refused connection ("unreachable"; NOT_SERVING only in the instant between),
    while the running turn still completes within its grace."""
    sidecar = await sidecar_factory(SLOW_TURN_CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        turn = client.chat("draining", "hello", model="scripted:slow")
        assert (await anext(turn)).HasField("turn_start")
        rest = asyncio.ensure_future(collect(turn))
        sidecar.send_signal(signal.SIGTERM)
        await wait_until(lambda: "shutting down" in sidecar.log_text(), timeout=10, what="drain started")

        run = await run_turnwire("health", "--target", sidecar.target, "--timeout", "2")
        assert not rest.done(), "the turn ended before the check: nothing was draining"
        assert run.code == 1
        assert run.stdout in ("unreachable\n", "NOT_SERVING\n"), run.stdout
        assert sidecar.target in run.stderr

        result = await rest
        assert result.status == event_pb2.TURN_STATUS_COMPLETED, sidecar.log_text()
    assert await sidecar.wait() == 0, sidecar.log_text()


@pytest.mark.parametrize(
    ("status", "word"),
    [
        (health_pb2.HealthCheckResponse.NOT_SERVING, "NOT_SERVING"),
        (health_pb2.HealthCheckResponse.UNKNOWN, "UNKNOWN"),
    ],
)
async def test_check_health_reports_a_status_other_than_serving(status: int, word: str) -> None:
    """The statuses a sidecar never answers a new call with (see the draining test), from a plain
    health server."""
    server = grpc.aio.server()
    servicer = health_aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await servicer.set("", status)
        answer = await asyncio.to_thread(check_health, f"127.0.0.1:{port}")
    finally:
        await server.stop(None)
    assert (answer.status, answer.exit_code) == (word, 1)
    assert answer.detail == f"127.0.0.1:{port}: the server is {word}"


async def test_check_health_of_a_server_without_a_health_service_is_an_error() -> None:
    server = grpc.aio.server()
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        answer = await asyncio.to_thread(check_health, f"127.0.0.1:{port}")
    finally:
        await server.stop(None)
    assert (answer.status, answer.exit_code) == ("error", 1)
    assert answer.detail.startswith(f"127.0.0.1:{port}: health check of the server failed (UNIMPLEMENTED")
