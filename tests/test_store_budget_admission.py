"""A new turn's budget check riding its admission (``Store.admit_turn``'s ``refuse``; docs/cost.md,
"Budgets"), on SQLite and PostgreSQL alike: a spent budget refuses the turn in the transaction
that would store its input (``BudgetSpent``), and nothing of it is stored, whether the admission
carries a first reservation that takes the budget's row, one that does not, or none; a budget
with room admits it; a turn that waited in line is checked when its turn comes."""

from __future__ import annotations

import asyncio
import datetime as dt
from contextlib import AbstractAsyncContextManager

import pytest
from support.stores import StoreBackend, leased_turn
from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store, TurnRecord
from turnwire_server.store.errors import BudgetSpent
from turnwire_server.store.records import (
    BudgetAsk,
    BudgetCharge,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
    TurnAdmission,
)

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
CONVERSATION = BudgetKey("conversation", "c")
TENANT_DAY = BudgetKey("tenant/day", "", "2026-01-02")
SPENT = BudgetLimits(CONVERSATION, tokens=1_000, conversation_id="c")


def _input(request_id: str) -> list[message_pb2.Message]:
    user = message_pb2.Message(id=f"u-{request_id}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    return [user]


def _charge(turn: TurnRecord, *budgets: BudgetLimits) -> BudgetCharge:
    return BudgetCharge(
        turn.request_id, turn.conversation_id, turn.lease, budgets, ask=BudgetAsk(10, 0.0, 0.0, 10)
    )


def _admit(
    store: Store,
    turn: TurnRecord,
    *,
    refuse: tuple[BudgetLimits, ...],
    budget: BudgetCharge | None = None,
    queued: list[bool] | None = None,
) -> AbstractAsyncContextManager[TurnAdmission]:
    return store.admit_turn(
        turn,
        _input(turn.request_id),
        lease_seconds=30,
        read_compaction=False,
        queued=(queued.append if queued is not None else lambda _: None),
        budget=budget,
        refuse=refuse,
    )


async def _spend(store: Store, tokens: int, usd: float = 0.0) -> None:
    """A finished turn ``r0`` on conversation ``c`` left ``tokens`` and ``usd`` spent on its budget
    (a step reserved, then settled at what it used)."""
    turn = leased_turn("r0", "c", "a", start_time=T0)
    budgets = (BudgetLimits(CONVERSATION, conversation_id="c"),)
    async with _admit(store, turn, refuse=(), budget=_charge(turn, *budgets)) as admission:
        assert admission.budget is not None and admission.budget.refused is None
    await store.charge_budget(BudgetCharge("r0", "c", turn.lease, budgets, spent=(tokens, usd)))
    assert (await store.budget_spends([CONVERSATION]))[CONVERSATION] == BudgetSpend(tokens, usd)


def _stored(store_backend: StoreBackend) -> tuple[object, ...]:
    """Everything a refused admission must leave as it was."""
    return (
        store_backend.sql("SELECT request_id, state FROM turns ORDER BY request_id"),
        store_backend.sql("SELECT id FROM messages ORDER BY id"),
        store_backend.sql("SELECT * FROM budget_spend ORDER BY scope, scope_key, period"),
        store_backend.sql("SELECT request_id FROM budget_reservations"),
    )


@pytest.mark.parametrize("carried", ["none", "the budget's row", "another row"])
async def test_a_spent_budget_refuses_the_admission_and_nothing_is_stored(
    store: Store, store_backend: StoreBackend, carried: str
) -> None:
    await _spend(store, 1_000)
    before = _stored(store_backend)
    turn = leased_turn("r1", "c", "a", start_time=T0)
    budget = {
        "none": None,
        "the budget's row": _charge(turn, SPENT, BudgetLimits(TENANT_DAY, tokens=10_000)),
        "another row": _charge(turn, BudgetLimits(TENANT_DAY, tokens=10_000)),
    }[carried]
    with pytest.raises(BudgetSpent) as refused:
        async with _admit(store, turn, refuse=(SPENT,), budget=budget):
            pytest.fail("admitted")
    assert (refused.value.budget, refused.value.spend) == (SPENT, BudgetSpend(1_000))
    assert _stored(store_backend) == before
    # The conversation's lock (PostgreSQL: its ticket) was given back: the next turn is admitted.
    other = leased_turn("r2", "c", "a", start_time=T0)
    async with _admit(store, other, refuse=()):
        pass
    assert await store.get_turn("r2") is not None


async def test_a_spent_dollar_budget_refuses_and_one_with_room_admits(store: Store) -> None:
    await _spend(store, 10, usd=0.5)
    dollars = BudgetLimits(CONVERSATION, usd=0.5, conversation_id="c")
    turn = leased_turn("r1", "c", "a", start_time=T0)
    with pytest.raises(BudgetSpent):
        async with _admit(store, turn, refuse=(dollars,), budget=_charge(turn, dollars)):
            pass
    # Room for the first step's ask: its 10 tokens of prompt and 1 of output.
    roomy = BudgetLimits(CONVERSATION, tokens=21, usd=0.51, conversation_id="c")
    async with _admit(store, turn, refuse=(roomy,), budget=_charge(turn, roomy)) as admission:
        assert admission.budget is not None and admission.budget.refused is None
        assert admission.budget.output_tokens == 1
    assert await store.get_turn("r1") is not None


@pytest.mark.parametrize("unit", ["tokens", "usd"])
async def test_a_budget_without_room_for_the_first_step_refuses_and_nothing_is_stored(
    store: Store, store_backend: StoreBackend, unit: str
) -> None:
    """Not spent, but short of the first step's prompt and least output: that turn would end at
    its first step, unsent, its input stored for nothing; it is refused as a spent one is."""
    await _spend(store, 10, usd=0.5)
    before = _stored(store_backend)
    short = {
        "tokens": BudgetLimits(CONVERSATION, tokens=20, conversation_id="c"),  # 10 left, 11 asked
        "usd": BudgetLimits(CONVERSATION, usd=0.6, conversation_id="c"),  # $0.10 left, $0.11 asked
    }[unit]
    turn = leased_turn("r1", "c", "a", start_time=T0)
    ask = BudgetAsk(10, 0.1, 0.01, 10, 1)
    charge = BudgetCharge(turn.request_id, "c", turn.lease, (short, BudgetLimits(TENANT_DAY)), ask=ask)
    with pytest.raises(BudgetSpent) as refused:
        async with _admit(store, turn, refuse=(short,), budget=charge):
            pytest.fail("admitted")
    assert (refused.value.budget, refused.value.spend, refused.value.ask) == (
        short,
        BudgetSpend(10, 0.5),
        ask,
    )
    assert _stored(store_backend) == before
    # Without a first reservation to size it by, only a spent budget refuses: this one admits.
    async with _admit(store, turn, refuse=(short,)) as admission:
        assert admission.budget is None
    assert await store.get_turn("r1") is not None
    # Room enough for the least output admits, with the output clamped to what fits.
    roomy = BudgetLimits(CONVERSATION, tokens=22, conversation_id="c")
    later = leased_turn("r2", "c", "a", start_time=T0)
    charge = BudgetCharge("r2", "c", later.lease, (roomy,), ask=ask)
    async with _admit(store, later, refuse=(roomy,), budget=charge) as admission:
        assert admission.budget is not None and admission.budget.output_tokens == 2


async def test_a_turn_that_waited_in_line_is_checked_when_its_turn_comes(store: Store) -> None:
    """The check is the admitting transaction's, so it sees what the turn ahead spent: that turn
    ends with the budget spent while this one waits, and this one is refused then."""
    holder = leased_turn("r0", "c", "a", start_time=T0)
    release = asyncio.Event()

    async def ahead() -> None:
        async with _admit(store, holder, refuse=(SPENT,), budget=_charge(holder, SPENT)):
            await release.wait()
            await store.charge_budget(BudgetCharge("r0", "c", holder.lease, (SPENT,), spent=(1_000, None)))

    task = asyncio.create_task(ahead())

    async def holds() -> bool:
        return await store.get_turn("r0") is not None

    await wait_until(holds, what="the first turn holds the conversation")
    queued: list[bool] = []
    turn = leased_turn("r1", "c", "b", start_time=T0)

    async def behind() -> None:
        async with _admit(store, turn, refuse=(SPENT,), queued=queued):
            pytest.fail("admitted")

    waiting = asyncio.create_task(behind())
    await wait_until(lambda: queued == [True], what="the second turn waits in line")
    release.set()
    await task
    with pytest.raises(BudgetSpent):
        await waiting
    assert await store.get_turn("r1") is None
