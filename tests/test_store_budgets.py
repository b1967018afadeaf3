"""Budget charges in the store (``BudgetStore.charge_budget``, migration 0009_budgets; docs/cost.md
"Budgets"), on SQLite and PostgreSQL alike: a charge reserves the most that fits, refuses when
nothing does, settles the last step at its actual use, settles a lost attempt's reservation once,
is fenced like every turn write; a conversation's deletion takes its budgets along. And on one
PostgreSQL database shared by two replicas, two turns racing for the last of a budget: one wins."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt

import pytest
from support.stores import StoreBackend, leased_turn, postgres_database
from support.waiting import wait_until

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store, TurnRecord
from turnwire_server.store.core.budget_rules import Reservation, settle
from turnwire_server.store.errors import LeaseLost, MessageIdConflict
from turnwire_server.store.postgres import PostgresStore
from turnwire_server.store.records import (
    BudgetAsk,
    BudgetCharge,
    BudgetGrant,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
    SubmissionRecord,
)

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
LAPSED = T0 + dt.timedelta(seconds=31)
UNTIL = LAPSED + dt.timedelta(seconds=30)
CONVERSATION = BudgetKey("conversation", "c")
TENANT_DAY = BudgetKey("tenant/day", "", "2026-01-02")


async def _started(store: Store, request_id: str, conversation: str = "c") -> TurnRecord:
    turn = leased_turn(request_id, conversation, "a", start_time=T0)
    user = message_pb2.Message(id=f"u-{request_id}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    await store.start_turn(turn, [user])
    return turn


def _charge(
    turn: TurnRecord,
    *budgets: BudgetLimits,
    ask: BudgetAsk | None = None,
    spent: tuple[int | None, float | None] | None = None,
) -> BudgetCharge:
    return BudgetCharge(turn.request_id, turn.conversation_id, turn.lease, budgets, spent=spent, ask=ask)


def _ask(prompt: int, output: int, *, usd_in: float = 0.0, usd_out: float = 0.0) -> BudgetAsk:
    return BudgetAsk(prompt, prompt * usd_in, usd_out, output)


async def test_a_step_reserves_what_fits_and_settles_at_its_actual_use(store: Store) -> None:
    turn = await _started(store, "r1")
    budget = BudgetLimits(CONVERSATION, tokens=1_000, conversation_id="c")
    grant = await store.charge_budget(_charge(turn, budget, ask=_ask(400, 800)))
    # 400 of prompt leaves room for 600 output tokens, not the 800 asked: clamped.
    assert (grant.output_tokens, grant.tokens, grant.refused) == (600, 1_000, None)
    assert grant.spends[CONVERSATION] == BudgetSpend(0, 0.0, 1_000, 0.0)

    # The step used 450 tokens: settled at that, the next step reserves from what is left.
    grant = await store.charge_budget(_charge(turn, budget, ask=_ask(500, 800), spent=(450, None)))
    assert (grant.output_tokens, grant.refused) == (50, None)
    assert grant.spends[CONVERSATION] == BudgetSpend(450, 0.0, 550, 0.0)

    # The turn ends: settled only; nothing reserved any more.
    grant = await store.charge_budget(_charge(turn, budget, spent=(520, None)))
    assert grant.spends[CONVERSATION] == BudgetSpend(970, 0.0, 0, 0.0)
    assert await store.budget_spends([CONVERSATION, TENANT_DAY]) == {
        CONVERSATION: BudgetSpend(970, 0.0, 0, 0.0)
    }


async def test_no_room_for_one_output_token_is_refused_and_reserves_nothing(store: Store) -> None:
    turn = await _started(store, "r1")
    tokens = BudgetLimits(CONVERSATION, tokens=1_000, conversation_id="c")
    usd = BudgetLimits(TENANT_DAY, usd=0.01)
    grant = await store.charge_budget(_charge(turn, tokens, usd, ask=_ask(1_000, 100)))
    assert (grant.output_tokens, grant.refused) == (0, CONVERSATION)
    # In US dollars: 0.004 of prompt, 0.001 per output token: room for 6 of the 100 asked.
    grant = await store.charge_budget(
        _charge(turn, tokens, usd, ask=_ask(100, 100, usd_in=4e-5, usd_out=1e-3))
    )
    assert (grant.output_tokens, grant.refused) == (6, None)
    assert grant.usd == pytest.approx(0.004 + 0.006)
    grant = await store.charge_budget(
        _charge(turn, tokens, usd, ask=_ask(100, 100, usd_in=4e-5, usd_out=1e-3))
    )
    # The first reservation was settled at what it reserved (no usage given): no room left.
    assert (grant.output_tokens, grant.refused) == (0, TENANT_DAY)
    state = (await store.budget_spends([TENANT_DAY]))[TENANT_DAY]
    assert (state.spent_tokens, state.reserved_tokens) == (106, 0)
    assert state.spent_usd == pytest.approx(0.01)


async def test_a_lost_attempts_reservation_is_settled_once_not_charged_twice(
    store: Store, store_backend: StoreBackend
) -> None:
    mine = await _started(store, "r1")
    budget = BudgetLimits(CONVERSATION, tokens=10_000, conversation_id="c")
    await store.charge_budget(_charge(mine, budget, ask=_ask(1_000, 2_000)))  # then the replica dies
    now = LAPSED if store_backend.name == "postgres" else T0
    (taken,) = await store.claim_interrupted_turns("b", now, UNTIL, 10)
    assert taken.lease_epoch == mine.lease_epoch + 1

    # The lost attempt's writes are fenced, its charges too.
    with pytest.raises(LeaseLost):
        await store.charge_budget(_charge(mine, budget, spent=(10, None)))
    # The recovered attempt's first charge settles the lost reservation at what it reserved,
    # once, and reserves its own step; its settlement counts its actual use only.
    grant = await store.charge_budget(_charge(taken, budget, ask=_ask(1_000, 2_000), spent=(5, None)))
    assert grant.spends[CONVERSATION] == BudgetSpend(3_000, 0.0, 3_000, 0.0)
    grant = await store.charge_budget(_charge(taken, budget, spent=(1_200, None)))
    assert grant.spends[CONVERSATION] == BudgetSpend(4_200, 0.0, 0, 0.0)


async def test_the_final_writes_settlement_charges_a_lost_attempt_at_its_reservation_and_its_own_at_use(
    store: Store, store_backend: StoreBackend
) -> None:
    # The settlement's rule (budget_writes._SETTLE) on the final write's path (the settlement
    # alone, one batch): a reservation of the lost attempt's epoch at what it reserved, whatever
    # the use given; this attempt's at its use where known (tokens), at what it reserved where
    # not (US dollars).
    budgets = (
        BudgetLimits(CONVERSATION, tokens=10_000, conversation_id="c"),
        BudgetLimits(TENANT_DAY, usd=10.0),
    )
    ask = _ask(1_000, 2_000, usd_in=1e-3, usd_out=1e-3)  # 3 000 tokens, 3.0 US dollars
    mine = await _started(store, "r1")
    await store.charge_budget(_charge(mine, *budgets, ask=ask))
    now = LAPSED if store_backend.name == "postgres" else T0
    (taken,) = await store.claim_interrupted_turns("b", now, UNTIL, 10)
    grant = await store.finish_turn(_ended(taken), None, budget=_charge(taken, *budgets, spent=(150, 0.01)))
    assert grant is not None
    for key in (CONVERSATION, TENANT_DAY):
        state = grant.spends[key]
        assert (state.spent_tokens, state.reserved_tokens, state.reserved_usd) == (3_000, 0, 0.0)
        assert state.spent_usd == pytest.approx(3.0)
    assert await store.budget_spends([CONVERSATION, TENANT_DAY]) == grant.spends
    assert (await store.charge_budget(BudgetCharge("r1", "c", None, ()))).spends == {}  # nothing left

    other = await _started(store, "r2", "c2")
    own = (BudgetLimits(BudgetKey("conversation", "c2"), tokens=10_000, conversation_id="c2"), budgets[1])
    await store.charge_budget(_charge(other, *own, ask=ask))
    grant = await store.finish_turn(_ended(other), None, budget=_charge(other, *own, spent=(150, None)))
    assert grant is not None
    state = grant.spends[BudgetKey("conversation", "c2")]
    assert (state.spent_tokens, state.reserved_tokens) == (150, 0)
    assert state.spent_usd == pytest.approx(3.0)  # the unknown cost at what it reserved
    assert grant.spends[TENANT_DAY].spent_usd == pytest.approx(6.0)


async def test_an_abandoned_turns_settlement_charges_every_reservation_at_what_it_reserved(
    store: Store,
) -> None:
    # A lost attempt's charge (abandoned_charge's, with no lease): no use, each reservation at
    # what it reserved, once.
    mine = await _started(store, "r1")
    budgets = (
        BudgetLimits(CONVERSATION, tokens=10_000, conversation_id="c"),
        BudgetLimits(TENANT_DAY, usd=1.0),
    )
    await store.charge_budget(_charge(mine, *budgets, ask=_ask(100, 100, usd_in=1e-3, usd_out=1e-3)))
    grant = await store.charge_budget(BudgetCharge("r1", "c", None, ()))
    for key in (CONVERSATION, TENANT_DAY):
        state = grant.spends[key]
        assert (state.spent_tokens, state.reserved_tokens, state.reserved_usd) == (200, 0, 0.0)
        assert state.spent_usd == pytest.approx(0.2)
    assert (await store.charge_budget(BudgetCharge("r1", "c", None, ()))).spends == {}
    assert await store.budget_spends([CONVERSATION, TENANT_DAY]) == grant.spends


async def test_a_settlement_reports_a_charged_budget_it_reserved_nothing_on(store: Store) -> None:
    # The final settlement after midnight charges today's budget, on which the turn reserved
    # nothing: its state (another turn's spend) is read, not reported as zero; no row is made.
    other = await _started(store, "r0", "c0")
    today = BudgetKey("tenant/day", "", "2026-01-03")
    await store.charge_budget(_charge(other, BudgetLimits(today, tokens=5_000), ask=_ask(10, 10)))
    turn = await _started(store, "r1")
    conversation = BudgetLimits(CONVERSATION, tokens=10_000, conversation_id="c")
    await store.charge_budget(_charge(turn, conversation, ask=_ask(100, 100)))
    limits = (conversation, BudgetLimits(today, tokens=5_000), BudgetLimits(TENANT_DAY, tokens=5_000))
    grant = await store.finish_turn(_ended(turn), None, budget=_charge(turn, *limits, spent=(150, None)))
    assert grant is not None and grant.spends == {
        CONVERSATION: BudgetSpend(150, 0.0, 0, 0.0),
        today: BudgetSpend(0, 0.0, 20, 0.0),
        TENANT_DAY: BudgetSpend(),
    }
    assert TENANT_DAY not in await store.budget_spends([TENANT_DAY])
    # A deleted conversation's turn: nothing settled, nothing reported.
    assert await store.delete_conversation("c0")
    late = await store.charge_budget(_charge(other, BudgetLimits(today, tokens=5_000), spent=(1, None)))
    assert late.spends == {}


@pytest.mark.parametrize("lost", [False, True], ids=["own", "lost"])
@pytest.mark.parametrize("spent", [(150, 0.25), (150, None), (None, 0.25), None], ids=str)
async def test_the_sql_settlement_agrees_with_the_rule(
    store: Store, store_backend: StoreBackend, lost: bool, spent: tuple[int | None, float | None] | None
) -> None:
    # A charge without an ask settles in SQL (budget_writes._SETTLE), one with an ask by
    # budget_rules.settle: the same states from the same reservations, on the final write's path.
    other = await _started(store, "r0", "c0")  # the day's row holds another turn's reservation too
    budgets = (
        BudgetLimits(CONVERSATION, tokens=10_000, conversation_id="c"),
        BudgetLimits(TENANT_DAY, usd=10.0),
    )
    await store.charge_budget(_charge(other, budgets[1], ask=_ask(300, 100, usd_in=1e-3, usd_out=3e-3)))
    turn = await _started(store, "r1")
    reserved = await store.charge_budget(
        _charge(turn, *budgets, ask=_ask(1_000, 2_000, usd_in=1e-3, usd_out=1e-3))
    )
    charging = turn
    if lost:
        now = LAPSED if store_backend.name == "postgres" else T0
        (charging,) = [
            t for t in await store.claim_interrupted_turns("b", now, UNTIL, 10) if t.request_id == "r1"
        ]
    stored = [Reservation(b.key, turn.lease_epoch, reserved.tokens, reserved.usd) for b in budgets]
    expected = settle(reserved.spends, stored, epoch=charging.lease_epoch, spent=spent)
    grant = await store.finish_turn(_ended(charging), None, budget=_charge(charging, *budgets, spent=spent))
    assert grant is not None and grant.spends == expected
    assert await store.budget_spends([b.key for b in budgets]) == expected


def _ended(turn: TurnRecord) -> TurnRecord:
    return dataclasses.replace(turn, state="completed", end_time=T0 + dt.timedelta(seconds=1))


async def test_the_turns_end_settles_its_budgets_in_the_same_transaction(store: Store) -> None:
    turn = await _started(store, "r1")
    budget = BudgetLimits(CONVERSATION, tokens=1_000, conversation_id="c")
    await store.charge_budget(_charge(turn, budget, ask=_ask(400, 500)))
    reply = message_pb2.Message(id="tw-a-r1", role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().text.text = "done"
    grant = await store.finish_turn(_ended(turn), reply, budget=_charge(turn, budget, spent=(450, None)))
    assert grant is not None and grant.spends[CONVERSATION] == BudgetSpend(450, 0.0, 0, 0.0)
    stored = await store.get_turn("r1")
    assert stored is not None and stored.state == "completed"
    assert await store.budget_spends([CONVERSATION]) == {CONVERSATION: BudgetSpend(450, 0.0, 0, 0.0)}
    # Without a charge, nothing of budgets is touched (and nothing returned).
    other = await _started(store, "r2")
    assert await store.finish_turn(_ended(other), None) is None


async def test_a_fenced_turns_end_settles_nothing(store: Store, store_backend: StoreBackend) -> None:
    mine = await _started(store, "r1")
    budget = BudgetLimits(CONVERSATION, tokens=10_000, conversation_id="c")
    await store.charge_budget(_charge(mine, budget, ask=_ask(1_000, 2_000)))
    now = LAPSED if store_backend.name == "postgres" else T0
    (taken,) = await store.claim_interrupted_turns("b", now, UNTIL, 10)
    with pytest.raises(LeaseLost):
        await store.finish_turn(_ended(mine), None, budget=_charge(mine, budget, spent=(10, None)))
    # Neither its end nor its settlement landed: the taker settles the lost reservation once.
    assert await store.budget_spends([CONVERSATION]) == {CONVERSATION: BudgetSpend(0, 0.0, 3_000, 0.0)}
    grant = await store.finish_turn(_ended(taken), None, budget=_charge(taken, budget, spent=(5, None)))
    assert grant is not None and grant.spends[CONVERSATION] == BudgetSpend(3_000, 0.0, 0, 0.0)


async def test_a_steps_checkpoint_rides_its_charge_fenced_alike(
    store: Store, store_backend: StoreBackend
) -> None:
    mine = await _started(store, "r1")
    budget = BudgetLimits(CONVERSATION, tokens=10_000, conversation_id="c")
    reply = message_pb2.Message(id="tw-a-r1", role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().text.text = "step one"
    grant = await store.charge_budget(_charge(mine, budget, ask=_ask(100, 200)), checkpoint=reply)
    assert grant.spends[CONVERSATION] == BudgetSpend(0, 0.0, 300, 0.0)
    assert [m.id for m in await store.load_messages("c")] == ["u-r1", "tw-a-r1"]

    now = LAPSED if store_backend.name == "postgres" else T0
    (taken,) = await store.claim_interrupted_turns("b", now, UNTIL, 10)
    reply.parts.add().text.text = "step two"
    with pytest.raises(LeaseLost):  # the lost attempt's: neither its charge nor its checkpoint
        await store.charge_budget(_charge(mine, budget, ask=_ask(100, 200)), checkpoint=reply)
    (stored,) = [m for m in await store.load_messages("c") if m.id == "tw-a-r1"]
    assert len(stored.parts) == 1
    assert await store.budget_spends([CONVERSATION]) == {CONVERSATION: BudgetSpend(0, 0.0, 300, 0.0)}
    await store.charge_budget(_charge(taken, budget, ask=_ask(100, 200)), checkpoint=reply)
    (stored,) = [m for m in await store.load_messages("c") if m.id == "tw-a-r1"]
    assert len(stored.parts) == 2


async def test_a_charge_naming_no_budget_settles_what_the_turn_reserved(store: Store) -> None:
    # A turn left interrupted, its budgets no longer configured: its reservation is settled all the same.
    turn = await _started(store, "r1")
    await store.charge_budget(_charge(turn, BudgetLimits(TENANT_DAY, tokens=5_000), ask=_ask(100, 100)))
    grant = await store.charge_budget(BudgetCharge("r1", "c", None, ()))
    assert grant.spends == {TENANT_DAY: BudgetSpend(200, 0.0, 0, 0.0)}
    assert (await store.charge_budget(BudgetCharge("r1", "c", None, ()))).spends == {}  # nothing left


async def test_a_turn_budget_keeps_its_lower_stored_limit(store: Store) -> None:
    turn = await _started(store, "r1")
    key = BudgetKey("turn", "r1")
    # The request lowered its turn budget to 500; a recovery knows only the configured 5 000.
    await store.charge_budget(
        _charge(turn, BudgetLimits(key, tokens=500, conversation_id="c"), ask=_ask(100, 100))
    )
    grant = await store.charge_budget(
        _charge(
            turn,
            BudgetLimits(key, tokens=5_000, conversation_id="c"),
            ask=_ask(100, 1_000),
            spent=(150, None),
        )
    )
    assert grant.output_tokens == 250  # 500 - 150 spent - 100 of prompt


async def test_deleting_a_conversation_deletes_its_budgets_not_its_tenants(store: Store) -> None:
    turn = await _started(store, "r1")
    budgets = (
        BudgetLimits(BudgetKey("turn", "r1"), tokens=5_000, conversation_id="c"),
        BudgetLimits(CONVERSATION, tokens=5_000, conversation_id="c"),
        BudgetLimits(TENANT_DAY, tokens=5_000),
    )
    await store.charge_budget(_charge(turn, *budgets, ask=_ask(100, 100)))
    assert await store.delete_conversation("c")
    # The running step's reservation on the tenant is settled at what it reserved (the provider
    # may have billed it), not left reserved forever.
    assert await store.budget_spends([b.key for b in budgets]) == {TENANT_DAY: BudgetSpend(200, 0.0, 0, 0.0)}


async def test_a_turn_running_past_midnight_settles_yesterday_and_reserves_today(store: Store) -> None:
    # Each step rewrites the turn's reservations in place; one of a budget the step no longer
    # charges (yesterday's) is settled and removed, the day's new one reserved.
    turn = await _started(store, "r1")
    today = BudgetKey("tenant/day", "", "2026-01-03")
    conversation = BudgetLimits(CONVERSATION, tokens=10_000, conversation_id="c")
    await store.charge_budget(
        _charge(turn, conversation, BudgetLimits(TENANT_DAY, tokens=5_000), ask=_ask(100, 100))
    )
    grant = await store.charge_budget(
        _charge(turn, conversation, BudgetLimits(today, tokens=5_000), ask=_ask(300, 100), spent=(150, None))
    )
    assert grant.spends == {
        CONVERSATION: BudgetSpend(150, 0.0, 400, 0.0),
        TENANT_DAY: BudgetSpend(150, 0.0, 0, 0.0),
        today: BudgetSpend(0, 0.0, 400, 0.0),
    }
    grant = await store.charge_budget(
        _charge(turn, conversation, BudgetLimits(today, tokens=5_000), spent=(350, None))
    )
    assert await store.budget_spends([CONVERSATION, TENANT_DAY, today]) == {
        CONVERSATION: BudgetSpend(500, 0.0, 0, 0.0),
        TENANT_DAY: BudgetSpend(150, 0.0, 0, 0.0),
        today: BudgetSpend(350, 0.0, 0, 0.0),
    }


async def test_a_deleted_conversations_turn_charges_nothing_and_leaves_no_row(store: Store) -> None:
    # Its turn's late writes find it gone: a checkpoint carrying a charge (the charge then reads
    # no token of its own) and a final write carrying the settlement store no budget row.
    turn = await _started(store, "r1")
    assert await store.delete_conversation("c")
    budgets = (
        BudgetLimits(CONVERSATION, tokens=5_000, conversation_id="c"),
        BudgetLimits(TENANT_DAY, tokens=5_000),
    )
    reply = message_pb2.Message(id="tw-a-r1", role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().text.text = "late"
    grant = await store.charge_budget(_charge(turn, *budgets, ask=_ask(100, 100)), checkpoint=reply)
    assert (grant.output_tokens, grant.spends) == (100, {})
    grant = await store.charge_budget(_charge(turn, *budgets, ask=_ask(100, 100)))
    assert (grant.output_tokens, grant.spends) == (100, {})
    assert await store.budget_spends([b.key for b in budgets]) == {}


async def test_a_submission_keeps_who_submitted_it(store: Store) -> None:
    submission = SubmissionRecord(
        submission_id="s1",
        conversation_id="c",
        idempotency_key=None,
        state="pending",
        request=b"request",
        create_time=T0,
        principal="alice",
    )
    created, _ = await store.create_submission(submission, max_open=10)
    assert created.principal == "alice"
    stored = await store.get_submission("s1")
    assert stored is not None and stored.principal == "alice"


async def test_two_replicas_racing_for_the_last_of_a_budget_one_gets_it() -> None:
    """Two PostgreSQL replicas, a turn each on two conversations of one tenant, a tenant budget
    with room for one step: however the charges interleave, exactly one is granted."""
    with postgres_database() as url:
        replicas = [PostgresStore(url), PostgresStore(url)]
        for replica in replicas:
            await replica.open()
        try:
            for round_number in range(20):
                key = BudgetKey("tenant/day", f"t{round_number}", "2026-01-02")
                budget = BudgetLimits(key, tokens=2_000)
                first, *turns = [
                    await _started(replica, f"r{round_number}-{n}", f"t{round_number}/c{n}")
                    for n, replica in enumerate([replicas[0], *replicas])
                ]
                # An earlier step holds 500 (the row exists: the race is on its lock, not its insert).
                await replicas[0].charge_budget(
                    BudgetCharge(
                        first.request_id, first.conversation_id, first.lease, (budget,), ask=_ask(499, 1)
                    )
                )
                grants = await asyncio.gather(
                    *(
                        replica.charge_budget(
                            BudgetCharge(
                                turn.request_id,
                                turn.conversation_id,
                                turn.lease,
                                (budget,),
                                ask=_ask(500, 500),
                            )
                        )
                        for replica, turn in zip(replicas, turns, strict=True)
                    )
                )
                assert sorted(g.refused is None for g in grants) == [False, True], grants
                assert (await replicas[0].budget_spends([key]))[key] == BudgetSpend(0, 0.0, 1_500, 0.0)
        finally:
            for replica in replicas:
                await replica.close()


async def test_two_replicas_admitting_turns_for_the_last_of_a_budget_one_gets_it() -> None:
    """The same race between two admissions, each charge riding the one flight that admits its
    turn (PostgreSQL): the second to take the row's lock sees the first's reservation and is
    refused; the row holds one reservation."""
    with postgres_database() as url:
        replicas = [PostgresStore(url), PostgresStore(url)]
        for replica in replicas:
            await replica.open()
        try:
            for round_number in range(20):
                key = BudgetKey("tenant/day", f"t{round_number}", "2026-01-02")
                budget = BudgetLimits(key, tokens=2_000)
                first = await _started(replicas[0], f"r{round_number}-0", f"t{round_number}/c0")
                await replicas[0].charge_budget(
                    BudgetCharge(
                        first.request_id, first.conversation_id, first.lease, (budget,), ask=_ask(499, 1)
                    )
                )

                turns = [
                    leased_turn(f"r{round_number}-{n}", f"t{round_number}/c{n}", "a", start_time=T0)
                    for n in (1, 2)
                ]
                grants = await asyncio.gather(
                    *(
                        _admitted(replica, turn, _charge(turn, budget, ask=_ask(500, 500)))
                        for replica, turn in zip(replicas, turns, strict=True)
                    )
                )
                assert sorted(g.refused is None for g in grants) == [False, True], grants
                assert (await replicas[0].budget_spends([key]))[key] == BudgetSpend(0, 0.0, 1_500, 0.0)
        finally:
            for replica in replicas:
                await replica.close()


def _input(request_id: str, message_id: str | None = None) -> list[message_pb2.Message]:
    user = message_pb2.Message(id=message_id or f"u-{request_id}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    return [user]


async def test_a_turns_first_reservation_rides_the_commit_of_its_input(store: Store) -> None:
    """``admit_turn``'s ``budget``: on the path every backend carries it (waiting behind a running
    turn, then ``start_turn``'s transaction), the grant comes back and the reservation is stored
    with the input; the settlement later finds it like any step's."""
    budget = BudgetLimits(CONVERSATION, tokens=1_000, conversation_id="c")
    first = leased_turn("r1", "c", "a1", start_time=T0)
    second = leased_turn("r2", "c", "a2", start_time=T0)
    queued: list[bool] = []

    async def admit_second() -> BudgetGrant | None:
        charge = _charge(second, budget, ask=_ask(100, 300))
        async with store.admit_turn(
            second, _input("r2"), lease_seconds=30, read_compaction=False, queued=queued.append, budget=charge
        ) as admission:
            return admission.budget

    async with store.admit_turn(
        first, _input("r1"), lease_seconds=30, read_compaction=False, queued=lambda _: None
    ):
        waiting = asyncio.create_task(admit_second())
        await wait_until(lambda: queued == [True], what="the second turn waits in line")
    grant = await waiting
    assert grant is not None and (grant.output_tokens, grant.tokens, grant.refused) == (300, 400, None)
    assert (await store.budget_spends([CONVERSATION]))[CONVERSATION] == BudgetSpend(0, 0.0, 400, 0.0)
    assert [m.id for m in await store.load_messages("c")] == ["u-r1", "u-r2"]
    settled = await store.charge_budget(_charge(second, budget, spent=(0, 0.0)))
    assert settled.spends[CONVERSATION] == BudgetSpend(0, 0.0, 0, 0.0)


