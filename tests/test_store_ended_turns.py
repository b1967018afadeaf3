"""``Store.ended_turns_marked`` on every backend: the ended turns of the conversations whose id
holds a mark (a sub-agent's, ``:sub-``), whose stream ended since a time, oldest end first, in
pages; what the start-up reads to deliver detached sub-agents' answers a crash left undelivered
(docs/subagents.md, "Detached sub-agents")."""

from __future__ import annotations

import dataclasses
import datetime as dt

import pytest
from support.store_turns import T0, started_turn

from turnwire_server.store import Store, TurnRecord

MARK = ":sub-"


async def _ended(store: Store, conversation: str, n: int, seconds: int) -> TurnRecord:
    """Turn ``n`` of ``conversation`` (request id ``{conversation}-r{n}``) started and ended, its
    stream ended with it; ended ``seconds`` after T0."""
    turn = await started_turn(store, conversation, n)
    ended = dataclasses.replace(turn, state="completed", end_time=T0 + dt.timedelta(seconds=seconds))
    await store.finish_turn(ended, None, events=[(1, b"end")], stream_ended=True)
    return ended


async def test_only_ended_marked_turns_oldest_end_first_in_pages(store: Store) -> None:
    await _ended(store, "p:sub-b", 1, 3)
    await _ended(store, "p:sub-a", 1, 1)
    await _ended(store, "p:sub-a", 2, 3)
    await _ended(store, "p", 1, 2)  # not a marked conversation
    await started_turn(store, "p:sub-c", 1)  # not ended
    since = T0 - dt.timedelta(days=1)  # the streams ended now: all are after it

    every = await store.ended_turns_marked(MARK, since, 10)
    assert [t.request_id for t in every] == ["p:sub-a-r1", "p:sub-a-r2", "p:sub-b-r1"]
    assert all(t.state == "completed" and t.end_time is not None for t in every)

    first = await store.ended_turns_marked(MARK, since, 2)
    assert [t.request_id for t in first] == ["p:sub-a-r1", "p:sub-a-r2"]
    last = first[-1]
    assert last.end_time is not None
    rest = await store.ended_turns_marked(MARK, since, 2, (last.end_time, last.request_id))
    assert [t.request_id for t in rest] == ["p:sub-b-r1"]


async def test_turns_whose_stream_ended_before_since_are_left_out(store: Store) -> None:
    await _ended(store, "p:sub-a", 1, 1)
    assert await store.ended_turns_marked(MARK, dt.datetime.now(dt.UTC) + dt.timedelta(hours=1), 10) == []


async def test_a_wildcard_mark_or_an_empty_page_is_refused(store: Store) -> None:
    for mark in ("", "%", "a_b"):
        with pytest.raises(ValueError, match="mark"):
            await store.ended_turns_marked(mark, T0, 10)
    with pytest.raises(ValueError, match="limit"):
        await store.ended_turns_marked(MARK, T0, 0)
