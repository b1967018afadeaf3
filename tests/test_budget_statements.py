"""What a budgeted turn sends PostgreSQL (docs/cost.md, "What it costs per request"): a retried
request id's admission reads what its earlier attempt reserved; the turn's last settlement,
riding its final write, is one statement that locks the rows in key order, settles and deletes
the reservations. On SQLite a charge with an ask reads in one statement (the turn's token, its
reservations and the budget rows). The programs are driven here without a database (their answers given), to
count what each batch sends; the stores' tests run the same programs on real databases (a new
turn's first reservation in PostgreSQL's one flight: ``test_budget_flight.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnwire_server.store.core import budget_writes
from turnwire_server.store.core.sql import Program, Statement
from turnwire_server.store.postgres.db import DIALECT
from turnwire_server.store.records import (
    BudgetAsk,
    BudgetCharge,
    BudgetKey,
    BudgetLimits,
    TurnLease,
)
from turnwire_server.store.sqlite.db import DIALECT as SQLITE

TENANT_DAY = BudgetKey("tenant/day", "", "2026-01-02")
PRINCIPAL_DAY = BudgetKey("principal/day", "/p", "2026-01-02")
LEASE = TurnLease("r1", "replica-a", 3)
BUDGETS = (BudgetLimits(PRINCIPAL_DAY, tokens=10_000), BudgetLimits(TENANT_DAY, tokens=100_000))


def _batches(program: Program[Any], answers: Sequence[Sequence[Any]]) -> tuple[list[list[Statement]], Any]:
    """Every batch ``program`` sends, each answered by the next of ``answers`` (rows for each
    of its statements, looked up by position), and what it returns."""
    sent: list[list[Statement]] = []
    try:
        batch = next(program)
        for answer in answers:
            sent.append(list(batch))
            batch = program.send([answer[i] if i < len(answer) else [] for i in range(len(batch))])
        sent.append(list(batch))
        program.send([[] for _ in batch])
    except StopIteration as stop:
        return sent, stop.value
    raise AssertionError("the program sent more batches than were answered")


def _row(key: BudgetKey, spent: int = 0) -> tuple[Any, ...]:
    # A taken row: its key, spends (tokens, usd, reserved tokens, reserved usd), stored limits.
    return (*key, spent, 0.0, 0, 0.0, None, None)


def test_a_retried_request_ids_admission_still_reads_what_its_earlier_attempt_reserved() -> None:
    # The waiting path's start (admitting): its request id may have a row, and reservations.
    ask = BudgetAsk(prompt_tokens=500, prompt_usd=0.0, usd_per_output_token=0.0, max_output=1_000)
    charge = BudgetCharge("r1", "c1", LEASE, BUDGETS, ask=ask)

    sent, _ = _batches(budget_writes.admission_budget(charge, (), DIALECT, admitting=True), [[[], []]])

    assert any("budget_reservations" in s.sql for s in sent[0])


def test_the_last_settlement_is_one_statement_that_locks_in_key_order() -> None:
    charge = BudgetCharge("r1", "c1", LEASE, BUDGETS, spent=(700, None))
    settled = [_row(PRINCIPAL_DAY, 2_700), _row(TENANT_DAY, 9_700)]

    sent, grant = _batches(budget_writes.charge_budget(charge, DIALECT, fenced=True), [[settled]])

    assert len(sent) == 1 and len(sent[0]) == 1, [[s.sql for s in b] for b in sent]
    sql = sent[0][0].sql
    assert "ORDER BY scope, scope_key, period FOR UPDATE" in sql and "DELETE FROM budget_reservations" in sql
    assert grant.spends[TENANT_DAY].spent_tokens == 9_700


def test_a_charge_on_sqlite_reads_in_one_statement() -> None:
    # The turn's token (unless its admission writes the turn), its reservations and the budget
    # rows, tagged by kind, in one statement; the token's row says the turn is recorded.
    ask = BudgetAsk(prompt_tokens=500, prompt_usd=0.0, usd_per_output_token=0.0, max_output=1_000)
    charge = BudgetCharge("r1", "c1", LEASE, BUDGETS, ask=ask)
    found = [
        (0, "replica-a", 3, None, None, None, None, None, None, None),
        (1, *TENANT_DAY, 2, 600, 0.0, None, None, None),
        (2, *_row(TENANT_DAY, 9_000)),
    ]

    step, grant = _batches(budget_writes.charge_budget(charge, SQLITE, fenced=True), [[found]])
    admitted, _ = _batches(budget_writes.admission_budget(charge, (), SQLITE, admitting=True), [[found[1:]]])

    for sent, reads_turn in ((step, True), (admitted, False)):
        assert len(sent[0]) == 1, [s.sql for s in sent[0]]
        sql = sent[0][0].sql
        assert "budget_reservations" in sql and "FROM budget_spend" in sql
        assert ("FROM turns" in sql) is reads_turn
    # The earlier attempt's reservation (epoch 2) settled at what it reserved, this step's reserved.
    assert grant.spends[TENANT_DAY].spent_tokens == 9_600
    assert grant.spends[TENANT_DAY].reserved_tokens == 1_500
