"""A turn's timeline stored with its end and listed with its turn (``Store.list_turns``,
migration 0010_turn_timelines; docs/inspector.md), on SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses

import pytest
from support.store_turns import T0, started_turn

from turnwire_server.store import Store
from turnwire_server.store.errors import InvalidPageToken


async def test_the_timeline_written_with_the_end_is_listed_with_the_turn(store: Store) -> None:
    done, failed, rolled_back, running = [
        await started_turn(store, "c", n, key_prefix="t/") for n in range(4)
    ]
    await store.finish_turn(
        dataclasses.replace(
            done,
            state="completed",
            end_time=T0,
            cost_usd=0.5,
            cost_source="config",
            timeline=b"\x00\x01 done",
        ),
        None,
    )
    await store.finish_turn(
        dataclasses.replace(failed, state="error", end_time=T0, error=b"why", timeline=b"failed"), None
    )
    await store.roll_back_turn(
        dataclasses.replace(rolled_back, state="aborted", end_time=T0, timeline=b"rolled back"),
        [f"c-u{2}"],
    )
    turns, token = await store.list_turns("t/c", 10, "")
    assert token == ""
    assert [turn.request_id for turn in turns] == [f"t/c-r{n}" for n in (3, 2, 1, 0)]  # newest first
    by_id = {turn.request_id: turn for turn in turns}
    assert by_id[done.request_id].timeline == b"\x00\x01 done"
    assert (by_id[done.request_id].cost_usd, by_id[done.request_id].cost_source) == (0.5, "config")
    assert by_id[failed.request_id].timeline == b"failed"
    assert by_id[failed.request_id].error == b"why"
    assert by_id[rolled_back.request_id].timeline == b"rolled back"
    assert by_id[running.request_id].timeline is None  # written with the end only
    assert by_id[running.request_id].state == "running"

    failed_only, _ = await store.list_turns("t/c", 10, "", failed_only=True)
    assert [turn.request_id for turn in failed_only] == [rolled_back.request_id, failed.request_id]
    assert await store.list_turns("t/other", 10, "") == ([], "")


async def test_turn_pages_list_each_turn_once(store: Store) -> None:
    for n in range(5):
        await started_turn(store, "p", n, key_prefix="t/")
    seen: list[str] = []
    token = ""
    while True:
        page, token = await store.list_turns("t/p", 2, token)
        seen.extend(turn.request_id for turn in page)
        if not token:
            break
    assert seen == [f"t/p-r{n}" for n in (4, 3, 2, 1, 0)]
    _, first_token = await store.list_turns("t/p", 2, "")
    with pytest.raises(InvalidPageToken):  # another listing's token (failed only) is refused
        await store.list_turns("t/p", 2, first_token, failed_only=True)
    with pytest.raises(InvalidPageToken):
        await store.list_turns("t/q", 2, first_token)
