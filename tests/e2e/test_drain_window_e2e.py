"""The drain window (``limits.drain_seconds``) against a real ``turnwire serve`` process.

On SIGTERM a draining replica turns its readiness off before it stops taking turns (issue 11):
the health service answers NOT_SERVING, overall and for ChatService, at once, while new calls
are still served for the window (the liveness status stays SERVING: a liveness probe restarts
nothing); then new calls are refused and the turns in flight finish within
``limits.shutdown_grace_seconds``. A second SIGTERM ends the window early.
"""

from __future__ import annotations

import signal
import socket
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.endless import endless_step
from support.sidecar import SidecarFactory, SidecarProcess, run_turnwire
from support.turn_calls import error_info
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2
from turnwire_server.api.standard_services import LIVENESS
from turnwire_server.app import SERVICE_NAME

DRAIN = 4.0
"""Seconds of drain window: long enough for a check and a whole short turn on a busy machine."""

SLOW_TURN_WORDS = 40
"""The long turn's words, one every 200 ms: about 8 s, so it outlasts the window."""

CONFIG = {
    "limits": {"drain_seconds": DRAIN, "shutdown_grace_seconds": 30},
    "providers": {
        "scripted": {
            "scripts": {
                "slow": [{"text": " ".join(["word"] * SLOW_TURN_WORDS), "delay_ms": 200}],
                # Never ends on its own: only the shutdown ends it.
                "endless": [endless_step("word ", 200)],
            }
        }
    },
}

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def health(sidecar: SidecarProcess, service: str = "") -> int | grpc.StatusCode:
    """The health service's answer for ``service`` on a new connection, or the call's error code
    (UNAVAILABLE once the listener is closed)."""
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=2
            )
        except grpc.aio.AioRpcError as error:
            return error.code()
        return int(reply.status)


async def health_is(sidecar: SidecarProcess, expected: int | grpc.StatusCode) -> bool:
    return await health(sidecar) == expected


