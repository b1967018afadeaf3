"""The words of a budget refusal (docs/cost.md, "Budgets"): what of a budget is used and what the
next step needs, in the unit of the limit that refused it: tokens for a token limit, US dollars
(``$0.0042``) for a dollar limit. A budget may set both; the one without room speaks.

These texts reach the client (``TurnEnd.error.message``, a refused call's message): they name
the budget's scope and amounts, never a key or another tenant's spend.
"""

from __future__ import annotations

from typing import Literal

from turnwire_server.store.records import BudgetAsk, BudgetSpend

__all__ = ["dollars", "exhausted_text", "refusal_text", "step_refusal_text"]

Unit = Literal["tokens", "usd"]


def dollars(amount: float) -> str:
    """``amount`` US dollars as ``$1,234.50``: cents at least, more decimals (up to 8) only for
    what cents would round away (``$0.0042``), never in exponent notation."""
    text = f"{amount:,.8f}".rstrip("0")
    whole, _, cents = text.partition(".")
    return f"${whole}.{cents.ljust(2, '0')}"


def _refusing_unit(tokens: int | None, usd: float | None, spend: BudgetSpend, ask: BudgetAsk | None) -> Unit:
    """The unit whose limit has no room: tokens when a token limit is out of room for
    ``ask.min_output`` more (for ``ask`` None: is used up), else US dollars (the store's rule:
    ``store/core/budget_rules.fit_output``). A budget without a dollar limit speaks in tokens."""
    if tokens is None:
        return "usd"
    if usd is None:
        return "tokens"
    used = spend.spent_tokens + spend.reserved_tokens
    needed = 1 if ask is None else ask.prompt_tokens + ask.min_output
    return "tokens" if used + needed > tokens else "usd"


def exhausted_text(tokens: int | None, usd: float | None, spend: BudgetSpend) -> str:
    """What of a used-up budget (limits ``tokens``, ``usd`` US dollars) is used or reserved, in
    the unit that ran out: ``1,100 of its 1,000 tokens used or reserved``."""
    return _used(_refusing_unit(tokens, usd, spend, None), tokens, usd, spend)


def refusal_text(tokens: int | None, usd: float | None, spend: BudgetSpend, ask: BudgetAsk) -> str:
    """Why a budget (limits ``tokens``, ``usd`` US dollars; in the state ``spend``) refuses the
    step ``ask``, in the unit that has no room: what is used, then what the step needs."""
    unit = _refusing_unit(tokens, usd, spend, ask)
    return f"{_used(unit, tokens, usd, spend)}, and the next step needs {_needs(unit, ask)}"


def _used(unit: Unit, tokens: int | None, usd: float | None, spend: BudgetSpend) -> str:
    if unit == "tokens":
        return (
            f"{spend.spent_tokens + spend.reserved_tokens:,} of its {tokens or 0:,} tokens used or reserved"
        )
    return f"{dollars(spend.spent_usd + spend.reserved_usd)} of its {dollars(usd or 0.0)} used or reserved"


def step_refusal_text(tokens: int | None, usd: float | None, ask: BudgetAsk) -> str:
    """Why a step's own limit (``before_step``'s ``max_step_tokens``, ``max_step_usd``) refuses
    it, in the unit that has no room."""
    unit = _refusing_unit(tokens, usd, BudgetSpend(), ask)
    limit = f"{tokens or 0:,} tokens" if unit == "tokens" else dollars(usd or 0.0)
    return f"before_step limited it to {limit}, and it needs {_needs(unit, ask)}"


def _needs(unit: Unit, ask: BudgetAsk) -> str:
    least = ask.min_output
    if unit == "tokens":
        return f"about {ask.prompt_tokens:,} tokens of prompt (an estimate) and at least {least:,} of output"
    cost = ask.prompt_usd + least * ask.usd_per_output_token
    tokens = "token" if least == 1 else "tokens"
    return (
        f"about {dollars(cost)} at the model's price ({dollars(ask.prompt_usd)} of prompt, an "
        f"estimate, and {dollars(least * ask.usd_per_output_token)} for at least {least:,} {tokens} "
        "of output)"
    )