async def test_an_idle_conversations_admission_carries_the_first_reservation(
    store: Store, store_backend: StoreBackend
) -> None:
    """On the idle path too (PostgreSQL: the one-flight admission, its charge's reads answered with
    the flight's, its writes sent with the COMMIT): the grant comes back, the reservation stored."""
    budget = BudgetLimits(CONVERSATION, tokens=1_000, conversation_id="c")
    turn = leased_turn("r1", "c", "a1", start_time=T0)
    queued: list[bool] = []
    async with store.admit_turn(
        turn,
        _input("r1"),
        lease_seconds=30,
        read_compaction=False,
        queued=queued.append,
        budget=_charge(turn, budget, ask=_ask(100, 300)),
    ) as admission:
        assert admission.budget is not None
        assert (admission.budget.output_tokens, admission.budget.tokens) == (300, 400)
        assert admission.history is None or [m.id for m in admission.history] == ["u-r1"]
    if store_backend.name == "postgres":
        assert queued == []  # the one flight: it never took the waiting path
    assert (await store.budget_spends([CONVERSATION]))[CONVERSATION] == BudgetSpend(0, 0.0, 400, 0.0)
    assert [m.id for m in await store.load_messages("c")] == ["u-r1"]


async def test_an_admission_whose_reservation_is_refused_still_stores_the_input(store: Store) -> None:
    spent = await _started(store, "r0")
    budget = BudgetLimits(CONVERSATION, tokens=100, conversation_id="c")
    await store.charge_budget(_charge(spent, budget, ask=_ask(50, 50)))
    turn = await _started(store, "r1")  # a turn with the input stored, as the waiting path's
    await store.finish_turn(dataclasses.replace(turn, state="completed"), None)
    late = leased_turn("r2", "c", "a2", start_time=T0)
    charge = _charge(late, budget, ask=_ask(10, 10))
    async with store.admit_turn(
        late, _input("r2"), lease_seconds=30, read_compaction=False, queued=lambda _: None, budget=charge
    ) as admission:
        # No room: nothing reserved, the admission not refused (the step refuses it, §"Budgets").
        assert admission.budget is None or admission.budget.refused == CONVERSATION
    assert "u-r2" in [m.id for m in await store.load_messages("c")]
    assert (await store.budget_spends([CONVERSATION]))[CONVERSATION] == BudgetSpend(0, 0.0, 100, 0.0)


