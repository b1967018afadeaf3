"""A turn's cost stored with its end and summed for its conversation (``ConversationView.cost``,
migrations 0008_turn_costs; docs/cost.md), on SQLite and PostgreSQL alike."""

from __future__ import annotations

import dataclasses

import pytest
from support.store_turns import T0, started_turn

from turnwire.types import Cost
from turnwire_server.store import Store, TurnRecord


async def _cost(store: Store, conversation_id: str) -> Cost | None:
    view = await store.conversation_view(conversation_id, 1)
    assert view is not None, conversation_id
    return view.cost


async def _end(store: Store, record: TurnRecord, usd: float | None, source: str | None) -> None:
    ended = dataclasses.replace(record, state="completed", end_time=T0, cost_usd=usd, cost_source=source)
    await store.finish_turn(ended, None)


async def test_the_ended_turns_costs_add_up_and_name_each_source_once(store: Store) -> None:
    first, second, nothing, running = [await started_turn(store, "c", n) for n in range(4)]
    await _end(store, first, 0.25, "config")
    await _end(store, second, 0.125, "genai-prices 0.2.3, config")
    await _end(store, nothing, 0.0, "")  # called no model: cost nothing
    # `running` has not ended: not counted yet.
    assert running.state == "running"
    assert await _cost(store, "c") == Cost(pytest.approx(0.375), "config, genai-prices 0.2.3")  # type: ignore[arg-type]


async def test_one_unknown_cost_makes_the_conversation_cost_unknown(store: Store) -> None:
    known, unknown = [await started_turn(store, "u", n) for n in range(2)]
    await _end(store, known, 0.5, "config")
    assert await _cost(store, "u") == Cost(0.5, "config")
    await _end(store, unknown, None, None)
    assert await _cost(store, "u") is None


async def test_no_ended_turn_no_cost(store: Store) -> None:
    assert await store.conversation_view("never", 1) is None
    await started_turn(store, "busy", 0)
    assert await _cost(store, "busy") is None


async def test_sources_are_named_in_the_order_the_turns_first_used_them(store: Store) -> None:
    """The database sums the costs by source (a few rows for a long conversation); the sources
    still come in the order of the first turn that used each, whatever the rows' grouping."""
    turns = [await started_turn(store, "s", n) for n in range(5)]
    for turn, source in zip(
        turns, ["manual", "config", "manual", "genai-prices 0.2.3, config", "config"], strict=True
    ):
        await _end(store, turn, 0.5, source)
    assert await _cost(store, "s") == Cost(2.5, "manual, config, genai-prices 0.2.3")
