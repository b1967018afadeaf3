"""A new turn's first reservation decided by PostgreSQL inside the one-flight admission
(``store/postgres/budget_flight.py``; docs/cost.md, "What it costs per request"): it grants, stores
and reserves what the general charge (``budget_writes.charge_budget``, the rule in Python) does
from the same states, over generated states and asks; the flight waits for the server once (no
answer is read before its ``COMMIT`` goes out); a spent budget fails the flight, the turn is
refused the waiting way, and the turns that follow on that budget go that way at once."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.engine_harness import CONV, Harness, RecordingProvider, end_of, engine_settings
from support.stores import StoreBackend, leased_turn, postgres_database

from turnwire.testing import ScriptedProvider, ScriptedUsage, ScriptStep
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.api.status import status_of
from turnwire_server.engine import TurnEngine
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.errors import BudgetRefused
from turnwire_server.engine.tracing import TRACING_OFF
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store import Store, TurnRecord
from turnwire_server.store.core.budget_rules import fit_output
from turnwire_server.store.core.budget_writes import kept_limits
from turnwire_server.store.errors import BudgetSpent
from turnwire_server.store.postgres import budget_flight, db
from turnwire_server.store.records import (
    BudgetAsk,
    BudgetCharge,
    BudgetGrant,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
)

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
_WORLDS = itertools.count()

_LIMIT_TOKENS = st.none() | st.integers(0, 12_000) | st.integers(2_000, 12_000)
_LIMIT_USD = st.none() | st.floats(0.0, 3.0) | st.floats(0.5, 3.0)
# States, asks and limits mostly within reach of each other: a grant clamped by one budget or
# another is the interesting case, not one refused by a budget long spent.
_STATE = st.tuples(st.integers(0, 1_000), st.floats(0.0, 0.25), st.integers(0, 1_000), st.floats(0.0, 0.25))
_PRICE = st.sampled_from([0.0, 1e-7, 3e-6, 1.5e-5, 1e-4]) | st.floats(1e-8, 2e-4)
_SCOPES = ("turn", "conversation", "tenant/day")


def _input(request_id: str) -> list[message_pb2.Message]:
    user = message_pb2.Message(id=f"u-{request_id}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    return [user]


async def _admitted(store: Store, turn: TurnRecord, charge: BudgetCharge | None, refuse: Any = ()) -> Any:
    queued: list[bool] = []
    async with store.admit_turn(
        turn,
        _input(turn.request_id),
        lease_seconds=30,
        read_compaction=False,
        queued=queued.append,
        budget=charge,
        refuse=refuse,
    ) as admission:
        return admission.budget, queued


def _world(
    backend: StoreBackend,
    world: str,
    states: list[tuple[int, float, int, float]],
    limits: list[tuple[int | None, float | None]],
    stored: tuple[int | None, float | None],
) -> tuple[BudgetLimits, ...]:
    """World ``world``'s budgets (its turn's, its conversation's, its tenant's day) with
    ``limits``, their rows stored at ``states`` (spent and reserved tokens and dollars), the
    turn's with the limits ``stored`` (a lower one its request asked for is kept)."""
    keys = (
        BudgetKey("turn", f"r{world}"),
        BudgetKey("conversation", f"c{world}"),
        BudgetKey("tenant/day", world, "2026-01-02"),
    )
    for key, (spent, spent_usd, reserved, reserved_usd) in zip(keys, states, strict=True):
        limit_tokens, limit_usd = stored if key.scope == "turn" else (None, None)
        backend.sql(
            "INSERT INTO budget_spend (scope, scope_key, period, spent_tokens, spent_usd,"
            " reserved_tokens, reserved_usd, limit_tokens, limit_usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (*key, spent, spent_usd, reserved, reserved_usd, limit_tokens, limit_usd),
        )
    return tuple(
        BudgetLimits(key, tokens, usd, None if key.scope == "tenant/day" else f"c{world}")
        for key, (tokens, usd) in zip(keys, limits, strict=True)
    )