async def test_an_admission_refused_by_its_input_rules_reserves_nothing(store: Store) -> None:
    await _started(store, "r1")
    budget = BudgetLimits(CONVERSATION, tokens=1_000, conversation_id="c")
    clash = _input("r2", message_id="u-r1")
    clash[0].parts[0].text.text = "another text under a stored id"
    turn = leased_turn("r2", "c", "a2", start_time=T0)
    with pytest.raises(MessageIdConflict):
        async with store.admit_turn(
            turn,
            clash,
            lease_seconds=30,
            read_compaction=False,
            queued=lambda _: None,
            budget=_charge(turn, budget, ask=_ask(10, 10)),
        ):
            pass
    assert await store.budget_spends([CONVERSATION]) == {}
    assert await store.get_turn("r2") is None


# A turn's first charge riding its admission (``charge_budget(..., admitting=True)``, joined to the
# transaction that starts the turn, or on PostgreSQL the one flight) stores and grants what a
# charge of the same ask on a started turn does, from the same states (two worlds, apart by their
# keys, in one store). A charge that adds its ask to the rows as it takes them and decides on the
# rows less the ask (tried in stop 53) fails the dollar cases below: (a + b) - b is not a.
_ADMISSION_CASES = {
    # case: (the neighbour's ask, the limits it charged under, the ask, the limits charged now)
    "fits whole": (
        _ask(100, 100, usd_in=1e-6, usd_out=2e-6),
        (5_000, 1.0),
        _ask(200, 300, usd_in=1e-6, usd_out=2e-6),
        (5_000, 1.0),
    ),
    "clamped by tokens": (_ask(100, 600), (1_000, None), _ask(200, 300), (1_000, None)),
    "clamped by dollars": (
        _ask(0, 0, usd_in=0.1),
        (None, 0.5),
        _ask(1, 10, usd_in=0.1, usd_out=0.05),
        (None, 0.5),
    ),
    "refused": (_ask(600, 400), (1_000, None), _ask(10, 10), (1_000, None)),
    "limits changed": (_ask(100, 100), (900, None), _ask(100, 100), (5_000, None)),
}


