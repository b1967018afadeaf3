"""Budget rows of ended periods are deleted by the maintenance sweep (``Store.expire_budget_periods``,
``budget_scopes.ended_periods``; docs/cost.md, "Budgets"): a tenant's or principal's day and month
rows once the period before the current one is over too, never a row a running step reserved on,
never a turn's or a conversation's; a turn's own row once its turn ended
(``Store.expire_turn_budgets``); on SQLite and PostgreSQL alike."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace
from typing import Any

import pytest
from support.stores import StoreBackend, leased_turn
from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.background import start_maintenance
from turnwire_server.engine.budget_scopes import ended_periods
from turnwire_server.engine.settings import DurabilitySettings
from turnwire_server.store import Store
from turnwire_server.store.records import BudgetAsk, BudgetCharge, BudgetKey, BudgetLimits


def _rows(backend: StoreBackend) -> set[tuple[str, str, str]]:
    return {tuple(row) for row in backend.sql("SELECT scope, scope_key, period FROM budget_spend")}


def _insert(backend: StoreBackend, *keys: tuple[str, str, str]) -> None:
    for key in keys:
        backend.sql(
            "INSERT INTO budget_spend (scope, scope_key, period, spent_tokens, spent_usd)"
            " VALUES (?, ?, ?, 7, 0.5)",
            key,
        )


async def _reserve_on(store: Store, key: BudgetKey) -> None:
    """A running step's reservation on ``key``'s row (a turn started and charged)."""
    turn = leased_turn("r-running", "c-running", "a", start_time=dt.datetime(2026, 11, 20, tzinfo=dt.UTC))
    user = message_pb2.Message(id="u-running", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    await store.start_turn(turn, [user])
    charge = BudgetCharge(
        turn.request_id,
        turn.conversation_id,
        turn.lease,
        (BudgetLimits(key, tokens=10_000),),
        ask=BudgetAsk(10, 0.0, 0.0, 100),
    )
    grant = await store.charge_budget(charge)
    assert grant.tokens == 110  # reserved: the row is the running step's


def test_the_period_before_the_current_one_is_kept() -> None:
    assert ended_periods(dt.datetime(2026, 12, 1, 0, 30, tzinfo=dt.UTC)) == ("2026-11-30", "2026-11")
    assert ended_periods(dt.datetime(2027, 1, 1, 23, 59, tzinfo=dt.UTC)) == ("2026-12-31", "2026-12")
    # UTC decides, whatever the caller's zone.
    tokyo = dt.timezone(dt.timedelta(hours=9))
    assert ended_periods(dt.datetime(2026, 3, 1, 8, 0, tzinfo=tokyo)) == ("2026-02-27", "2026-01")


async def test_rows_of_ended_periods_go_and_reserved_or_unending_ones_stay(
    store: Store, store_backend: StoreBackend
) -> None:
    ended = {
        ("tenant/day", "t", "2026-11-28"),
        ("principal/day", "t/p", "2026-10-02"),
        ("tenant/month", "t", "2026-10"),
        ("principal/month", "t/p", "2025-12"),
    }
    kept = {
        ("tenant/day", "t", "2026-11-30"),  # yesterday's
        ("tenant/day", "t", "2026-12-01"),
        ("tenant/month", "t", "2026-11"),  # last month's
        ("tenant/month", "t", "2026-12"),
        ("conversation", "c", ""),  # never ends
        ("turn", "r", ""),
    }
    _insert(store_backend, *ended, *kept)
    reserved = BudgetKey("tenant/day", "t2", "2026-11-20")
    await _reserve_on(store, reserved)  # a step still running on an ended day's row
    assert await store.expire_budget_periods("2026-11-30", "2026-11", 100) == len(ended)
    assert _rows(store_backend) == kept | {tuple(reserved)}
    assert await store.expire_budget_periods("2026-11-30", "2026-11", 100) == 0


async def test_one_call_deletes_at_most_its_limit(store: Store, store_backend: StoreBackend) -> None:
    _insert(store_backend, *(("tenant/day", f"t{n}", "2026-01-02") for n in range(5)))
    assert await store.expire_budget_periods("2026-02-01", "2026-01", 2) == 2
    assert await store.expire_budget_periods("2026-02-01", "2026-01", 2) == 2
    assert await store.expire_budget_periods("2026-02-01", "2026-01", 2) == 1
    assert _rows(store_backend) == set()


@pytest.mark.parametrize(
    ("day", "month", "limit"),
    [("2026-11-30", "2026-11", 0), ("2026-11", "2026-11", 1), ("2026-11-30", "2026", 1)],
)
async def test_arguments_of_another_form_are_refused(store: Store, day: str, month: str, limit: int) -> None:
    with pytest.raises(ValueError, match=r"limit|YYYY"):
        await store.expire_budget_periods(day, month, limit)


async def test_the_maintenance_sweep_deletes_them(store: Store, store_backend: StoreBackend) -> None:
    now = dt.datetime.now(dt.UTC)
    old_day = (now - dt.timedelta(days=3)).date().isoformat()
    today = now.date().isoformat()
    _insert(store_backend, ("tenant/day", "t", old_day), ("tenant/day", "t", today))
    await _turn(store, store_backend, "r-ended", ended=True)
    _insert(store_backend, ("turn", "r-ended", ""))
    submissions: Any = SimpleNamespace(expire=_nothing_expired)
    durability = DurabilitySettings(
        conversation_retention_seconds=0, event_retention_seconds=0, pending_expiry_seconds=0
    )
    maintenance = start_maintenance(durability, SimpleNamespace(store=store), submissions)  # type: ignore[arg-type]
    try:
        await wait_until(lambda: _rows(store_backend) == {("tenant/day", "t", today)})
    finally:
        await maintenance.stop()


async def _turn(store: Store, store_backend: StoreBackend, request_id: str, *, ended: bool) -> None:
    """A stored turn of conversation ``c-<request_id>``, running or ended."""
    turn = leased_turn(
        request_id, f"c-{request_id}", "a", start_time=dt.datetime(2026, 11, 20, tzinfo=dt.UTC)
    )
    user = message_pb2.Message(id=f"u-{request_id}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    await store.start_turn(turn, [user])
    if ended:
        store_backend.sql(
            "UPDATE turns SET state = 'completed', end_time = start_time + 1 WHERE request_id = ?",
            (request_id,),
        )


async def test_a_turns_own_row_goes_once_the_turn_ended(store: Store, store_backend: StoreBackend) -> None:
    """Before, a turn's row stayed as long as its conversation: one row a budgeted turn."""
    await _turn(store, store_backend, "r-ended", ended=True)
    await _turn(store, store_backend, "r-ended-2", ended=True)
    await _turn(store, store_backend, "r-running", ended=False)
    kept = {
        ("turn", "r-running", ""),  # its turn runs on: a recovery would charge it again
        ("turn", "r-unknown", ""),  # no such turn stored (a turn's row is written with its turn)
        ("conversation", "c-r-ended", ""),
        ("tenant/day", "t", "2026-11-20"),
    }
    _insert(store_backend, ("turn", "r-ended", ""), ("turn", "r-ended-2", ""), *kept)
    assert await store.expire_turn_budgets(1) == 1  # at most its limit
    assert await store.expire_turn_budgets(100) == 1
    assert _rows(store_backend) == kept
    assert await store.expire_turn_budgets(100) == 0
    with pytest.raises(ValueError, match="limit"):
        await store.expire_turn_budgets(0)


async def test_a_running_steps_reserved_turn_row_stays(store: Store, store_backend: StoreBackend) -> None:
    key = BudgetKey("turn", "r-running")
    await _reserve_on(store, key)
    store_backend.sql("UPDATE turns SET end_time = start_time + 1 WHERE request_id = 'r-running'")
    assert await store.expire_turn_budgets(100) == 0
    assert tuple(key) in _rows(store_backend)


async def _nothing_expired(now: dt.datetime, *, expiry_seconds: float) -> int:
    return 0
