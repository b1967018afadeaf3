"""The event loop a sidecar process runs on (``event_loop`` setting; issue 17, CPU per request).

``auto`` (the default) runs uvloop when it can be imported (a runtime dependency on Linux and
macOS with CPython), else asyncio's own loop; ``uvloop`` requires it; ``asyncio`` never uses it.
grpc.aio, psycopg's async pool and the SDKs' httpx/anyio run on either: they use the
running loop through asyncio's interfaces only. On the bench (bench/ttft.py, bench/README.md)
uvloop cut the sidecar's CPU per request and per streamed chunk.

The loop in use is named in the start-up log line (:func:`running_loop_name`), read from the
running loop, not from the setting.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

EventLoopChoice = Literal["auto", "uvloop", "asyncio"]

T = TypeVar("T")


class EventLoopUnavailable(RuntimeError):
    """``event_loop: uvloop`` on a system where uvloop cannot be imported."""


def run(main: Coroutine[Any, Any, T], choice: EventLoopChoice) -> T:
    """Run ``main`` to its end on a new loop of the kind ``choice`` selects (as ``asyncio.run``).

    Raises:
        EventLoopUnavailable: ``choice`` is ``uvloop`` and uvloop cannot be imported (``main``
            is closed, never run).
    """
    try:
        factory = _loop_factory(choice)
    except EventLoopUnavailable:
        main.close()
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio``: the kind of the loop running the caller."""
    module = type(asyncio.get_running_loop()).__module__
    return "uvloop" if module.partition(".")[0] == "uvloop" else "asyncio"


def _loop_factory(choice: EventLoopChoice) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for asyncio's default loop."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError as error:
        if choice == "uvloop":
            raise EventLoopUnavailable(
                f"event_loop is uvloop but uvloop cannot be imported ({error}); install it "
                "(pip install uvloop; Linux and macOS only) or set event_loop: auto or asyncio"
            ) from None
        return None
    return uvloop.new_event_loop