def _world_budgets(world: str, tokens: int | None, usd: float | None) -> tuple[BudgetLimits, ...]:
    """World ``world``'s budgets: its conversation's (``c<world>``) and its tenant's day."""
    return (
        BudgetLimits(BudgetKey("conversation", f"c{world}"), tokens, usd, f"c{world}"),
        BudgetLimits(BudgetKey("tenant/day", world, "2026-01-02"), tokens, usd),
    )


@pytest.mark.parametrize("case", sorted(_ADMISSION_CASES))
async def test_the_admissions_charge_agrees_with_the_general_charge(store: Store, case: str) -> None:
    before, before_limits, ask, limits = _ADMISSION_CASES[case]
    outcomes = []
    for world in ("a", "g"):
        conversation = f"c{world}"
        keys = [budget.key for budget in _world_budgets(world, None, None)]
        neighbour = await _started(store, f"n{world}", conversation)
        await store.charge_budget(_charge(neighbour, *_world_budgets(world, *before_limits), ask=before))
        turn = leased_turn(f"r{world}", conversation, "a", start_time=T0)
        charge = _charge(turn, *_world_budgets(world, *limits), ask=ask)
        if world == "a":
            grant = await _admitted(store, turn, charge)
        else:
            await store.start_turn(turn, _input(turn.request_id))
            grant = await store.charge_budget(charge)
        # A later step of the neighbour, settling and asking again: it meets the limits stored.
        later = await store.charge_budget(
            _charge(neighbour, *_world_budgets(world, *limits), ask=_ask(1, 50), spent=(150, 0.0))
        )
        outcomes.append(
            (
                (grant.output_tokens, grant.tokens, grant.usd, grant.refused and grant.refused.scope),
                [grant.spends.get(key) for key in keys],
                [(await store.budget_spends([key])).get(key) for key in keys],
                (later.output_tokens, later.refused and later.refused.scope),
            )
        )
    admitted, general = outcomes
    assert admitted == general


