"""Two replicas on one PostgreSQL database, two turns at once against a budget that fits one
(issue 37; docs/cost.md "Budgets"): exactly one runs its model step, the other ends with
``BUDGET_EXHAUSTED`` (its step's reservation refused) or, had the winner already settled, is refused
``RESOURCE_EXHAUSTED``; the budget counts the winner's step once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc
import psycopg
import pytest
from support.sidecar import SidecarFactory
from support.stores import postgres_database

from turnwire_client import TurnResult, TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2

# A step reserves its prompt (a few tokens of "go" and the system prompt) and 1 000 tokens of
# output, and is sent with at least 100: the day's 1 030 hold one such reservation, not two. The
# winner's step streams for about two seconds, so the other's reservation meets the first's; it
# reports 1 030 tokens, so even a late loser finds the day spent.
WORDS = " ".join(f"w{i}" for i in range(40))
CONFIG: dict[str, object] = {
    "default_model": "scripted:slow",
    "providers": {
        "scripted": {
            "scripts": {
                "slow": [
                    {"text": WORDS, "delay_ms": 50, "usage": {"input_tokens": 1_000, "output_tokens": 30}}
                ]
            }
        }
    },
    "tools": {"demo": False},
    "budgets": {
        "tenant": {"day": {"tokens": 1_030}},
        "assumed_max_output_tokens": 1_000,
        "min_output_tokens": 100,
    },
}


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


async def _turn(client: TurnwireClient, conversation_id: str) -> TurnResult | TurnwireError:
    try:
        return await collect(client.chat(conversation_id, "go"))
    except TurnwireError as error:
        return error


async def test_two_replicas_two_turns_a_budget_that_fits_one_exactly_one_runs(
    sidecar_factory: SidecarFactory, pg_url: str, tmp_path: Path
) -> None:
    replicas = [
        sidecar_factory(CONFIG, workdir=tmp_path / f"replica-{n}", store_url=pg_url) for n in range(2)
    ]
    await asyncio.gather(*(replica.start() for replica in replicas))
    async with TurnwireClient(replicas[0].target) as first, TurnwireClient(replicas[1].target) as second:
        outcomes = await asyncio.gather(_turn(first, "race-a"), _turn(second, "race-b"))

    completed = [
        o for o in outcomes if isinstance(o, TurnResult) and o.status == event_pb2.TURN_STATUS_COMPLETED
    ]
    assert len(completed) == 1, outcomes
    (loser,) = [o for o in outcomes if o not in completed]
    if isinstance(loser, TurnwireError):
        assert loser.code == grpc.StatusCode.RESOURCE_EXHAUSTED and loser.reason == "BUDGET_EXHAUSTED"
    else:
        assert loser.status == event_pb2.TURN_STATUS_ERROR and loser.error is not None
        assert "BUDGET_EXHAUSTED" in str(loser.error.details[0].value)
        assert loser.step_count == 0  # its step was never sent
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT spent_tokens, reserved_tokens FROM budget_spend WHERE scope = 'tenant/day'"
        ).fetchall()
    assert [tuple(row) for row in rows] == [(1_030, 0)]  # the winner's step, once; nothing left reserved