async def test_sigterm_turns_readiness_off_then_stops_taking_turns(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    assert await health(sidecar) == SERVING
    assert await health(sidecar, LIVENESS) == SERVING
    async with TurnwireClient(sidecar.target) as client:
        in_flight = client.chat("in-flight", "hello", model="scripted:slow")
        assert (await anext(in_flight)).HasField("turn_start")
        signalled = time.monotonic()
        sidecar.send_signal(signal.SIGTERM)

        # Readiness off at once, overall and per service, while the listener still answers.
        await wait_until(lambda: health_is(sidecar, NOT_SERVING), what="health NOT_SERVING")
        assert await health(sidecar, SERVICE_NAME) == NOT_SERVING
        assert await health(sidecar, LIVENESS) == SERVING, "liveness does not restart a draining sidecar"
        # ... and a new turn is still taken and runs to its end during the window.
        during = await collect(client.chat("during-drain", "hello"))
        assert during.ok, during
        assert time.monotonic() - signalled < DRAIN, "the check and the turn ran inside the window"

        # After the window: new calls are refused.
        refused = await wait_until(
            lambda: health_is(sidecar, grpc.StatusCode.UNAVAILABLE),
            timeout=DRAIN + 10,
            what="new calls refused after the drain window",
        )
        assert refused
        assert time.monotonic() - signalled >= DRAIN, "calls were refused before the window ended"
        # The turn in flight finishes within the grace period.
        events = [event async for event in in_flight]
        assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED, sidecar.log_text()
        text = "".join(event.text_delta.delta for event in events if event.HasField("text_delta"))
        assert text.split() == ["word"] * SLOW_TURN_WORDS
    assert await sidecar.wait() == 0, sidecar.log_text()
    assert "draining: health is NOT_SERVING" in sidecar.log_text()


async def test_a_second_sigterm_ends_the_drain_window(sidecar_factory: SidecarFactory) -> None:
    long_drain = {**CONFIG, "limits": {"drain_seconds": 120, "shutdown_grace_seconds": 5}}
    sidecar = await sidecar_factory(long_drain).start()
    sidecar.send_signal(signal.SIGTERM)
    await wait_until(lambda: health_is(sidecar, NOT_SERVING), what="health NOT_SERVING")
    second = time.monotonic()
    sidecar.send_signal(signal.SIGTERM)
    assert await sidecar.wait(timeout=20) == 0, sidecar.log_text()
    assert time.monotonic() - second < 20, "the process stopped long before the 120 s window ended"


async def test_ctrl_c_skips_the_drain_window(sidecar_factory: SidecarFactory) -> None:
    """SIGINT is a person at a terminal: the stop begins at once, without a drain window."""
    long_drain = {**CONFIG, "limits": {"drain_seconds": 120, "shutdown_grace_seconds": 5}}
    sidecar = await sidecar_factory(long_drain).start()
    sidecar.send_signal(signal.SIGINT)
    assert await sidecar.wait(timeout=20) == 0, sidecar.log_text()
    assert "draining" not in sidecar.log_text()


async def test_a_second_signal_during_the_grace_cancels_the_running_turns(
    sidecar_factory: SidecarFactory,
) -> None:
    """Issue 16: a second Ctrl-C during the shutdown grace is not ignored: the running turn ends
    ABORTED at once, its partial reply stored, and the process exits 0."""
    long_grace = {**CONFIG, "limits": {"drain_seconds": 0, "shutdown_grace_seconds": 120}}
    sidecar = await sidecar_factory(long_grace).start()
    async with TurnwireClient(sidecar.target) as client:
        events = client.chat("second-signal", "go", model="scripted:endless")
        seen: list[event_pb2.TurnEvent] = []

        async def first_text() -> bool:
            seen.append(await anext(events))
            return seen[-1].WhichOneof("event") == "text_delta"

        await wait_until(first_text, timeout=30)
        sidecar.send_signal(signal.SIGINT)
        await wait_until(lambda: "shutting down" in sidecar.log_text(), what="the shutdown grace began")
        # Trial 3: the line a person waits on says how to stop waiting.
        assert (
            "shutting down: running turns have 120.0 s to finish (a second SIGINT/Ctrl-C or SIGTERM "
            "cancels them now)" in sidecar.log_text()
        )
        second = time.monotonic()
        sidecar.send_signal(signal.SIGINT)
        result = await collect(events)
    assert result.status == event_pb2.TURN_STATUS_ABORTED
    # Trial 4: the client is told it was the shutdown, not a cancel.
    end = result.events[-1].turn_end
    assert end.error.code == grpc.StatusCode.ABORTED.value[0]
    assert error_info(end.error).reason == "SHUTTING_DOWN"
    assert "the sidecar shut down before the turn finished" in end.error.message
    assert "a second signal cut the grace short" in end.error.message
    assert await sidecar.wait(timeout=30) == 0, sidecar.log_text()
    assert time.monotonic() - second < 20, "the turn ran on instead of being cancelled"
    log = sidecar.log_text()
    assert "second signal: cancelling the running turns now" in log
    # The cancel line tells the time the turn really had, not the configured 120 s grace.
    (cancelled,) = [
        line for line in log.splitlines() if "shutdown: cancelled 1 turn(s) still running" in line
    ]
    assert "(a second signal cut the grace short)" in cancelled and "after 120.0 s" not in cancelled

    # After a restart no TurnEnd is around to say why: the stored turn keeps its reason, and
    # GetConversation and `turnwire history` name it under the partial reply.
    restarted = await sidecar_factory(long_grace, workdir=sidecar.workdir).start()
    async with TurnwireClient(restarted.target) as client:
        conversation = await client.get_conversation("second-signal")
    (reply,) = conversation.partial_replies
    assert reply.status == event_pb2.TURN_STATUS_ABORTED
    assert error_info(reply.error).reason == "SHUTTING_DOWN"
    history = await run_turnwire("history", "second-signal", "--target", restarted.target)
    assert history.code == 0, history.stderr
    assert f"(partial: turn {result.events[-1].request_id} ended ABORTED: SHUTTING_DOWN)" in history.stdout


async def test_a_tool_host_that_never_answers_does_not_hold_the_stop(sidecar_factory: SidecarFactory) -> None:
    """A tool host whose port takes connections but never answers one (a hung process): the
    sidecar starts without its tools, and SIGTERM still ends the process within the deadline a
    supervisor waits (drain window + grace + 5 s, docs/operate/stopping.md), exit 0. The closes
    that end the stop are bounded by that deadline (turnwire_server/closing.py)."""
    drain, grace = 1.0, 2.0
    with socket.socket() as silent:  # listens, never accepts: connections open, nothing answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        address = f"127.0.0.1:{silent.getsockname()[1]}"
        config = {
            "limits": {"drain_seconds": drain, "shutdown_grace_seconds": grace},
            "tools": {"hosts": [{"name": "silent", "address": address, "startup_timeout_seconds": 1}]},
        }
        sidecar = await sidecar_factory(config).start()
        await wait_until(
            lambda: "tool host 'silent'" in sidecar.log_text(), what="the silent host's failed listing logged"
        )
        signalled = time.monotonic()
        sidecar.send_signal(signal.SIGTERM)
        # The process's own exit (interpreter shutdown) on a loaded machine takes a few seconds more.
        assert await sidecar.wait(timeout=drain + grace + 5 + 10) == 0, sidecar.log_text()
        took = time.monotonic() - signalled
    assert took < drain + grace + 5 + 5, f"the stop took {took:.1f} s:\n{sidecar.log_text()}"
    assert "stopped" in sidecar.log_text()