async def test_an_admission_under_a_retried_request_id_settles_what_its_earlier_attempt_reserved(
    store: Store,
) -> None:
    """A request id retried after its turn failed with a reservation left (its settlement did not
    happen): the retry's admission settles that reservation at what it reserved (as a lost
    attempt's) and reserves its own, on the turn's lower stored limit."""
    key = BudgetKey("turn", "r1")
    turn = await _started(store, "r1")
    # The request lowered its turn budget to 500; it reserves 100 + 100.
    await store.charge_budget(
        _charge(turn, BudgetLimits(key, tokens=500, conversation_id="c"), ask=_ask(100, 100))
    )
    await store.finish_turn(dataclasses.replace(turn, state="error"), None)  # nothing settled
    retry = leased_turn("r1", "c", "b", start_time=T0)
    charge = _charge(retry, BudgetLimits(key, tokens=5_000, conversation_id="c"), ask=_ask(100, 1_000))
    grant = await _admitted(store, retry, charge)
    # 500 - 200 settled - 100 of prompt: 200 output tokens, on the stored limit of 500.
    assert (grant.output_tokens, grant.tokens, grant.refused) == (200, 300, None)
    assert grant.spends[key] == BudgetSpend(200, 0.0, 300, 0.0)
    assert await store.budget_spends([key]) == {key: BudgetSpend(200, 0.0, 300, 0.0)}
    # One reservation left, the retry's: the final settlement charges it at its use.
    settled = await store.charge_budget(
        _charge(retry, BudgetLimits(key, tokens=5_000, conversation_id="c"), spent=(250, None))
    )
    assert settled.spends[key] == BudgetSpend(450, 0.0, 0, 0.0)


