"""A new turn's budget work in PostgreSQL's one-flight admission (:mod:`.one_flight`; docs/cost.md,
"Budgets" and "What it costs per request"), decided by the database, so the flight still waits
for the server once.

The waiting path and SQLite run the charge program (:func:`~turnwire_server.store.core.
budget_writes.admission_budget`), which decides in Python on the rows it took: on PostgreSQL a
second round trip inside the transaction (the reads answered, then the writes and ``COMMIT``
sent). Here the flight's turn is new (its request id had no row: the flight's insert fails
otherwise), so it has no reservation to settle, and the decision is the rule of
:func:`~turnwire_server.store.core.budget_rules.fit_output` over the rows as taken, which SQL
applies as well (:data:`_DECIDE`, tested for agreement with it). Two statements go out with the
flight's others, before its ``COMMIT``:

- :data:`_TAKE`: the charged budgets' rows, created at zero when missing and locked in key order
  by one upsert (as every charge takes them); a budget that refuses new turns and is exhausted
  (:meth:`~turnwire_server.store.records.BudgetLimits.exhausted_by`) fails the statement, so the
  flight stores nothing (a budget that refuses but is not charged: a read of its own,
  :data:`_CHECK`);
- :data:`_DECIDE`: the output that fits every budget, the turn's reservations and the rows'
  reserved amounts and limits written, in one statement that returns what it decided; a budget
  that refuses new turns without room for the first step's least output fails it too (the
  turn would end at that step, unsent: ``budget_writes.raise_spent``'s rule).

The grant is read from :data:`_DECIDE`'s rows once the ``COMMIT`` is in (:func:`_grant`): the
rule is applied once, by the database. A flight failed by a spent
budget is followed by a read of the budgets, which names the one spent (the admission raises
``BudgetSpent``, as the check riding a transaction does); :class:`SpentBudgets` remembers such
budgets for a while, so the turns that follow are refused by that read alone, without a flight
(a failed flight costs its pooled connection: :func:`~.db.discard`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Final

import psycopg

from turnwire_server.store.core.budget_writes import kept_limits
from turnwire_server.store.postgres.db import Conn
from turnwire_server.store.records import BudgetCharge, BudgetGrant, BudgetKey, BudgetLimits, BudgetSpend

__all__ = ["SpentBudgets", "send_admission_budget"]

_SPENT: Final = "turnwire: budget spent"
"""Text of the cast that fails a flight on an exhausted budget (:func:`refused_by_budget`)."""
_KEY_ROW: Final = "(%s::text, %s::text, %s::text, %s::text, %s::bigint, %s::float8, %s::bool)"
"""A budget named to :func:`_take` and :func:`_check`: key, owner (the conversation whose deletion
removes its row), the refusal limits and whether it refuses new turns."""
_KEY_COLUMNS: Final = "k (scope, scope_key, period, conversation_id, refuse_tokens, refuse_usd, refuses)"
_EXHAUSTED: Final = (
    # BudgetLimits.exhausted_by: spent plus reserved at or past a limit (a NULL limit: none).
    "CASE WHEN k.refuses AND (s.spent_tokens + s.reserved_tokens >= k.refuse_tokens"
    " OR s.spent_usd + s.reserved_usd >= k.refuse_usd)"
    f" THEN ('{_SPENT} ' || k.scope)::int END"
)
_TAKE: Final = (
    # The no-op update locks an existing row (one a racing charge just created included) and makes
    # RETURNING give its latest committed state; rows are taken sorted, as every charge takes them
    # (budget_writes._TAKE_ROWS). Every returned row's CASE is evaluated: an exhausted budget that
    # refuses fails the statement.
    f"WITH {_KEY_COLUMNS} AS (VALUES {{keys}}), s AS ("
    "INSERT INTO budget_spend (scope, scope_key, period, conversation_id)"
    " SELECT scope, scope_key, period, conversation_id FROM k ORDER BY scope, scope_key, period"
    " ON CONFLICT (scope, scope_key, period) DO UPDATE SET limit_tokens = budget_spend.limit_tokens"
    " RETURNING scope, scope_key, period, spent_tokens, spent_usd, reserved_tokens, reserved_usd)"
    f" SELECT {_EXHAUSTED} FROM s JOIN k USING (scope, scope_key, period)"
)
_CHECK: Final = (
    # The refusal check of budgets not charged: read, not taken (a missing row is at zero).
    f"WITH {_KEY_COLUMNS} AS (VALUES {{keys}}) SELECT {_EXHAUSTED} FROM k LEFT JOIN LATERAL ("
    " SELECT COALESCE(max(b.spent_tokens), 0) AS spent_tokens,"
    " COALESCE(max(b.spent_usd), 0) AS spent_usd,"
    " COALESCE(max(b.reserved_tokens), 0) AS reserved_tokens,"
    " COALESCE(max(b.reserved_usd), 0) AS reserved_usd FROM budget_spend b"
    " WHERE (b.scope, b.scope_key, b.period) = (k.scope, k.scope_key, k.period)) s ON true"
)
_DECIDE: Final = (
    # budget_rules.fit_output and budget_writes._reserve in SQL, on the rows _TAKE locked in this
    # transaction (tested for agreement): the ask (a), the budgets' limits as charged (a turn's
    # own keeps its stored limits where lower: budget_writes.kept_limits), each budget's room for
    # output (a dollar limit's in whole tokens, with the same hair of slack; clamped to
    # [-1, max_output] before the cast: any value below min_output refuses alike), the grant (the
    # least room, when every budget has min_output), the reservations, and the rows' reserved
    # amounts and limits.
    "WITH a (most, least, prompt, prompt_usd, per) AS"
    " (VALUES (%s::bigint, %s::bigint, %s::bigint, %s::float8, %s::float8)),"
    " k (scope, scope_key, period, tokens, usd, refuses) AS (VALUES {keys}),"
    " s AS (SELECT k.scope, k.scope_key, k.period, k.refuses,"
    " CASE WHEN k.scope = 'turn' THEN LEAST(k.tokens, b.limit_tokens) ELSE k.tokens END AS lt,"
    " CASE WHEN k.scope = 'turn' THEN LEAST(k.usd, b.limit_usd) ELSE k.usd END AS lu,"
    " b.spent_tokens, b.spent_usd, b.reserved_tokens, b.reserved_usd"
    " FROM k JOIN budget_spend b USING (scope, scope_key, period)),"
    " fit AS (SELECT s.scope, s.scope_key, s.period, s.refuses, s.lt, s.lu, LEAST(a.most,"
    " s.lt - s.spent_tokens - s.reserved_tokens - a.prompt,"
    " CASE WHEN s.lu IS NULL THEN NULL WHEN a.per > 0 THEN GREATEST(-1, LEAST(a.most,"
    " floor((s.lu - s.spent_usd - s.reserved_usd - a.prompt_usd) / a.per + 1e-9)))::bigint"
    " WHEN s.lu - s.spent_usd - s.reserved_usd - a.prompt_usd < 0 THEN -1 END) AS room FROM s, a),"
    " granted AS (SELECT min(f.room) AS output FROM fit f, a HAVING bool_and(f.room >= a.least)),"
    " reserved AS (INSERT INTO budget_reservations"
    " (request_id, scope, scope_key, period, conversation_id, epoch, tokens, usd)"
    " SELECT %s, f.scope, f.scope_key, f.period, %s, %s, a.prompt + g.output,"
    " a.prompt_usd + g.output * a.per FROM fit f, granted g, a)"
    " UPDATE budget_spend b"
    " SET reserved_tokens = b.reserved_tokens + COALESCE(a.prompt + g.output, 0),"
    " reserved_usd = b.reserved_usd + COALESCE(a.prompt_usd + g.output * a.per, 0),"
    " limit_tokens = f.lt, limit_usd = f.lu"
    " FROM fit f CROSS JOIN a LEFT JOIN granted g ON true"
    " WHERE (b.scope, b.scope_key, b.period) = (f.scope, f.scope_key, f.period)"
    # The decision as the grant gives it (_grant): each row's state and limits as written, the
    # output and the reservation (NULL: refused), whether the row's room refused the least output;
    # a budget that refuses new turns without room for the least output fails the statement
    # (budget_writes.raise_spent's rule: the turn would end at its first step, unsent).
    " RETURNING b.scope, b.scope_key, b.period, b.spent_tokens, b.spent_usd, b.reserved_tokens,"
    " b.reserved_usd, b.limit_tokens, b.limit_usd, g.output, a.prompt + g.output,"
    " a.prompt_usd + g.output * a.per, f.room < a.least,"
    f" CASE WHEN f.refuses AND f.room < a.least THEN ('{_SPENT} ' || b.scope)::int END"
)
_LIMIT_ROW: Final = "(%s::text, %s::text, %s::text, %s::bigint, %s::float8, %s::bool)"


@functools.lru_cache(maxsize=16)
def _take(count: int) -> bytes:
    return _TAKE.format(keys=", ".join([_KEY_ROW] * count)).encode()


@functools.lru_cache(maxsize=16)
def _check(count: int) -> bytes:
    return _CHECK.format(keys=", ".join([_KEY_ROW] * count)).encode()


@functools.lru_cache(maxsize=16)
def _decide(count: int) -> bytes:
    return _DECIDE.format(keys=", ".join([_LIMIT_ROW] * count)).encode()


_SPENT_SECONDS: Final = 60.0
"""How long :class:`SpentBudgets` has a spent budget's new turns checked by a read first."""
_SPENT_KEPT: Final = 1024
"""Spent budgets :class:`SpentBudgets` remembers at most (the oldest forgotten first)."""


