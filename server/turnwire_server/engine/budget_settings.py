"""The ``budgets:`` section: how many tokens and US dollars turns may spend (docs/cost.md,
"Budgets").

A limit is in tokens (input and output of every model step, as the provider reports them:
``Usage.input_tokens + Usage.output_tokens``) and/or in US dollars (priced as
:mod:`turnwire_server.engine.cost` prices a step); unset: no limit of that kind. Scopes: one
``turn``, one ``conversation`` (all its turns, for as long as it exists), a ``tenant`` (every
conversation of one tenant, ``turnwire_server.tenant_keys``) and a ``principal`` (every turn an
authenticated caller started, in its tenant) per calendar ``day`` and per calendar ``month`` in
UTC. No limit set anywhere: budgets cost nothing (no store write, no
estimate).
"""

from __future__ import annotations

from pydantic import ConfigDict, Field

from turnwire_server.config_section import ConfigSection


class BudgetLimit(ConfigSection):
    """One scope's limit: ``tokens`` (input plus output tokens) and/or ``usd`` (US dollars);
    either unset is no limit of that kind."""

    model_config = ConfigDict(frozen=True)

    tokens: int | None = Field(None, ge=1, description="most input plus output tokens")
    usd: float | None = Field(None, ge=0, allow_inf_nan=False, description="most US dollars")

    @property
    def limited(self) -> bool:
        """Whether it limits anything."""
        return self.tokens is not None or self.usd is not None


class PeriodBudgets(ConfigSection):
    """Limits per calendar period in UTC: ``day`` (resets at 00:00 UTC) and ``month`` (resets at
    00:00 UTC on the 1st), the same for every tenant (the default one, "", included) or every
    principal."""

    model_config = ConfigDict(frozen=True)

    day: BudgetLimit = Field(default_factory=BudgetLimit)
    month: BudgetLimit = Field(default_factory=BudgetLimit)


class BudgetSettings(ConfigSection):
    """Budgets (docs/cost.md, "Budgets"). ``turn``, ``conversation``: those scopes' limits;
    ``tenant``, ``principal``: per period (a principal's apply to the turns an authenticated
    caller starts, its submissions and their recoveries). ``assumed_max_output_tokens``: the
    output a step reserves when nothing sets its ``max_output_tokens`` (with a budget every step
    is sent an explicit one, at most this). ``min_output_tokens``: the least output a step is
    sent with; a budget without room for it (or for the step's own smaller
    ``max_output_tokens``) ends the turn."""

    model_config = ConfigDict(frozen=True)

    turn: BudgetLimit = Field(default_factory=BudgetLimit)
    conversation: BudgetLimit = Field(default_factory=BudgetLimit)
    tenant: PeriodBudgets = Field(default_factory=PeriodBudgets)
    principal: PeriodBudgets = Field(default_factory=PeriodBudgets)
    assumed_max_output_tokens: int = Field(
        4096,
        ge=1,
        description="output tokens a step reserves (and is limited to) when nothing sets its "
        "max_output_tokens",
    )
    min_output_tokens: int = Field(
        1,
        ge=1,
        description="the least output a step is sent with: a budget without room for it ends the turn "
        "rather than send a step clamped to a uselessly short reply",
    )

    @property
    def enabled(self) -> bool:
        """Whether any limit is set (else budgets add no work to a turn)."""
        return (
            self.turn.limited
            or self.conversation.limited
            or any(p.day.limited or p.month.limited for p in (self.tenant, self.principal))
        )
