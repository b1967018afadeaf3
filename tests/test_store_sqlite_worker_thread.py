"""The SQLite store's worker thread (store/sqlite/worker_thread.py): calls run on the thread in
call order, their outcomes reach the loop, a cancelled caller does not stop its call, and
stop lets the queued calls finish first."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
from support.waiting import wait_until

from turnwire_server.store.sqlite.worker_thread import WorkerThread


async def test_calls_run_on_the_thread_in_call_order_and_answer_the_loop() -> None:
    thread = WorkerThread("test-worker")
    ran: list[tuple[int, str]] = []

    def call(i: int) -> int:
        ran.append((i, threading.current_thread().name))
        return i * 10

    try:
        futures = [thread.run(call, i) for i in range(50)]
        assert await asyncio.gather(*futures) == [i * 10 for i in range(50)]
        assert [i for i, _ in ran] == list(range(50))
        assert {name for _, name in ran} == {"test-worker"}
    finally:
        thread.stop()


async def test_what_a_call_raises_reaches_its_caller_and_the_thread_goes_on() -> None:
    thread = WorkerThread("test-worker")

    def fail() -> None:
        raise ValueError("bad row")

    try:
        with pytest.raises(ValueError, match="bad row"):
            await thread.run(fail)
        assert await thread.run(lambda: "after") == "after"
    finally:
        thread.stop()


async def test_a_cancelled_caller_leaves_its_call_running_to_the_end() -> None:
    thread = WorkerThread("test-worker")
    entered, release, finished = threading.Event(), threading.Event(), threading.Event()

    def slow() -> str:
        entered.set()
        release.wait(10)
        finished.set()
        return "done"

    try:
        future = thread.run(slow)
        await wait_until(entered.is_set, what="the call started")
        future.cancel()
        release.set()
        await wait_until(finished.is_set, what="the call finished although its caller left")
        assert await thread.run(lambda: "next") == "next"  # the late answer was dropped quietly
    finally:
        thread.stop()


async def test_stop_runs_what_was_queued_then_the_last_call(caplog: pytest.LogCaptureFixture) -> None:
    thread = WorkerThread("test-worker")
    ran: list[str] = []
    pending = [thread.run(ran.append, name) for name in ("a", "b")]

    def last() -> None:
        ran.append("last")
        raise OSError("close failed")

    with caplog.at_level(logging.WARNING, logger="turnwire_server.store.sqlite"):
        thread.stop(last)
        thread.stop()  # idempotent
        await asyncio.gather(*pending)
        await wait_until(lambda: not thread._thread.is_alive(), what="the thread ended")
    assert ran == ["a", "b", "last"]
    assert "close failed" in caplog.text
    with pytest.raises(RuntimeError, match="stopped"):  # it would never run: refused, not lost
        thread.run(ran.append, "too late")
