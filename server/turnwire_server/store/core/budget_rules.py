"""The arithmetic of a budget charge (docs/cost.md, "Budgets"), pure: what the store's charge
program (:mod:`.budget_writes`) decides over the rows it locked.

A charge first settles the turn's reservations: each becomes spent, at the step's actual use
when it is this attempt's and the use is known, else at what it reserved (a step that ended
without usage, a dollar amount unknown, or an earlier attempt's reservation that a crash or a
takeover cut off: the provider may have billed it, and an unknown cost never counts as 0). Then
it grants the step the most output tokens that fit every budget, at least ``min_output``. A charge
without an ask (nothing to grant) settles in SQL instead, by the same rule
(``budget_writes._SETTLE``; the two are tested for agreement).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from turnwire_server.store.records import BudgetAsk, BudgetKey, BudgetLimits, BudgetSpend

__all__ = ["Reservation", "fit_output", "settle"]

_ZERO = BudgetSpend()  # a budget missing from the states: nothing spent or reserved


@dataclass(frozen=True, slots=True)
class Reservation:
    """A stored reservation: its budget, the lease ``epoch`` of the attempt that took it, and
    what it reserved (``tokens``, ``usd``)."""

    key: BudgetKey
    epoch: int
    tokens: int
    usd: float


def settle(
    spends: Mapping[BudgetKey, BudgetSpend],
    reservations: Sequence[Reservation],
    *,
    epoch: int,
    spent: tuple[int | None, float | None] | None,
) -> dict[BudgetKey, BudgetSpend]:
    """``spends`` with ``reservations`` moved from reserved to spent: a reservation of attempt
    ``epoch`` at ``spent`` (tokens, US dollars; a None part, or None: at what it reserved), any
    other at what it reserved. A budget missing from ``spends`` starts at zero."""
    settled = dict(spends)
    for reservation in reservations:
        state = settled.get(reservation.key, _ZERO)
        tokens, usd = reservation.tokens, reservation.usd
        if reservation.epoch == epoch and spent is not None:
            tokens = reservation.tokens if spent[0] is None else spent[0]
            usd = reservation.usd if spent[1] is None else spent[1]
        settled[reservation.key] = BudgetSpend(
            spent_tokens=state.spent_tokens + tokens,
            spent_usd=state.spent_usd + usd,
            # Never below 0: a reservation written before a limit row was reset stays harmless.
            reserved_tokens=max(0, state.reserved_tokens - reservation.tokens),
            reserved_usd=max(0.0, state.reserved_usd - reservation.usd),
        )
    return settled


def fit_output(
    ask: BudgetAsk, budgets: Sequence[BudgetLimits], spends: Mapping[BudgetKey, BudgetSpend]
) -> tuple[int, BudgetKey | None]:
    """The most output tokens (at most ``ask.max_output``) whose reservation fits every budget
    of ``budgets`` in its state of ``spends``: ``(tokens, None)``; or ``(0, key)`` naming the
    first budget (in ``budgets``' order) without room for ``ask.min_output`` tokens. A budget
    has room for ``n`` when ``spent + reserved + prompt + n`` stays within each of its limits."""
    granted = ask.max_output
    for budget in budgets:
        state = spends.get(budget.key, _ZERO)
        room = ask.max_output
        if budget.tokens is not None:
            left = budget.tokens - state.spent_tokens - state.reserved_tokens - ask.prompt_tokens
            room = min(room, left)
        if budget.usd is not None:
            left_usd = budget.usd - state.spent_usd - state.reserved_usd - ask.prompt_usd
            if ask.usd_per_output_token > 0:
                # A hair of slack: 0.006 / 0.001 is 5.999… in binary floating point.
                room = min(room, math.floor(left_usd / ask.usd_per_output_token + 1e-9))
            elif left_usd < 0:
                room = -1
        if room < ask.min_output:
            return 0, budget.key
        granted = min(granted, room)
    return granted, None