def _outcome(backend: StoreBackend, grant: BudgetGrant, request_id: str, keys: list[BudgetKey]) -> Any:
    stored = [
        backend.sql(
            "SELECT spent_tokens, spent_usd, reserved_tokens, reserved_usd, limit_tokens, limit_usd"
            " FROM budget_spend WHERE scope = ? AND scope_key = ? AND period = ?",
            key,
        )
        for key in keys
    ]
    reservations = backend.sql(
        "SELECT scope, epoch, tokens, usd FROM budget_reservations WHERE request_id = ? ORDER BY scope",
        (request_id,),
    )
    refused = grant.refused and grant.refused.scope
    return (
        (grant.output_tokens, grant.tokens, grant.usd, refused),
        [grant.spends[k] for k in keys],
        stored,
        reservations,
    )


@pytest.fixture
async def postgres() -> AsyncIterator[tuple[Store, StoreBackend]]:
    """An open PostgreSQL store on a database of its own (the one flight is PostgreSQL's)."""
    with postgres_database() as url:
        backend = StoreBackend("postgres", url=url)
        store = backend.new_store()
        await store.open()
        try:
            yield store, backend
        finally:
            await store.close()
            await backend.close()


@settings(
    max_examples=100,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    states=st.lists(_STATE, min_size=3, max_size=3),
    limits=st.lists(st.tuples(_LIMIT_TOKENS, _LIMIT_USD), min_size=3, max_size=3),
    stored=st.tuples(_LIMIT_TOKENS, _LIMIT_USD),
    prompt=st.integers(0, 2_000),
    prices=st.tuples(_PRICE, _PRICE),
    most=st.integers(1, 4_000),
    least=st.integers(1, 4_000) | st.integers(-2, 2).map(lambda off: ("near", off)),
)
# Refused by its least output only (600 fit, 601 asked at least).
@example(
    states=[(0, 0.0, 0, 0.0)] * 3,
    limits=[(None, None), (1_000, None), (None, None)],
    stored=(None, None),
    prompt=400,
    prices=(0.0, 0.0),
    most=1_000,
    least=("near", 1),
)
# One token at a dollar boundary (the rule's hair of slack decides).
@example(
    states=[(0, 0.0, 0, 0.0), (0, 0.0, 0, 0.0), (0, 0.6241640507547823, 0, 0.31771684924521776)],
    limits=[(None, None), (None, None), (None, 1.0)],
    stored=(None, None),
    prompt=19_373,
    prices=(3e-6, 1e-7),
    most=1,
    least=1,
)
# The turn's own lower stored limit holds (500 stored, 5 000 charged now).
@example(
    states=[(0, 0.0, 0, 0.0)] * 3,
    limits=[(5_000, 2.0), (None, None), (None, None)],
    stored=(500, 0.01),
    prompt=100,
    prices=(1e-5, 2e-5),
    most=1_000,
    least=("near", 0),
)
async def test_the_databases_decision_agrees_with_the_general_charge(  # noqa: PLR0917 (hypothesis's)
    store: Store,
    store_backend: StoreBackend,
    states: Any,
    limits: Any,
    stored: Any,
    prompt: int,
    prices: tuple[float, float],
    most: int,
    least: int | tuple[str, int],
) -> None:
    # Two worlds apart by their keys, from the same states: the admission's (on PostgreSQL the
    # flight's SQL), and a started turn's general charge (the rule in Python). The least output
    # asked for is drawn anywhere, or "near" what fits (the rule's own answer for one token, plus
    # an offset), where a rule that tells "fits" from "refused" wrongly would show.
    usd_in, usd_out = prices
    if isinstance(least, tuple):
        fits = _fitting(states, limits, stored, BudgetAsk(prompt, prompt * usd_in, usd_out, most, 1))
        least = fits + least[1]
    ask = BudgetAsk(prompt, prompt * usd_in, usd_out, most, max(1, min(least, most)))
    outcomes = []
    for side in ("admitted", "general"):
        world = f"{side[0]}{next(_WORLDS)}"
        budgets = _world(store_backend, world, states, limits, stored)
        turn = leased_turn(f"r{world}", f"c{world}", "a", start_time=T0)
        charge = BudgetCharge(turn.request_id, turn.conversation_id, turn.lease, budgets, ask=ask)
        if side == "admitted":
            grant, queued = await _admitted(store, turn, charge)
            assert queued == []  # idle: the one flight on PostgreSQL, never the waiting path
        else:
            await store.start_turn(turn, _input(turn.request_id))
            grant = await store.charge_budget(charge)
        outcomes.append(_outcome(store_backend, grant, turn.request_id, [b.key for b in budgets]))
    assert outcomes[0] == outcomes[1]