async def test_an_admission_under_a_retried_request_id_keeps_the_turns_lower_stored_limit(
    store: Store,
) -> None:
    # Nothing left reserved this time: only the stored limit (500, the request's own) differs
    # from the one charged now (a recovery's, or a retry's, knows only the configured 5 000).
    key = BudgetKey("turn", "r1")
    turn = await _started(store, "r1")
    await store.charge_budget(
        _charge(turn, BudgetLimits(key, tokens=500, conversation_id="c"), ask=_ask(100, 100))
    )
    await store.charge_budget(
        _charge(turn, BudgetLimits(key, tokens=500, conversation_id="c"), spent=(150, None))
    )
    await store.finish_turn(dataclasses.replace(turn, state="error"), None)
    retry = leased_turn("r1", "c", "b", start_time=T0)
    charge = _charge(retry, BudgetLimits(key, tokens=5_000, conversation_id="c"), ask=_ask(100, 1_000))
    grant = await _admitted(store, retry, charge)
    assert (grant.output_tokens, grant.refused) == (250, None)  # 500 - 150 - 100
    assert [(b.key, b.tokens) for b in grant.budgets] == [(key, 500)]
    assert await store.budget_spends([key]) == {key: BudgetSpend(150, 0.0, 350, 0.0)}


# Agreement at US dollar boundaries, the rows' states set directly: the last bits of a double
# decide whether a step's output is clamped by one token, and whether a settled row is back at 0
# (a charge that derived a row's earlier state from its later one, (a + b) - b, got them wrong).
_DOLLAR_CASES = {
    # case: (spent_usd, reserved_usd, the token limit, the dollar limit, the ask)
    "refused by tokens, dollars reserved": (0.0, 0.1, 100, None, BudgetAsk(200, 0.2, 0.0, 10)),
    "clamped at a dollar boundary": (
        0.0,
        0.9533275000000041,
        None,
        1.0,
        BudgetAsk(18653, 18653 * 2.5e-6, 4e-6, 10),
    ),
    "one token at a dollar boundary": (
        0.6241640507547823,
        0.31771684924521776,
        None,
        1.0,
        BudgetAsk(19373, 19373 * 3e-6, 1e-7, 1),
    ),
}


