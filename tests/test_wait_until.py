"""support.waiting.wait_until: the helper the suite waits with instead of fixed sleeps."""

from __future__ import annotations

import asyncio

import pytest
from support.waiting import wait_until


async def test_returns_the_first_truthy_value_of_a_sync_predicate() -> None:
    values = iter([0, None, "", ["ready"]])
    assert await wait_until(lambda: next(values), interval=0.001) == ["ready"]


async def test_awaits_an_async_predicate() -> None:
    checks: list[int] = []

    async def third_time() -> int:
        checks.append(1)
        await asyncio.sleep(0)
        return len(checks) if len(checks) == 3 else 0

    assert await wait_until(third_time, interval=0.001) == 3
    assert len(checks) == 3


async def test_returns_at_once_when_the_condition_already_holds() -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert await wait_until(lambda: True, interval=10) is True
    assert loop.time() - started < 1


async def test_sees_a_change_made_by_another_task_while_it_waits() -> None:
    flag: list[str] = []

    async def later() -> None:
        await asyncio.sleep(0.02)
        flag.append("set")

    task = asyncio.create_task(later())
    assert await wait_until(lambda: flag, timeout=5, interval=0.005) == ["set"]
    await task


async def test_a_timeout_fails_with_what_was_awaited_and_the_last_value() -> None:
    def queue_is_empty() -> int:
        return 0

    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(AssertionError) as timed_out:
        await wait_until(queue_is_empty, timeout=0.05, interval=0.01)
    elapsed = loop.time() - started
    message = str(timed_out.value)
    assert message.startswith("timed out after 0.05 s waiting until ")
    assert "queue_is_empty" in message
    assert "the last returned 0" in message
    assert 0.05 <= elapsed < 2


async def test_what_names_the_condition_in_the_failure() -> None:
    with pytest.raises(AssertionError, match=r"waiting until the writer holds 20 writes \("):
        await wait_until(lambda: False, timeout=0.01, what="the writer holds 20 writes")


async def test_an_exception_in_the_predicate_propagates_at_once() -> None:
    def broken() -> bool:
        raise KeyError("no such key")

    with pytest.raises(KeyError, match="no such key"):
        await wait_until(broken, timeout=60)


@pytest.mark.parametrize(("limit", "interval"), [(-1, 0.01), (1, 0), (1, -0.5)])
async def test_rejects_a_negative_timeout_or_a_non_positive_interval(limit: float, interval: float) -> None:
    with pytest.raises(ValueError, match="wait_until"):
        await wait_until(lambda: True, timeout=limit, interval=interval)