def _fitting(states: Any, limits: Any, stored: Any, ask: BudgetAsk) -> int:
    """What the rule grants ``ask`` over these states and limits (0: refused)."""
    world = [BudgetKey(scope, "w") for scope in _SCOPES]
    budgets = tuple(
        kept_limits(BudgetLimits(key, *limit), *(stored if key.scope == "turn" else (None, None)))
        for key, limit in zip(world, limits, strict=True)
    )
    spends = {key: BudgetSpend(*state) for key, state in zip(world, states, strict=True)}
    return fit_output(ask, budgets, spends)[0]


async def test_the_flight_reads_no_answer_before_its_commit(
    postgres: tuple[Store, StoreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budgeted admission on an idle conversation costs one round trip: every statement, the
    budget's included, and the ``COMMIT`` go out before any answer is read."""
    events: list[str] = []
    execute, fetchall = psycopg.AsyncConnection.execute, psycopg.AsyncCursor.fetchall

    async def recording_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        events.append(bytes(query).decode() if isinstance(query, bytes) else str(query))
        return await execute(self, query, *args, **kwargs)

    async def recording_fetchall(self: Any) -> Any:
        events.append("<answer read>")
        return await fetchall(self)

    budgets = (
        BudgetLimits(BudgetKey("conversation", "c"), tokens=10_000, conversation_id="c"),
        BudgetLimits(BudgetKey("tenant/day", "", "2026-01-02"), usd=5.0),
    )
    turn = leased_turn("r1", "c", "a", start_time=T0)
    charge = BudgetCharge("r1", "c", turn.lease, budgets, ask=BudgetAsk(100, 1e-4, 1e-5, 500))
    store, _ = postgres
    monkeypatch.setattr(psycopg.AsyncConnection, "execute", recording_execute)
    monkeypatch.setattr(psycopg.AsyncCursor, "fetchall", recording_fetchall)
    grant, queued = await _admitted(store, turn, charge, refuse=budgets)
    monkeypatch.undo()

    assert queued == [] and grant is not None and (grant.output_tokens, grant.tokens) == (500, 600)
    flight = events[events.index("BEGIN") : events.index("COMMIT") + 1]
    assert "<answer read>" not in flight, flight
    assert sum("budget_spend" in sql for sql in flight) == 2  # the take and the decision


async def test_a_spent_budget_fails_one_flight_then_a_read_refuses_until_it_has_room(
    postgres: tuple[Store, StoreBackend], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, store_backend = postgres
    discarded: list[object] = []
    discard = db.discard

    async def counted(conn: Any) -> None:
        discarded.append(conn)
        await discard(conn)

    monkeypatch.setattr(db, "discard", counted)
    key = BudgetKey("tenant/day", "", "2026-01-02")
    store_backend.sql(
        "INSERT INTO budget_spend (scope, scope_key, period, spent_tokens) VALUES (?, ?, ?, 1000)", key
    )
    spent = BudgetLimits(key, tokens=1_000)

    def charge(turn: TurnRecord) -> BudgetCharge:
        return BudgetCharge(
            turn.request_id, turn.conversation_id, turn.lease, (spent,), ask=BudgetAsk(1, 0, 0, 1)
        )

    for n in range(3):
        turn = leased_turn(f"r{n}", f"c{n}", "a", start_time=T0)
        with pytest.raises(BudgetSpent) as refused:  # a reservation carried, or the check alone
            await _admitted(store, turn, charge(turn) if n != 1 else None, refuse=(spent,))
        assert (refused.value.budget, refused.value.spend.spent_tokens) == (spent, 1_000)
        assert await store.get_turn(turn.request_id) is None
    # The first refusal failed a flight (its pooled connection discarded); the next two were
    # refused by the read alone, before anything waited in line.
    assert len(discarded) == 1
    assert store_backend.sql("SELECT count(*) FROM budget_reservations") == [(0,)]
    # With room again (a limit raised), the read lets the turn fly: admitted in one flight.
    roomy = BudgetLimits(key, tokens=2_000)
    turn = leased_turn("r3", "c3", "a", start_time=T0)
    grant, queued = await _admitted(
        store, turn, dataclasses.replace(charge(turn), budgets=(roomy,)), refuse=(roomy,)
    )
    assert queued == [] and grant is not None and grant.refused is None
    assert len(discarded) == 1


def test_spent_budgets_are_remembered_for_a_while_and_boundedly() -> None:
    now = [1_000.0]
    spent = budget_flight.SpentBudgets(clock=lambda: now[0])
    day = BudgetLimits(BudgetKey("tenant/day", "t", "2026-01-02"))
    other = BudgetLimits(BudgetKey("tenant/day", "u", "2026-01-02"))
    assert not spent.spent((day,))
    spent.note((day,))
    assert spent.spent((other, day)) and not spent.spent((other,))
    now[0] += 61.0
    assert not spent.spent((day,))
    for n in range(1_100):
        spent.note((BudgetLimits(BudgetKey("tenant/day", f"t{n}", "2026-01-02")),))
    assert not spent.spent((BudgetLimits(BudgetKey("tenant/day", "t0", "2026-01-02")),))
    assert spent.spent((BudgetLimits(BudgetKey("tenant/day", "t1099", "2026-01-02")),))


async def test_the_engine_refuses_a_turn_on_a_spent_budget_before_start_returns(
    postgres: tuple[Store, StoreBackend],
) -> None:
    # The call's refusal (RESOURCE_EXHAUSTED before any event), as on SQLite
    # (test_budget_admission_engine.py), though the flight failed and the turn took the waiting way.
    store, _ = postgres
    provider = RecordingProvider(
        ScriptedProvider(
            {
                "main": [
                    ScriptStep(
                        text="Long.", usage=ScriptedUsage(input_tokens=900, output_tokens=200), repeat=True
                    )
                ]
            }
        )
    )
    chain = MiddlewareChain([])
    engine = TurnEngine(
        store=store,
        providers=ProviderRegistry({"scripted": provider}),
        tools={},
        chain=chain,
        settings=engine_settings(budgets=BudgetSettings.model_validate({"conversation": {"tokens": 1_000}})),
        error_status=status_of,
        tracing=TRACING_OFF,
    )
    h = Harness(engine, store, provider, chain)  # type: ignore[arg-type]  # the harness's SQLite type
    try:
        assert end_of(await h.run("hi")).status == event_pb2.TURN_STATUS_COMPLETED  # 1 100 of 1 000
        stored = [m.id for m in await store.load_messages(CONV)]
        for _ in range(3):  # the flight failed on it, then twice a read alone
            with pytest.raises(BudgetRefused) as refused:
                await h.start("again", request_id="again", message_id="u-again")
            assert refused.value.budget == "conversation"
        assert engine.running == 0 and provider.calls == 1
        assert [m.id for m in await store.load_messages(CONV)] == stored
        assert await store.get_turn("again") is None
    finally:
        await engine.drain(1.0)