class SpentBudgets:
    """Budgets that failed a flight as spent, remembered for :data:`_SPENT_SECONDS` (at most
    :data:`_SPENT_KEPT`): a new turn that one of them would refuse is checked by a read before
    any flight (``OneFlight._refuse_spent``), which refuses it without failing a transaction (a
    failed flight costs its pooled connection, so a tenant sending turns on a spent budget would
    make the pool reconnect for each). Only a route: a read that finds room (a settlement, a
    raised limit) forgets them, and the flight decides as always."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock  # seconds
        self._until: dict[BudgetKey, float] = {}

    def spent(self, refuse: Sequence[BudgetLimits]) -> bool:
        """True when a budget of ``refuse`` failed a flight within :data:`_SPENT_SECONDS`."""
        if not self._until:
            return False
        now = self._clock()
        for limits in refuse:
            until = self._until.get(limits.key)
            if until is not None:
                if until > now:
                    return True
                del self._until[limits.key]
        return False

    def forget(self, refuse: Sequence[BudgetLimits]) -> None:
        """Forget ``refuse``'s budgets: a read found them with room."""
        for limits in refuse:
            self._until.pop(limits.key, None)

    def note(self, refuse: Sequence[BudgetLimits]) -> None:
        """Remember ``refuse``'s budgets: one of them failed a flight as spent."""
        until = self._clock() + _SPENT_SECONDS
        for limits in refuse:
            self._until.pop(limits.key, None)
            self._until[limits.key] = until
        while len(self._until) > _SPENT_KEPT:
            del self._until[next(iter(self._until))]


