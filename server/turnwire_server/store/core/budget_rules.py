"""The arithmetic of a budget charge's grant (docs/cost.md, "Budgets"), pure: what the store's
charge program (:mod:`.budget_writes`) decides over the rows it locked.

A charge first settles the turn's reservations, in SQL (``budget_writes._SETTLE``: each becomes
spent, at the step's actual use when it is this attempt's and the use is known, else at what it
reserved). Then it grants the step the most output tokens that fit every budget, at least
``min_output`` (:func:`fit_output`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from turnwire_server.store.records import BudgetAsk, BudgetKey, BudgetLimits, BudgetSpend

__all__ = ["fit_output"]


def fit_output(
    ask: BudgetAsk, budgets: Sequence[BudgetLimits], spends: Mapping[BudgetKey, BudgetSpend]
) -> tuple[int, BudgetKey | None]:
    """The most output tokens (at most ``ask.max_output``) whose reservation fits every budget
    of ``budgets`` in its state of ``spends``: ``(tokens, None)``; or ``(0, key)`` naming the
    first budget (in ``budgets``' order) without room for ``ask.min_output`` tokens. A budget
    has room for ``n`` when ``spent + reserved + prompt + n`` stays within each of its limits."""
    granted = ask.max_output
    for budget in budgets:
        state = spends.get(budget.key, BudgetSpend())
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
