"""Waiting for a condition instead of sleeping for a guessed time.

A fixed ``asyncio.sleep`` before an assertion is either too short (a flaky
test on a busy machine) or too long (a slow suite). :func:`wait_until` polls
the condition the sleep stood for and returns as soon as it holds, failing
with a message that says what was awaited when it never does.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")

#: Seconds before a condition that never holds fails the test. Only a failing test waits this
#: long, so it is generous: under `make test`'s parallel workers on 2 cores, a condition that holds
#: within a second on an idle machine can take several.
DEFAULT_TIMEOUT = 30.0
DEFAULT_INTERVAL = 0.01


@overload
async def wait_until(
    predicate: Callable[[], Awaitable[T]],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    *,
    what: str | None = ...,
) -> T: ...


@overload
async def wait_until(
    predicate: Callable[[], T],
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
    *,
    what: str | None = ...,
) -> T: ...


async def wait_until(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109
    interval: float = DEFAULT_INTERVAL,
    *,
    what: str | None = None,
) -> Any:
    """Poll ``predicate`` (sync or async) until it returns a truthy value, and return that value.

    It is checked at once, then every ``interval`` seconds. An exception it
    raises propagates at once (a broken check is not a condition to wait for).

    Raises:
        AssertionError: still falsy after ``timeout`` seconds; the message names
            ``what`` (default: the predicate's name), the timeout, how many checks
            ran and the last value returned.
        ValueError: ``timeout`` is negative or ``interval`` is not positive.
    """
    if timeout < 0:
        raise ValueError(f"wait_until: timeout must be >= 0, not {timeout!r}")
    if interval <= 0:
        raise ValueError(f"wait_until: interval must be > 0, not {interval!r}")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    checks = 0
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        checks += 1
        if result:
            return result
        remaining = deadline - loop.time()
        if remaining <= 0:
            described = what or getattr(predicate, "__qualname__", None) or repr(predicate)
            raise AssertionError(
                f"timed out after {timeout:g} s waiting until {described} "
                f"({checks} check(s), the last returned {result!r})"
            )
        await asyncio.sleep(min(interval, remaining))