@pytest.mark.parametrize("case", sorted(_DOLLAR_CASES))
async def test_the_admissions_charge_agrees_at_dollar_boundaries(
    store: Store, store_backend: StoreBackend, case: str
) -> None:
    spent_usd, reserved_usd, tokens, usd, ask = _DOLLAR_CASES[case]
    outcomes = []
    for world in ("a", "g"):
        key = BudgetKey("tenant/day", world, "2026-01-02")
        store_backend.sql(
            "INSERT INTO budget_spend (scope, scope_key, period, spent_tokens, spent_usd, reserved_tokens,"
            " reserved_usd, limit_tokens, limit_usd) VALUES (?, ?, ?, 0, ?, 0, ?, ?, ?)",
            (*key, spent_usd, reserved_usd, tokens, usd),
        )
        turn = leased_turn(f"r{world}", f"{world}/c", "a", start_time=T0)
        charge = _charge(turn, BudgetLimits(key, tokens, usd), ask=ask)
        if world == "a":
            grant = await _admitted(store, turn, charge)
        else:
            await store.start_turn(turn, _input(turn.request_id))
            grant = await store.charge_budget(charge)
        stored = (await store.budget_spends([key]))[key]
        outcomes.append(
            (grant.output_tokens, grant.refused and grant.refused.scope, grant.spends[key], stored)
        )
    assert outcomes[0] == outcomes[1]


