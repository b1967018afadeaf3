"""PostgreSQL plans a hot statement once, not at every call: after turns of every kind the store
runs (a new conversation and a continued one, a tool call, three budgets: the one-flight admission,
the checkpoint, the final write and its settlement), every statement its connection prepared
(psycopg prepares one run five times) runs on PostgreSQL's generic plan: at most the five custom
plans PostgreSQL makes before it compares (PREPARE's "custom or generic plan" rule). A statement
PostgreSQL keeps planning again costs the server its planning at each call (``= ANY($1)`` over
an array did, ~50 µs a commit: bench/budget_cost.md, 2026-12-07)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from support.engine_harness import MODEL, Harness, RecordingProvider, echo, end_of, engine_settings, make_tool
from support.stores import postgres_database

from turnwire.testing import ScriptedProvider, ScriptedUsage, ScriptStep
from turnwire_client.v1 import event_pb2
from turnwire_server.api.status import status_of
from turnwire_server.engine import TurnEngine
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.engine.tracing import TRACING_OFF
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.postgres import PostgresStore

_CUSTOM_PLANS_BEFORE_CHOOSING = 5  # PostgreSQL's plancache.c: custom plans before comparing
_BUDGETS = {
    "turn": {"tokens": 10**9, "usd": 10**4},
    "conversation": {"tokens": 10**9, "usd": 10**4},
    "tenant": {"day": {"tokens": 10**9, "usd": 10**4}},
}
_PRICES = PriceBook(PricingSettings.model_validate({"models": {MODEL: {"input_mtok": 3, "output_mtok": 15}}}))
_TOOL_STEP = ScriptStep(
    text="Calling.",
    tool_calls=[{"name": "echo", "input": {"n": 1}}],
    usage=ScriptedUsage(input_tokens=90, output_tokens=5),
)
_LAST_STEP = ScriptStep(text="Done.", usage=ScriptedUsage(input_tokens=100, output_tokens=3))


@pytest.fixture
async def store() -> AsyncIterator[PostgresStore]:
    """A PostgreSQL store of one pooled connection: every statement it prepares is on it."""
    with postgres_database() as url:
        opened = PostgresStore(url, pool_size=1)
        await opened.open()
        try:
            yield opened
        finally:
            await opened.close()


async def _prepared(store: PostgresStore) -> list[tuple[str, int, int]]:
    """The statements the store's connection prepared: text, generic and custom plans made."""
    pool: Any = store._pool  # the connection the turns used (pool_size=1)
    async with pool.connection() as conn:
        cursor = await conn.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
            " WHERE NOT from_sql ORDER BY statement"
        )
        return [(str(s), int(g), int(c)) for s, g, c in await cursor.fetchall()]


async def test_every_statement_a_turn_runs_again_is_planned_once(store: PostgresStore) -> None:
    provider = RecordingProvider(ScriptedProvider({"main": [_TOOL_STEP, _LAST_STEP]}))
    chain = MiddlewareChain([])
    engine = TurnEngine(
        store=store,
        providers=ProviderRegistry({"scripted": provider}),
        tools={"echo": make_tool("echo", echo)},
        chain=chain,
        settings=engine_settings(
            budgets=BudgetSettings.model_validate(_BUDGETS), prices=_PRICES, max_steps=4
        ),
        error_status=status_of,
        tracing=TRACING_OFF,
    )
    h = Harness(engine, store, provider, chain)  # type: ignore[arg-type]  # the harness's SQLite type
    try:
        for n in range(24):  # 12 conversations, two turns each
            end = end_of(await h.run(f"q{n}", conversation_id=f"c{n % 12}"))
            assert end.status == event_pb2.TURN_STATUS_COMPLETED, end
    finally:
        await engine.drain(1.0)
    prepared = await _prepared(store)
    # The test sees what it means to: the turns' writes were prepared, budgets' among them.
    assert any("budget_spend" in sql for sql, _, _ in prepared), prepared
    assert any("INSERT INTO turns" in sql for sql, _, _ in prepared), prepared
    replanned = [
        (custom, generic, " ".join(sql.split())[:160])
        for sql, generic, custom in prepared
        if custom > _CUSTOM_PLANS_BEFORE_CHOOSING
    ]
    assert not replanned, (
        "planned again at each call (custom plans, generic plans, statement):\n"
        + "\n".join(map(str, replanned))
    )