def refused_by_budget(error: psycopg.Error) -> bool:
    """True when ``error`` failed a flight because a budget that refuses new turns is spent
    (:data:`_TAKE`'s or :data:`_CHECK`'s cast) or has no room for the first step
    (:data:`_DECIDE`'s)."""
    return isinstance(error, psycopg.errors.InvalidTextRepresentation) and _SPENT in str(error)


async def send_admission_budget(
    conn: Conn, budget: BudgetCharge | None, refuse: Sequence[BudgetLimits]
) -> Callable[[], Awaitable[BudgetGrant | None]]:
    """Send a new turn's budget statements in the flight on ``conn`` (pipeline mode, nothing
    waited for): the first reservation ``budget`` (None: none carried; its ``ask`` given) and
    the check of ``refuse``. Returns what gives the grant (None without ``budget``) once the
    flight's ``COMMIT`` is in. A budget of ``refuse`` spent, or without room for the first
    step's least output, fails the transaction (:func:`refused_by_budget` tells that error)."""
    charged = {limits.key: limits for limits in budget.budgets} if budget is not None else {}
    refusing = {limits.key: limits for limits in refuse}
    unchecked = [limits for key, limits in refusing.items() if key not in charged]
    if unchecked:
        await conn.execute(_check(len(unchecked)), _keys(unchecked, refusing))
    if budget is None:
        return _no_grant
    ask, lease = budget.ask, budget.lease
    assert ask is not None, "a first reservation asks"
    ordered = sorted(charged.values(), key=lambda limits: limits.key)
    await conn.execute(_take(len(ordered)), _keys(ordered, refusing))
    params: list[Any] = [
        ask.max_output,
        ask.min_output,
        ask.prompt_tokens,
        float(ask.prompt_usd),
        float(ask.usd_per_output_token),
    ]
    for limits in ordered:
        params.extend((*limits.key, _tokens(limits.tokens), _usd(limits.usd), limits.key in refusing))
    params.extend((budget.request_id, budget.conversation_id, lease.epoch if lease is not None else 0))
    decided = await conn.execute(_decide(len(ordered)), params)

    async def grant() -> BudgetGrant:
        return _grant(budget, await decided.fetchall())

    return grant


def _grant(charge: BudgetCharge, decided: Sequence[Sequence[Any]]) -> BudgetGrant:
    """The grant :data:`_DECIDE` decided and wrote, from the rows it returned (one per charged
    budget): the output and reservation (refused: none, and the first of ``charge.budgets``
    whose room refused the least output named, as ``fit_output`` names it), the rows' states
    after it, the budgets as charged (a turn's own with its stored lower limits)."""
    rows = {BudgetKey(*row[:3]): row for row in decided}
    spends = {
        key: BudgetSpend(int(row[3]), float(row[4]), int(row[5]), float(row[6])) for key, row in rows.items()
    }
    budgets = tuple(kept_limits(limits, *rows[limits.key][7:9]) for limits in charge.budgets)
    output, tokens, usd = decided[0][9:12]
    if output is None:
        refused = next(limits.key for limits in charge.budgets if rows[limits.key][12])
        return BudgetGrant(0, 0, 0.0, refused, spends, budgets)
    return BudgetGrant(int(output), int(tokens), float(usd), None, spends, budgets)


async def _no_grant() -> None:
    return None


def _keys(budgets: Sequence[BudgetLimits], refusing: dict[BudgetKey, BudgetLimits]) -> list[Any]:
    """:data:`_KEY_ROW`'s parameters for each of ``budgets``, with the refusal limits of those in
    ``refusing``."""
    params: list[Any] = []
    for limits in budgets:
        refused = refusing.get(limits.key)
        params.extend(limits.key)
        params.append(limits.conversation_id)
        if refused is None:
            params.extend((None, None, False))
        else:
            params.extend((_tokens(refused.tokens), _usd(refused.usd), True))
    return params


# A limit as its column's type (one from the config may be an int where dollars are floats).


def _tokens(value: int | None) -> int | None:
    return None if value is None else int(value)


def _usd(value: float | None) -> float | None:
    return None if value is None else float(value)
