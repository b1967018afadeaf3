"""Budget charges and reads, once for both drivers (core programs,
:mod:`turnwire_server.store.core.sql`; the rules: docs/cost.md, "Budgets", and
:mod:`.budget_rules`).

A charge is one transaction: it reads the turn's fencing token (its row locked, :mod:`.fencing`)
and its stored reservations, then locks every budget row it touches in key order (created at
zero when missing), so charges racing from several replicas for one budget take turns on its row
and each sees the other's reservation (PostgreSQL: ``SELECT … FOR UPDATE`` after an
``INSERT … ON CONFLICT DO NOTHING``; SQLite applies writes one at a time). Sorted locks never
wait on each other in a cycle. Then it settles, reserves, and writes the rows back.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final, TypeVar

from turnwire_server.store.core.budget_rules import Reservation, fit_output, settle
from turnwire_server.store.core.fencing import holds_lease, lease_read
from turnwire_server.store.core.sql import Dialect, Program, Statement
from turnwire_server.store.records import BudgetCharge, BudgetGrant, BudgetKey, BudgetLimits, BudgetSpend

__all__ = ["charge_budget", "conversation_deleted", "kept_limits", "read_spends", "spends_from_rows"]

T = TypeVar("T", int, float)

_KEY: Final = "scope = ? AND scope_key = ? AND period = ?"
_SPEND_COLUMNS: Final = "spent_tokens, spent_usd, reserved_tokens, reserved_usd"
_ENSURE: Final = (
    "INSERT INTO budget_spend (scope, scope_key, period, conversation_id) VALUES (?, ?, ?, ?)"
    " ON CONFLICT (scope, scope_key, period) DO NOTHING"
)
_RESERVATIONS: Final = (
    "SELECT scope, scope_key, period, epoch, tokens, usd FROM budget_reservations WHERE request_id = ?"
)
_UPDATE: Final = (
    "UPDATE budget_spend SET spent_tokens = ?, spent_usd = ?, reserved_tokens = ?, reserved_usd = ?,"
    f" limit_tokens = ?, limit_usd = ? WHERE {_KEY}"
)
_SETTLE: Final = (
    "UPDATE budget_spend SET spent_tokens = ?, spent_usd = ?, reserved_tokens = ?, reserved_usd = ?"
    f" WHERE {_KEY}"
)
_RESERVE: Final = (
    "INSERT INTO budget_reservations (request_id, scope, scope_key, period, conversation_id, epoch,"
    " tokens, usd) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
)

_SUM: Final = (
    "(SELECT COALESCE(SUM(r.{column}), 0) FROM budget_reservations r WHERE r.conversation_id = ?"
    " AND r.scope = budget_spend.scope AND r.scope_key = budget_spend.scope_key"
    " AND r.period = budget_spend.period)"
)
_SETTLE_DELETED: Final = (
    f"UPDATE budget_spend SET spent_tokens = spent_tokens + {_SUM.format(column='tokens')},"
    f" reserved_tokens = reserved_tokens - {_SUM.format(column='tokens')},"
    f" spent_usd = spent_usd + {_SUM.format(column='usd')},"
    f" reserved_usd = reserved_usd - {_SUM.format(column='usd')}"
    " WHERE conversation_id IS NULL AND (scope, scope_key, period) IN"
    " (SELECT scope, scope_key, period FROM budget_reservations WHERE conversation_id = ?)"
)


def conversation_deleted(conversation_id: str) -> list[Statement]:
    """The statements removing a deleted conversation's budget rows (its turns' and its own),
    after its turns' rows (so they lock rows in a charge's order: the turn, then the budgets):
    what its running steps reserved on the budgets that stay (its tenant's) is settled at what it
    reserved first, as a lost attempt's is (the provider may have billed those steps)."""
    return [
        Statement(_SETTLE_DELETED, (conversation_id,) * 5),
        Statement("DELETE FROM budget_reservations WHERE conversation_id = ?", (conversation_id,)),
        Statement("DELETE FROM budget_spend WHERE conversation_id = ?", (conversation_id,)),
    ]


def _spend(row: Sequence[Any]) -> BudgetSpend:
    return BudgetSpend(int(row[0]), float(row[1]), int(row[2]), float(row[3]))


def charge_budget(charge: BudgetCharge, dialect: Dialect) -> Program[BudgetGrant]:
    """``BudgetStore.charge_budget``: settle ``charge.request_id``'s reservations and reserve
    ``charge.ask`` in one transaction. Raises :class:`LeaseLost` (writing nothing) when the
    turn's token is no longer ``charge.lease``; a turn no longer recorded (its conversation was
    deleted) is charged nothing."""
    found = yield [
        lease_read(charge.request_id, dialect),
        Statement(_RESERVATIONS, (charge.request_id,), fetch=True),
    ]
    if not holds_lease(found[0], charge.lease):
        return BudgetGrant(output_tokens=charge.ask.max_output if charge.ask else 0)
    reservations = [
        Reservation(BudgetKey(scope, key, period), int(epoch), int(tokens), float(usd))
        for scope, key, period, epoch, tokens, usd in found[1]
    ]
    owners = {budget.key: budget.conversation_id for budget in charge.budgets}
    for reservation in reservations:  # its row exists: it was created when it was reserved
        owners.setdefault(reservation.key, None)
    keys = sorted(owners)
    locked = yield [
        *(Statement(_ENSURE, (*_key(k), owners[k])) for k in keys),
        *(
            Statement(
                f"SELECT {_SPEND_COLUMNS}, limit_tokens, limit_usd FROM budget_spend WHERE {_KEY}"
                + dialect.lock_rows,
                _key(k),
                fetch=True,
            )
            for k in keys
        ),
    ]
    rows = {k: found_rows[0] for k, found_rows in zip(keys, locked[len(keys) :], strict=True)}
    spends = {k: _spend(row) for k, row in rows.items()}
    budgets = tuple(
        kept_limits(budget, rows[budget.key][4], rows[budget.key][5]) for budget in charge.budgets
    )
    epoch = charge.lease.epoch if charge.lease is not None else 0
    spends = settle(spends, reservations, epoch=epoch, spent=charge.spent)
    grant = BudgetGrant()
    writes: list[Statement] = []
    if reservations:
        writes.append(Statement("DELETE FROM budget_reservations WHERE request_id = ?", (charge.request_id,)))
    ask = charge.ask
    if ask is not None:
        output, refused = fit_output(ask, budgets, spends)
        if refused is None:
            tokens = ask.prompt_tokens + output
            usd = ask.prompt_usd + output * ask.usd_per_output_token
            grant = BudgetGrant(output_tokens=output, tokens=tokens, usd=usd)
            for budget in budgets:
                state = spends[budget.key]
                spends[budget.key] = BudgetSpend(
                    state.spent_tokens,
                    state.spent_usd,
                    state.reserved_tokens + tokens,
                    state.reserved_usd + usd,
                )
            writes.append(
                Statement(
                    _RESERVE,
                    [
                        (charge.request_id, *_key(b.key), charge.conversation_id, epoch, tokens, usd)
                        for b in budgets
                    ],
                    many=True,
                )
            )
        else:
            grant = BudgetGrant(refused=refused)
    limits = {budget.key: (budget.tokens, budget.usd) for budget in budgets}
    writes.append(
        Statement(
            _UPDATE,
            [(*_columns(spends[k]), *limits[k], *_key(k)) for k in keys if k in limits],
            many=True,
        )
    )
    writes.append(
        Statement(_SETTLE, [(*_columns(spends[k]), *_key(k)) for k in keys if k not in limits], many=True)
    )
    yield writes
    grant_spends = {k: spends[k] for k in keys}
    return BudgetGrant(grant.output_tokens, grant.tokens, grant.usd, grant.refused, grant_spends)


def _key(key: BudgetKey) -> tuple[str, str, str]:
    return key.scope, key.key, key.period


def _columns(state: BudgetSpend) -> tuple[int, float, int, float]:
    return state.spent_tokens, state.spent_usd, state.reserved_tokens, state.reserved_usd


def kept_limits(budget: BudgetLimits, stored_tokens: Any, stored_usd: Any) -> BudgetLimits:
    """``budget`` with a ``turn`` budget's stored limits kept where lower: a request's own lower
    budget holds for every attempt of its turn (a recovery knows only the configured one)."""
    if budget.key.scope != "turn":
        return budget
    return replace(
        budget,
        tokens=_lower(budget.tokens, None if stored_tokens is None else int(stored_tokens)),
        usd=_lower(budget.usd, None if stored_usd is None else float(stored_usd)),
    )


def _lower(given: T | None, stored: T | None) -> T | None:
    if given is None or stored is None:
        return given if stored is None else stored
    return min(given, stored)


def read_spends(keys: Sequence[BudgetKey]) -> tuple[str, list[Any]]:
    """The read of ``keys``' states (one statement): rows of ``scope, scope_key, period`` and
    the spend columns; a budget never charged has no row (its state is zero)."""
    condition = " OR ".join(f"({_KEY})" for _ in keys)
    params = [value for key in keys for value in _key(key)]
    return f"SELECT scope, scope_key, period, {_SPEND_COLUMNS} FROM budget_spend WHERE {condition}", params


def spends_from_rows(rows: Sequence[Sequence[Any]]) -> dict[BudgetKey, BudgetSpend]:
    """``{key: state}`` of :func:`read_spends`' rows."""
    return {BudgetKey(row[0], row[1], row[2]): _spend(row[3:]) for row in rows}
