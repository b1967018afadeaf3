"""Budget charges and reads, once for both drivers (core programs,
:mod:`turnwire_server.store.core.sql`; the rules: docs/cost.md, "Budgets", and
:mod:`.budget_rules`).

A charge with an ask is one transaction of two batches, of two statements each (on PostgreSQL the
writes fold into one; on SQLite the reads are one). The first reads the turn's fencing token (its
row locked, as :mod:`.fencing` does) with its stored reservations, or only the reservations when the
charge rides a turn write that read and locked the token already (``fenced``); and takes the budget
rows: the charged ones and those of the turn's reservations. (A new turn in PostgreSQL's one-flight
admission has the database decide instead: :mod:`turnwire_server.store.postgres.budget_flight`, the
rule in SQL, tested for agreement.) On PostgreSQL they are taken in key order, created at zero when
missing and locked by one upsert that returns them (``INSERT … ON CONFLICT DO UPDATE … RETURNING``:
the update locks the row, an existing one or one a racing charge just created, and returns its
latest committed state), so charges racing from several replicas for one budget take turns on its
row and each sees the other's reservation. SQLite applies writes one at a time under the database's
write lock: there the rows are read (a missing one is at zero), at about half the cost of the
upsert, with the turn's row (whether it is recorded) and the reservations, in one statement
(:data:`_READ_ALL`: a statement fewer to step through). The second batch writes the turn's
reservations in place (an upsert; a reservation of a budget no longer charged deleted) and the
budget rows back, settled by :func:`~.budget_rules.settle`, in one upsert that creates a row read
missing.

A charge without an ask (the turn's last settlement, riding its final write; a lost attempt's)
has nothing to decide: one batch (after the token's read when not ``fenced``) in which the
database settles (:data:`_SETTLE`, ``UPDATE budget_spend … FROM`` the reservations, returning the
rows' states) and deletes the reservations (on PostgreSQL in the same statement, a
data-modifying ``WITH`` that also locks the rows in key order before the update reaches them).
:data:`_SETTLE` is the rule of :func:`~.budget_rules.settle` in SQL, the two tested for
agreement (``tests/test_store_budgets.py``). Every charge locks the turn's row, then budget rows
sorted; a conversation's deletion its conversation, its turns' rows, then budget rows: no two
wait on each other in a cycle.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias, TypeVar

from turnwire_server.store.core.budget_rules import Reservation, fit_output, settle
from turnwire_server.store.core.fencing import holds_lease, lease_read
from turnwire_server.store.core.sql import Dialect, Program, Statement, folded, joined
from turnwire_server.store.errors import BudgetSpent
from turnwire_server.store.records import (
    BudgetAsk,
    BudgetCharge,
    BudgetGrant,
    BudgetKey,
    BudgetLimits,
    BudgetSpend,
)

__all__ = [
    "admission_budget",
    "charge_budget",
    "conversation_deleted",
    "kept_limits",
    "raise_spent",
    "read_spends",
    "refusal_check",
    "spends_from_rows",
]

T = TypeVar("T", int, float)

_KEY: Final = "scope = ? AND scope_key = ? AND period = ?"
_ZERO: Final = BudgetSpend()
_ZERO_ROW: Final = (0, 0.0, 0, 0.0, None, None)  # a budget row never charged: spends, limits
_SPEND_COLUMNS: Final = "spent_tokens, spent_usd, reserved_tokens, reserved_usd"
_TOKEN_AND_RESERVATIONS: Final = (
    # The turn's fencing token (its row locked, as fencing.lease_read's) and its reservations in
    # one read: a row per reservation, or one with NULL reservation columns when it has none.
    "SELECT t.owner, t.lease_epoch, r.scope, r.scope_key, r.period, r.epoch, r.tokens, r.usd"
    " FROM turns t LEFT JOIN budget_reservations r ON r.request_id = t.request_id"
    " WHERE t.request_id = ?"
)
_RESERVATIONS: Final = (
    # The same rows without the token: the turn write the charge rides read and locked it.
    "SELECT NULL, NULL, scope, scope_key, period, epoch, tokens, usd FROM budget_reservations"
    " WHERE request_id = ?"
)
_TAKE_ROWS: Final = (
    # The charged rows (k: VALUES of key and conversation) and those of the turn's other
    # reservations (a past period's, a budget no longer configured), sorted: charges racing for
    # the same rows lock them in one order. Created at zero when missing, only while the turn is
    # recorded (a deleted conversation's turn leaves no row behind; not checked for the charge
    # riding the turn's admission, whose row that transaction writes); the no-op update locks an
    # existing row and makes RETURNING give it. WHERE before ON CONFLICT: SQLite's parser needs it.
    "INSERT INTO budget_spend (scope, scope_key, period, conversation_id)"
    " SELECT k.column1, k.column2, k.column3, k.column4 FROM ({keys}) AS k"
    "{guard} ORDER BY k.column1, k.column2, k.column3"
    " ON CONFLICT (scope, scope_key, period) DO UPDATE SET limit_tokens = budget_spend.limit_tokens"
    f" RETURNING scope, scope_key, period, {_SPEND_COLUMNS}, limit_tokens, limit_usd"
)
_RECORDED: Final = " WHERE EXISTS (SELECT 1 FROM turns WHERE request_id = ?)"
_OTHER_RESERVED: Final = (
    # A reservation's budget row belongs to the turn's conversation when its scope does.
    "SELECT scope AS column1, scope_key AS column2, period AS column3,"
    " CASE WHEN scope IN ('turn', 'conversation') THEN conversation_id END AS column4"
    " FROM budget_reservations WHERE request_id = ?"
)
_READ_ALL: Final = (
    # Where one writer applies writes in turn, the charge's reads in one statement (a statement
    # fewer to step through), each row tagged by its kind: (0) the turn's fencing token, read
    # unless the charge rides the turn's admission (whether the turn is recorded; this
    # transaction writes it there); (1) its reservations; (2) the budget rows, the charged ones
    # (an OR of keys, which SQLite answers by the primary key, one lookup each) and those of the
    # turn's other reservations.
    "{token}SELECT 1, scope, scope_key, period, epoch, tokens, usd, NULL, NULL, NULL"
    " FROM budget_reservations WHERE request_id = ?"
    f" UNION ALL SELECT 2, scope, scope_key, period, {_SPEND_COLUMNS}, limit_tokens, limit_usd"
    " FROM budget_spend WHERE {keys}(scope, scope_key, period) IN"
    " (SELECT scope, scope_key, period FROM budget_reservations WHERE request_id = ?)"
)
_READ_TOKEN: Final = (
    "SELECT 0, owner, lease_epoch, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM turns"
    " WHERE request_id = ? UNION ALL "
)
_ROW_MARKS: Final = "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_PUT_ROWS: Final = (
    # An upsert: the rows exist where they were taken (PostgreSQL), may not where they were read.
    "INSERT INTO budget_spend (scope, scope_key, period, conversation_id, spent_tokens, spent_usd,"
    " reserved_tokens, reserved_usd, limit_tokens, limit_usd) VALUES {values}"
    " ON CONFLICT (scope, scope_key, period) DO UPDATE SET spent_tokens = excluded.spent_tokens,"
    " spent_usd = excluded.spent_usd, reserved_tokens = excluded.reserved_tokens,"
    " reserved_usd = excluded.reserved_usd, limit_tokens = excluded.limit_tokens,"
    " limit_usd = excluded.limit_usd"
)
_SETTLE: Final = (
    # budget_rules.settle in SQL, for a charge without an ask (tested for agreement with it): each
    # of the turn's reservations (r) moves from reserved to spent, at the step's actual use (the
    # parameters: tokens, US dollars, NULL where unknown) when it is this attempt's (its lease
    # epoch), at what it reserved otherwise; reserved never below 0 (a reservation written before
    # a limit row was reset stays harmless). One reservation a row.
    "UPDATE budget_spend SET"
    " spent_tokens = spent_tokens + COALESCE(CASE WHEN r.epoch = ? THEN CAST(? AS BIGINT) END, r.tokens),"
    " spent_usd = spent_usd + COALESCE(CASE WHEN r.epoch = ? THEN CAST(? AS DOUBLE PRECISION) END, r.usd),"
    " reserved_tokens = CASE WHEN reserved_tokens > r.tokens THEN reserved_tokens - r.tokens ELSE 0 END,"
    " reserved_usd = CASE WHEN reserved_usd > r.usd THEN reserved_usd - r.usd ELSE 0.0 END"
    " FROM {source} AS r WHERE budget_spend.scope = r.scope AND budget_spend.scope_key = r.scope_key"
    " AND budget_spend.period = r.period{guard}"
    " RETURNING budget_spend.scope, budget_spend.scope_key, budget_spend.period,"
    " budget_spend.spent_tokens, budget_spend.spent_usd, budget_spend.reserved_tokens,"
    " budget_spend.reserved_usd, budget_spend.limit_tokens, budget_spend.limit_usd"
)
_RESERVED_ROWS: Final = (
    "(SELECT scope, scope_key, period, epoch, tokens, usd FROM budget_reservations WHERE request_id = ?)"
)
_TAKEN_ROWS: Final = (
    # PostgreSQL: the reservations deleted as they are settled (a data-modifying WITH; the
    # update sees the rows as the statement found them), so no statement is left to delete them.
    "DELETE FROM budget_reservations WHERE request_id = ?{guard}"
    " RETURNING scope, scope_key, period, epoch, tokens, usd"
)
_RECORDED_SETTLE: Final = " AND EXISTS (SELECT 1 FROM turns WHERE request_id = ?)"
_LOCK_TAKEN: Final = (
    # PostgreSQL: the rows the settlement updates, locked in key order (the lock follows the sort)
    # as every charge locks them, before the update joins them: whichever way the update's plan
    # joins, it reaches a row only through this one's output, locked in order.
    "SELECT scope, scope_key, period FROM budget_spend WHERE (scope, scope_key, period) IN"
    " (SELECT scope, scope_key, period FROM gone) ORDER BY scope, scope_key, period FOR UPDATE"
)
_STATES: Final = (
    f"SELECT scope, scope_key, period, {_SPEND_COLUMNS}, limit_tokens, limit_usd FROM budget_spend"
    " WHERE (scope, scope_key, period) IN (VALUES {keys})"
)
_RESERVE: Final = (
    # In place: a turn's next step reserves on the rows its last step's reservation used.
    "INSERT INTO budget_reservations (request_id, scope, scope_key, period, conversation_id, epoch,"
    " tokens, usd) VALUES {values}"
    " ON CONFLICT (request_id, scope, scope_key, period) DO UPDATE SET epoch = excluded.epoch,"
    " tokens = excluded.tokens, usd = excluded.usd, conversation_id = excluded.conversation_id"
)
_UNRESERVE: Final = "DELETE FROM budget_reservations WHERE request_id = ?"
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


def charge_budget(
    charge: BudgetCharge,
    dialect: Dialect,
    *,
    fenced: bool = False,
    admitting: bool = False,
    refuse: Sequence[BudgetLimits] = (),
) -> Program[BudgetGrant]:
    """``BudgetStore.charge_budget``: settle ``charge.request_id``'s reservations and reserve
    ``charge.ask`` in one transaction. With an ask, two batches (on PostgreSQL two round trips):
    the reads and row locks, then the writes, the settlement decided here
    (:func:`~.budget_rules.settle`); without, one (:func:`_settled`: the settlement in SQL).
    Raises :class:`LeaseLost` (writing nothing) when the turn's token is no longer
    ``charge.lease``; a turn no longer recorded (its conversation was deleted) is charged nothing.
    ``fenced``: the program this one is joined to (:func:`~.sql.joined`, its statements first in
    each batch) reads and locks the turn's token under ``charge.lease`` and raises when it was
    lost, so this one does not read it again. ``admitting``: the program it is joined to is the
    turn's start (``start_turn``), which writes the turn's row in its last batch, after this
    one's reads (``fenced`` implied: the token is the one that start writes). (PostgreSQL's
    one-flight admission, whose turn is new, has the database decide its first reservation
    instead: :mod:`turnwire_server.store.postgres.budget_flight`.) ``refuse`` (an
    admission's, whose charge takes their rows): raises :class:`BudgetSpent` (the transaction
    writes nothing) when one of these budgets is exhausted on the rows as taken and settled, before
    the charge decides, or has no room for ``charge.ask`` (:func:`raise_spent`'s rule)."""
    fenced = fenced or admitting
    ask = charge.ask
    if ask is None:
        return (yield from _settled(charge, dialect, fenced=fenced))
    keys = sorted({budget.key for budget in charge.budgets})
    owners = {budget.key: budget.conversation_id for budget in charge.budgets}
    # Where one writer applies writes in turn (SQLite: no row locks), the rows are read, not
    # taken: the transaction holds the database's write lock, and the write creates a missing
    # row. The turn's row is read then (unless this transaction writes it) to tell whether it
    # is recorded, as the take's guard does where rows are taken.
    if dialect.lock_rows:
        token, stored, taken = yield from _take(
            charge, keys, owners, dialect, fenced=fenced, admitting=admitting
        )
    else:
        token, stored, taken = yield from _read(charge, keys, admitting=admitting)
    if not fenced and not holds_lease(token, charge.lease):
        return BudgetGrant(output_tokens=ask.max_output)
    rows = {BudgetKey(*row[:3]): row[3:] for row in taken}
    # Still recorded: the take's guard created every row, or the turn's row was read.
    recorded = (not fenced or len(rows) == len(keys)) if dialect.lock_rows else (admitting or bool(token))
    if not recorded:
        return BudgetGrant(output_tokens=ask.max_output)
    reservations = [
        Reservation(BudgetKey(scope, key, period), int(epoch), int(tokens), float(usd))
        for scope, key, period, epoch, tokens, usd in stored
    ]
    budgets = tuple(kept_limits(budget, *rows.get(budget.key, _ZERO_ROW)[4:6]) for budget in charge.budgets)
    epoch = charge.lease.epoch if charge.lease is not None else 0
    spends = settle(
        {k: _spend(row) for k, row in rows.items()}, reservations, epoch=epoch, spent=charge.spent
    )
    for key in keys:  # a row read missing is at zero (the write creates it)
        spends.setdefault(key, _ZERO)
    raise_spent(refuse, spends)
    writes: list[Statement] = []
    reserved: set[BudgetKey] = set()
    output, refused, tokens, usd = _reserve(ask, budgets, spends)
    if refused is not None and refuse:
        # Which budget of ``refuse`` has no room for the step, if one has (raise_spent's rule);
        # when the grant fits every budget it fits these too (the same rows, limits no lower).
        raise_spent(refuse, spends, ask)
    if refused is None:
        reserved = {budget.key for budget in budgets}
        writes.append(
            Statement(
                _reserve_sql(len(budgets)),
                [
                    value
                    for b in budgets
                    for value in (charge.request_id, *b.key, charge.conversation_id, epoch, tokens, usd)
                ],
            )
        )
    stale = sorted({r.key for r in reservations} - reserved) if reservations else []
    if stale and not reserved:
        writes.append(Statement(_UNRESERVE, (charge.request_id,)))
    elif stale:  # a reservation of a budget this step does not charge (a past period's)
        writes.append(Statement(_unreserve(len(stale)), [charge.request_id, *(v for k in stale for v in k)]))
    limits = {budget.key: (budget.tokens, budget.usd) for budget in budgets}
    # Every row back in one statement, created where missing (a row a past period's reservation
    # settled keeps its stored limits; its owner is the turn's conversation when its scope is).
    changed = sorted(spends)
    if changed:
        writes.append(
            Statement(
                _put_rows(len(changed)),
                [
                    value
                    for k in changed
                    for value in (
                        *k,
                        owners[k] if k in owners else _owner(k, charge.conversation_id),
                        *_columns(spends[k]),
                        *(limits[k] if k in limits else rows.get(k, _ZERO_ROW)[4:6]),
                    )
                ],
            )
        )
    yield folded(writes, dialect)
    return BudgetGrant(output, tokens, usd, refused, spends, budgets)


Rows: TypeAlias = list[Sequence[Any]]


def _take(
    charge: BudgetCharge,
    keys: Sequence[BudgetKey],
    owners: Mapping[BudgetKey, str | None],
    dialect: Dialect,
    *,
    fenced: bool,
    admitting: bool,
) -> Program[tuple[Rows, Rows, Rows]]:
    """:func:`charge_budget`'s reads where several connections write at once (PostgreSQL): the
    turn's token (its row locked) with its reservations, or only the reservations when
    ``fenced``; and the budget rows, taken (:data:`_TAKE_ROWS`). Returns the token's rows
    (owner, epoch; none: the turn is not recorded, or was not read), the reservations (scope,
    key, period, epoch, tokens, US dollars) and the rows as taken."""
    if fenced:
        reads = [Statement(_RESERVATIONS, (charge.request_id,), fetch=True)]
    else:
        lock = f"{dialect.lock_rows} OF t"
        reads = [Statement(_TOKEN_AND_RESERVATIONS + lock, (charge.request_id,), fetch=True)]
    params: list[Any] = [value for k in keys for value in (*k, owners[k])]
    params.append(charge.request_id)
    params.extend(value for k in keys for value in k)
    if not admitting:
        params.append(charge.request_id)
    reads.append(Statement(_take_rows(len(keys), not admitting), params, fetch=True))
    read, taken = yield reads
    return [row[:2] for row in read[:1]], [row[2:] for row in read if row[2] is not None], taken


def _read(
    charge: BudgetCharge, keys: Sequence[BudgetKey], *, admitting: bool
) -> Program[tuple[Rows, Rows, Rows]]:
    """:func:`charge_budget`'s reads where one writer applies writes in turn (SQLite): one
    statement (:data:`_READ_ALL`), the turn's token read unless ``admitting``. Returns as
    :func:`_take` does, the rows read (a missing one is at zero)."""
    params: list[Any] = [charge.request_id] if admitting else [charge.request_id, charge.request_id]
    params.extend(value for k in keys for value in k)
    params.append(charge.request_id)
    (found,) = yield [Statement(_read_all(len(keys), admitting), params, fetch=True)]
    token: Rows = []
    stored: Rows = []
    rows: Rows = []
    for row in found:
        kind = row[0]
        if kind == 2:
            rows.append(row[1:])
        elif kind == 1:
            stored.append(row[1:7])
        else:
            token.append(row[1:3])
    return token, stored, rows


def _reserve(
    ask: BudgetAsk, budgets: Sequence[BudgetLimits], spends: dict[BudgetKey, BudgetSpend]
) -> tuple[int, BudgetKey | None, int, float]:
    """The output granted (:func:`~.budget_rules.fit_output`), the budget that refused it (None:
    granted), and the reservation (tokens, US dollars; 0 when refused), added to ``spends`` (in
    place) of every budget of ``budgets`` when granted."""
    output, refused = fit_output(ask, budgets, spends)
    if refused is not None:
        return output, refused, 0, 0.0
    tokens = ask.prompt_tokens + output
    usd = ask.prompt_usd + output * ask.usd_per_output_token
    for budget in budgets:
        spent_tokens, spent_usd, reserved_tokens, reserved_usd = _columns(spends.get(budget.key, _ZERO))
        spends[budget.key] = BudgetSpend(
            spent_tokens, spent_usd, reserved_tokens + tokens, reserved_usd + usd
        )
    return output, None, tokens, usd


def admission_budget(
    budget: BudgetCharge | None,
    refuse: Sequence[BudgetLimits],
    dialect: Dialect,
    *,
    admitting: bool,
) -> Program[BudgetGrant | None]:
    """A new turn's budget work in the transaction that admits it (``Store.admit_turn``): the
    check of ``refuse`` (:func:`refusal_check`'s rule; raises :class:`BudgetSpent`) and the first
    reservation ``budget`` (:func:`charge_budget`, fenced: the admission writes the turn's row),
    either absent. The check rides the charge when the charge takes every row it names, else it
    reads them. ``admitting``: as :func:`charge_budget`'s (the turn's row is written after this
    program's reads). Returns the
    charge's grant (None without ``budget``)."""
    if budget is None:
        if refuse:
            yield from refusal_check(refuse)
        return None
    charged = {limits.key for limits in budget.budgets}
    if all(limits.key in charged for limits in refuse):
        return (yield from charge_budget(budget, dialect, fenced=True, admitting=admitting, refuse=refuse))
    charge = charge_budget(budget, dialect, fenced=True, admitting=admitting)
    _, grant = yield from joined(refusal_check(refuse), charge)
    return grant


def refusal_check(refuse: Sequence[BudgetLimits]) -> Program[None]:
    """The admission's budget check on its own (an admission that carries no charge, or whose
    charge does not take every row of ``refuse``): one read of the rows, in the admitting
    transaction; raises :class:`BudgetSpent` (the transaction writes nothing) when one of
    ``refuse`` is exhausted (:meth:`BudgetLimits.exhausted_by`; docs/cost.md, "Budgets")."""
    sql, params = read_spends([budget.key for budget in refuse])
    (rows,) = yield [Statement(sql, params, fetch=True)]
    raise_spent(refuse, spends_from_rows(rows))


def raise_spent(
    refuse: Sequence[BudgetLimits], spends: Mapping[BudgetKey, BudgetSpend], ask: BudgetAsk | None = None
) -> None:
    """Raise :class:`BudgetSpent` for the first budget of ``refuse`` exhausted at its state in
    ``spends`` (one missing is at zero; :meth:`BudgetLimits.exhausted_by`), else, given the first
    step's reservation ``ask`` (the one the admission carries), for the first without room for
    it (:func:`~.budget_rules.fit_output`: its prompt and ``min_output``): the admission check's
    rule, applied by every store path that checks (docs/cost.md, "Budgets"). Such a turn would
    end at its first step, unsent, its input stored for nothing."""
    for budget in refuse:
        spend = spends.get(budget.key, _ZERO)
        if budget.exhausted_by(spend):
            raise BudgetSpent(budget, spend)
    if ask is not None and refuse:
        _, refused = fit_output(ask, refuse, spends)
        if refused is not None:
            budget = next(limits for limits in refuse if limits.key == refused)
            raise BudgetSpent(budget, spends.get(refused, _ZERO), ask)


def _settled(charge: BudgetCharge, dialect: Dialect, *, fenced: bool) -> Program[BudgetGrant]:
    """:func:`charge_budget` without an ask (the turn's last settlement, a lost attempt's): the
    settlement and the reservations' deletion in one batch (on PostgreSQL one statement, which
    locks the rows in key order first), without the rows' upsert: a charged budget the turn had
    nothing reserved on (a day begun since its last step) is read in a second batch, with whether
    the turn is recorded."""
    epoch = charge.lease.epoch if charge.lease is not None else 0
    reads = [] if fenced else [lease_read(charge.request_id, dialect)]
    settlement = _settlement(charge, epoch, dialect)
    found = yield [*reads, *settlement]
    if not fenced and not holds_lease(found[0], charge.lease):
        return BudgetGrant()
    rows = {BudgetKey(*row[:3]): row[3:] for row in found[len(reads)]}
    missing = sorted({budget.key for budget in charge.budgets} - rows.keys())
    if missing:
        recorded = Statement("SELECT 1 FROM turns WHERE request_id = ?", (charge.request_id,), fetch=True)
        states = Statement(_states(len(missing)), [v for k in missing for v in k], fetch=True)
        turn, more = yield [recorded, states]
        if not turn:  # its conversation was deleted: nothing was charged
            return BudgetGrant()
        rows.update({k: _ZERO_ROW for k in missing})
        rows.update({BudgetKey(*row[:3]): row[3:] for row in more})
    budgets = tuple(kept_limits(budget, *rows[budget.key][4:6]) for budget in charge.budgets)
    return BudgetGrant(spends={k: _spend(row) for k, row in rows.items()}, budgets=budgets)


def _settlement(charge: BudgetCharge, epoch: int, dialect: Dialect) -> list[Statement]:
    """The statements settling ``charge.request_id``'s reservations (:data:`_SETTLE`: rows of the
    settled budgets' states) and deleting them (on PostgreSQL one statement), only while the turn
    is recorded (as :data:`_TAKE_ROWS` creates rows)."""
    tokens, usd = charge.spent if charge.spent is not None else (None, None)
    spent = (epoch, tokens, epoch, usd)
    settling, unreserve = _settle_sql(dialect.writes_with)
    if dialect.writes_with:
        return [Statement(settling, (charge.request_id, charge.request_id, *spent), fetch=True)]
    return [
        Statement(settling, (*spent, charge.request_id, charge.request_id), fetch=True),
        Statement(unreserve, (charge.request_id, charge.request_id)),
    ]


# A charge's statements by how many rows they name (the SQL built once per count).


@functools.lru_cache(maxsize=64)
def _take_rows(count: int, guarded: bool) -> str:
    # A join on the keys (not an OR of conditions, which SQLite answers with a scan of the table).
    guard = _RECORDED if guarded else " WHERE true"  # a WHERE before ON CONFLICT, as above
    charged = ", ".join(["(?, ?, ?, ?)"] * count)
    if not count:
        return _TAKE_ROWS.format(keys=_OTHER_RESERVED, guard=guard)
    named = ", ".join(["(?, ?, ?)"] * count)
    reserved = f"{_OTHER_RESERVED} AND (scope, scope_key, period) NOT IN (VALUES {named})"
    return _TAKE_ROWS.format(keys=f"VALUES {charged} UNION ALL {reserved}", guard=guard)


@functools.lru_cache(maxsize=2)
def _settle_sql(writes_with: bool) -> tuple[str, str]:
    # The settlement and (SQLite) the reservations' deletion, by dialect.
    if writes_with:
        taken = _TAKEN_ROWS.format(guard=_RECORDED_SETTLE)
        source = "(SELECT gone.* FROM gone JOIN locked USING (scope, scope_key, period))"
        settling = _SETTLE.format(source=source, guard="")
        return f"WITH gone AS ({taken}), locked AS ({_LOCK_TAKEN}) {settling}", ""
    return _SETTLE.format(source=_RESERVED_ROWS, guard=_RECORDED_SETTLE), _UNRESERVE + _RECORDED_SETTLE


@functools.lru_cache(maxsize=32)
def _states(count: int) -> str:
    return _STATES.format(keys=", ".join(["(?, ?, ?)"] * count))


@functools.lru_cache(maxsize=32)
def _reserve_sql(count: int) -> str:
    return _RESERVE.format(values=", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * count))


@functools.lru_cache(maxsize=32)
def _unreserve(count: int) -> str:
    return f"{_UNRESERVE} AND (scope, scope_key, period) IN (VALUES {', '.join(['(?, ?, ?)'] * count)})"


@functools.lru_cache(maxsize=64)
def _read_all(count: int, admitting: bool) -> str:
    return _READ_ALL.format(token="" if admitting else _READ_TOKEN, keys=f"({_KEY}) OR " * count)


@functools.lru_cache(maxsize=32)
def _put_rows(count: int) -> str:
    return _PUT_ROWS.format(values=", ".join([_ROW_MARKS] * count))


def _owner(key: BudgetKey, conversation_id: str) -> str | None:
    # The conversation a budget row belongs to (deleted with it): a turn's or a conversation's.
    return conversation_id if key.scope in ("turn", "conversation") else None


def _columns(state: BudgetSpend) -> tuple[int, float, int, float]:
    return state.spent_tokens, state.spent_usd, state.reserved_tokens, state.reserved_usd


def kept_limits(budget: BudgetLimits, stored_tokens: Any, stored_usd: Any) -> BudgetLimits:
    """``budget`` with a ``turn`` budget's stored limits kept where lower: a request's own lower
    budget holds for every attempt of its turn (a recovery knows only the configured one)."""
    if budget.key.scope != "turn" or (stored_tokens is None and stored_usd is None):
        return budget
    tokens = _lower(budget.tokens, None if stored_tokens is None else int(stored_tokens))
    usd = _lower(budget.usd, None if stored_usd is None else float(stored_usd))
    if tokens == budget.tokens and usd == budget.usd:
        return budget
    return BudgetLimits(budget.key, tokens, usd, budget.conversation_id)


def _lower(given: T | None, stored: T | None) -> T | None:
    if given is None or stored is None:
        return given if stored is None else stored
    return min(given, stored)


def read_spends(keys: Sequence[BudgetKey]) -> tuple[str, list[Any]]:
    """The read of ``keys``' states (one statement): rows of ``scope, scope_key, period`` and
    the spend columns; a budget never charged has no row (its state is zero)."""
    condition = " OR ".join(f"({_KEY})" for _ in keys)
    params = [value for key in keys for value in key]
    return f"SELECT scope, scope_key, period, {_SPEND_COLUMNS} FROM budget_spend WHERE {condition}", params


def spends_from_rows(rows: Sequence[Sequence[Any]]) -> dict[BudgetKey, BudgetSpend]:
    """``{key: state}`` of :func:`read_spends`' rows."""
    return {BudgetKey(row[0], row[1], row[2]): _spend(row[3:]) for row in rows}