async def _admitted(store: Store, turn: TurnRecord, charge: BudgetCharge) -> BudgetGrant:
    """``turn`` admitted (its input ``_input``) with ``charge`` riding the admission: its grant."""
    async with store.admit_turn(
        turn,
        _input(turn.request_id),
        lease_seconds=30,
        read_compaction=False,
        queued=lambda _: None,
        budget=charge,
    ) as admission:
        assert admission.budget is not None
        return admission.budget


async def test_a_retried_request_ids_admission_settles_its_leftover_reservation_under_the_same_limits(
    store: Store,
) -> None:
    budget = BudgetLimits(TENANT_DAY, tokens=10_000)
    first = leased_turn("r1", "c", "a", start_time=T0)
    await _admitted(store, first, _charge(first, budget, ask=_ask(100, 100)))
    await store.finish_turn(dataclasses.replace(first, state="error"), None)  # 200 left reserved
    retry = leased_turn("r1", "c", "b", start_time=T0)
    grant = await _admitted(store, retry, _charge(retry, budget, ask=_ask(100, 300)))
    assert (grant.output_tokens, grant.refused) == (300, None)
    # The leftover settled at what it reserved (a lost attempt's), the retry's 400 reserved.
    assert await store.budget_spends([TENANT_DAY]) == {TENANT_DAY: BudgetSpend(200, 0.0, 400, 0.0)}


async def test_a_refused_admissions_charge_leaves_no_reservation(
    store: Store, store_backend: StoreBackend
) -> None:
    budget = BudgetLimits(TENANT_DAY, tokens=100)
    hog = leased_turn("r0", "c0", "a", start_time=T0)
    await _admitted(store, hog, _charge(hog, budget, ask=_ask(50, 50)))
    turn = leased_turn("r1", "c1", "a", start_time=T0)
    grant = await _admitted(store, turn, _charge(turn, budget, ask=_ask(10, 10)))
    assert grant.refused == TENANT_DAY
    assert store_backend.sql("SELECT scope FROM budget_reservations WHERE request_id = ?", ("r1",)) == []


async def test_an_admission_stores_a_turns_own_lower_limit_for_its_later_charges(store: Store) -> None:
    key = BudgetKey("turn", "r1")
    turn = leased_turn("r1", "c", "a", start_time=T0)
    grant = await _admitted(
        store, turn, _charge(turn, BudgetLimits(key, tokens=500, conversation_id="c"), ask=_ask(100, 100))
    )
    assert grant.output_tokens == 100
    # A later charge that knows only the configured 5 000 (a recovery's) meets the stored 500.
    later = await store.charge_budget(
        _charge(
            turn,
            BudgetLimits(key, tokens=5_000, conversation_id="c"),
            ask=_ask(100, 1_000),
            spent=(200, None),
        )
    )
    assert later.output_tokens == 200  # 500 - 200 spent - 100 of prompt
