"""``EventChannel.batches``: the items ready at once taken as one list, within its limits, with
the channel's bookkeeping (backlog, ``taken``, ``when_taken``) as for items taken one by one
(docs/semantics.md §10, "Event batches"; the RPCs' side: tests/e2e/test_event_batches_e2e.py)."""

from __future__ import annotations

import asyncio

from support.waiting import wait_until

from turnwire_server.engine.channel import EventChannel


def _size(item: str) -> int:
    return len(item)


async def _next(batches: object) -> list[str]:
    return await asyncio.wait_for(anext(batches), 5)  # type: ignore[call-overload]


async def test_items_ready_at_once_come_as_one_list_within_the_limits() -> None:
    channel: EventChannel[str] = EventChannel()
    batches = channel.batches(3, 10, _size)
    for item in ("a", "b", "c", "d", "e"):
        channel.put(item)
    assert await _next(batches) == ["a", "b", "c"]  # at most 3 items
    assert await _next(batches) == ["d", "e"]
    channel.put("xxxxxxxxxxxx")  # 12 bytes: over the limit, alone
    channel.put("f")
    assert await _next(batches) == ["xxxxxxxxxxxx"]
    for item in ("gggg", "hhhh", "iiii"):
        channel.put(item)
    assert await _next(batches) == ["f", "gggg", "hhhh"]  # 9 bytes; with "iiii" 13
    assert await _next(batches) == ["iiii"]
    later = asyncio.ensure_future(_next(batches))  # nothing ready: it waits for the next put
    await asyncio.sleep(0)
    assert not later.done()
    channel.put("j")
    assert await later == ["j"]
    channel.close()
    assert [batch async for batch in batches] == []


async def test_the_backlog_falls_by_every_event_a_batch_held() -> None:
    channel: EventChannel[str] = EventChannel(high_water=4)
    channel.put("a")
    channel.put("b")
    channel.grew()  # a delta merged into "b": it stands for two events
    channel.put("c")
    channel.put("d")
    assert channel.backlogged
    drained = asyncio.ensure_future(channel.drained())
    batches = channel.batches(64, 1 << 20, _size)
    assert await _next(batches) == ["a", "b", "c", "d"]
    await asyncio.wait_for(drained, 5)
    assert not channel.backlogged


async def test_taken_and_when_taken_follow_the_batch_holding_the_item() -> None:
    channel: EventChannel[str] = EventChannel()
    channel.put("a")
    channel.put("b")
    taken = asyncio.ensure_future(channel.taken(60))
    await asyncio.sleep(0)  # taken() looks at the channel: "b" is its last item
    seen: list[str] = []
    channel.when_taken(lambda: seen.append("b sent"))
    channel.put("c")
    batches = channel.batches(2, 1 << 20, _size)
    assert await _next(batches) == ["a", "b"]
    await asyncio.wait_for(taken, 5)  # "b" was the last item when taken() was asked
    assert seen == []  # the consumer has not come back yet: "b" may not be written
    assert await _next(batches) == ["c"]
    await wait_until(lambda: seen == ["b sent"], what="the when_taken callback")
