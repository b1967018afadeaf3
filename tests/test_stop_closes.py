"""The closes at the end of a stop never hold it (docs/operate/stopping.md).

A tool host's close (``RemoteToolHost.aclose``) stops its watcher on the first cancel, even one
that lands as one of its waits ends (a flapping connection: a host that never answers,
reconnecting), which ``asyncio.wait_for`` of Python 3.11 swallows; and
:func:`turnwire_server.closing.close_within` cancels and logs any close that outlives the stop's
deadline, even one that ignores the cancel. The real process: tests/e2e/test_drain_window_e2e.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from turnwire_server.closing import CLOSE_FLOOR_SECONDS, close_within
from turnwire_server.tools.grpc_host import RemoteToolHost
from turnwire_server.tools.settings import ToolHostSettings

ROUNDS = 50
"""Closes tried: a cancel landing at every point of the watcher's cycle, many times over."""


class _FlappingChannel:
    """A channel that never connects and whose state changes at once whenever watched (a
    reconnecting channel, in fast motion): every wait of the watcher ends a moment after it began."""

    def __init__(self) -> None:
        self.closed = False
        self.broken = False  # set: every wait fails, which ends even a watcher that missed its cancel

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return grpc.ChannelConnectivity.CONNECTING

    async def wait_for_state_change(self, last_observed_state: Any) -> None:
        await asyncio.sleep(0)
        if self.broken:
            raise RuntimeError("the test is over")

    async def close(self, grace: float | None = None) -> None:
        self.closed = True


async def test_a_watched_host_closes_on_the_first_try_whenever_the_cancel_lands() -> None:
    settings = ToolHostSettings(name="never-answers", address="127.0.0.1:1")
    for round_ in range(ROUNDS):
        host = RemoteToolHost(settings, default_timeout_seconds=5, on_change=lambda: None)
        await host._channel.close()
        channel = host._channel = _FlappingChannel()
        watcher = host._watcher = asyncio.create_task(host._watch())
        for _ in range(round_ % 7):  # the cancel lands at another point of the watcher's cycle
            await asyncio.sleep(0)
        closing = asyncio.create_task(host.aclose())
        try:
            done, _ = await asyncio.wait({closing}, timeout=5)
            assert closing in done, f"round {round_}: aclose still waits for the watcher after 5 s"
            assert channel.closed
        finally:
            channel.broken = True  # a watcher left running (the failure) ends, so the test does
            await asyncio.gather(watcher, closing, return_exceptions=True)


async def test_a_close_past_the_deadline_is_cancelled_and_logged_and_the_others_end(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    closed: list[str] = []

    async def store() -> None:
        closed.append("store")

    async def stuck() -> None:  # ignores every cancel: only the test's end stops it
        while not closed.count("test over"):
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue

    async def failing() -> None:
        raise ConnectionError("reset by peer")

    started = loop.time()
    closes = [("the store", store), ("tool host 'stuck'", stuck), ("tool host 'broken'", failing)]
    late = await close_within(closes, deadline=started + 1.0)
    took = loop.time() - started
    closed.append("test over")
    assert late == ["tool host 'stuck'"] and closed[0] == "store"
    assert 1.0 <= took < 5, took
    text = caplog.text
    assert "closing tool host 'stuck' did not end within 1.0 s" in text
    assert "closing tool host 'broken' failed: ConnectionError: reset by peer" in text


async def test_a_deadline_already_passed_still_gives_the_closes_the_floor() -> None:
    loop = asyncio.get_running_loop()
    done: list[bool] = []

    async def slow() -> None:
        await asyncio.sleep(CLOSE_FLOOR_SECONDS / 2)
        done.append(True)

    assert await close_within([("slow", slow)], deadline=loop.time() - 10) == []
    assert done == [True]
