"""A thread that runs blocking calls for the event loop, one at a time and in call order: the
SQLite writer's, its checkpoints' and the reader's (their connections live on it).

Why not ``loop.run_in_executor`` with a one-worker ``ThreadPoolExecutor``: a call costs the
event loop about three times the CPU there (the executor's locks and thread accounting, a
``concurrent.futures.Future`` chained to an asyncio one through callbacks): 32 to 60 µs against
12 to 18 µs for a ``queue.SimpleQueue`` and one ``call_soon_threadsafe`` back (uvloop,
``bench/thread_hops.py``; bench/ttft.md "Issue 33: the store's thread hops"). A turn makes two
such calls (its admission and its end). The reader (:mod:`.reader`) runs on one too.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

__all__ = ["WorkerThread"]

T = TypeVar("T")

_log = logging.getLogger("turnwire_server.store.sqlite")

_Call = tuple[
    Callable[..., Any], tuple[Any, ...], "asyncio.Future[Any] | None", asyncio.AbstractEventLoop | None
]


class WorkerThread:
    """One daemon thread named ``name``, started at once, running :meth:`run`'s calls in order
    until :meth:`stop`. A daemon, as a process that exits without closing its store has only
    unacknowledged writes left (as after a crash: SQLite's journal keeps the file whole)."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._stopped = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def run(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """``fn(*args)`` on the thread, after every call queued before it; the future (of the
        running loop) gets its result or what it raised. Cancelling the future does not stop
        the call (it runs all the same; its outcome is dropped), as with ``run_in_executor``.
        Raises RuntimeError after :meth:`stop` (the call would never run, its caller wait for
        ever)."""
        if self._stopped:
            raise RuntimeError(f"{self._thread.name}: the thread was stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._queue.put((fn, args, future, loop))
        return future

    def stop(self, last: Callable[[], object] | None = None) -> None:
        """Let the thread end once the calls queued so far (and then ``last``, whose outcome is
        only logged when it fails) have run. Returns at once; idempotent."""
        if self._stopped:
            return
        self._stopped = True
        if last is not None:
            self._queue.put((last, (), None, None))
        self._queue.put(None)

    def _main(self) -> None:
        while (call := self._queue.get()) is not None:
            fn, args, future, loop = call
            try:
                result = fn(*args)
            except BaseException as exc:
                if future is None or loop is None:
                    _log.warning("%s: %s failed: %r", self._thread.name, getattr(fn, "__name__", fn), exc)
                    continue
                _answer(loop, _fail, future, exc)
            else:
                if future is not None and loop is not None:
                    _answer(loop, _succeed, future, result)


def _answer(loop: asyncio.AbstractEventLoop, settle: Callable[..., None], *args: Any) -> None:
    with suppress(RuntimeError):  # the loop is closed: nobody is waiting any more
        loop.call_soon_threadsafe(settle, *args)


def _succeed(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():
        future.set_result(result)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
