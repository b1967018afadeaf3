"""Budgets at a new turn's admission (docs/cost.md, "Budgets"): the check that refuses a turn
on a spent conversation, tenant or principal before anything is stored (:func:`spent_budget`, or
riding the admission), and the first reservation in the transaction that admits it
(:func:`admission_charge`; docs/cost.md, "What it costs per request").

A step reserves its prompt's estimate plus its output before it is sent (:mod:`.budgets`); for a
new turn's first step that reservation would be a store transaction of its own, right before the
model call. Instead the turn's admission (``Store.admit_turn``, the commit of its input) carries
a reservation sized before anything of the turn ran: the prompt as this process last saw the
conversation's (its last step's prompt plus that step's output, :class:`FirstStepEstimates`),
plus the new input, with a margin, and the configured ``assumed_max_output_tokens``, priced at
the turn's model. The first step then uses it without a write when it covers the step's actual
reservation (the same budgets, the prompt and output in tokens and US dollars within what was
reserved); else the step charges as any other does, settling the admission's at zero (nothing
was sent on it). A turn that ends before its first step settles it at zero in its final write.

The estimate is only ever a guess for one process: a conversation another replica served since,
or one this process never saw, gets a reservation too small to cover, and its first step charges
on its own as before. Nothing here changes what a step may spend: only where it is reserved.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from turnwire.compaction import EstimateTokens, message_bytes
from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CACHES, CacheRegion
from turnwire_server.engine import metrics
from turnwire_server.engine.budget_refusals import exhausted_text, refusal_text
from turnwire_server.engine.budget_scopes import applies, budgets_for, lowered, resets_in
from turnwire_server.engine.budget_settings import BudgetLimit, BudgetSettings
from turnwire_server.engine.errors import BudgetRefused
from turnwire_server.engine.request import TurnRequest
from turnwire_server.store.budgets import BudgetStore
from turnwire_server.store.records import BudgetAsk, BudgetCharge, BudgetLimits, BudgetSpend, TurnLease
from turnwire_server.tenant_keys import tenant_of_key

__all__ = [
    "FirstStepEstimates",
    "admission_charge",
    "budget_refusal",
    "count_refusal",
    "refusing_budgets",
    "spent_budget",
]

_ESTIMATE = EstimateTokens()
_ENTRY_BYTES = 160  # a held estimate: the conversation id's key, an int, the cache's entry
_MARGIN = 1.1  # of the estimated prompt, for what a turn's hooks add (a longer system prompt, tools)
_MARGIN_TOKENS = 64
_SIZED_BYTES_PER_MESSAGE = 24  # a kept message's reference and its running sum


@dataclass(frozen=True, slots=True)
class _Sized:
    """The messages of a conversation's last estimated step and their sizes summed so far:
    ``sums[i]`` is the size of ``messages[: i + 1]`` (:func:`~turnwire.compaction.message_bytes`)."""

    messages: tuple[message_pb2.Message, ...]
    sums: tuple[int, ...]


class FirstStepEstimates:
    """What a new turn's first step is likely to send, as this process last saw it: per
    conversation, the tokens of its last step's prompt plus that step's output (the history a
    next turn starts from, with the system prompt and tools), in a region of the process's cache
    budget (bounded in bytes, least recently used dropped first); and the system prompt and tools
    of the last step sent at all, for a conversation never seen (assumed new). Estimates with
    :class:`~turnwire.compaction.EstimateTokens`, as the reservations do. Not thread-safe: the
    event loop's."""

    def __init__(self, region: CacheRegion | None = None, sized: CacheRegion | None = None) -> None:
        self.region = CACHES.region("first-step estimates") if region is None else region
        self.sized = CACHES.region("estimated step messages") if sized is None else sized
        self._framing: int | None = None

    def message_tokens(self, conversation_id: str, messages: Sequence[message_pb2.Message]) -> int:
        """``EstimateTokens().messages(messages)`` for a step of ``conversation_id``, walking only
        the messages that are not, object for object, where the conversation's last estimated step
        had them: a history the store hands out is the same objects from step to step and turn to
        turn, and nothing changes them in place (docs/semantics.md §3, "Messages are read-only"),
        so a step's estimate costs O(its new messages), not O(history). The messages are kept
        (their sizes counted against the cache budget) until the next step's replace them."""
        held = self.sized.get(conversation_id)
        kept: tuple[message_pb2.Message, ...] = held.messages if isinstance(held, _Sized) else ()
        same, limit = 0, min(len(kept), len(messages))
        while same < limit and kept[same] is messages[same]:
            same += 1
        sums = list(held.sums[:same]) if isinstance(held, _Sized) else []
        total = sums[-1] if sums else 0
        for message in messages[same:]:
            total += message_bytes(message)
            sums.append(total)
        size = total + _SIZED_BYTES_PER_MESSAGE * len(messages)
        self.sized.put(conversation_id, _Sized(tuple(messages), tuple(sums)), size)
        return int(total / _ESTIMATE.bytes_per_token) + _ESTIMATE.tokens_per_message * len(messages)

    def sent(self, conversation_id: str, prompt_tokens: int, framing_tokens: int) -> None:
        """A step of ``conversation_id`` is sent with ``prompt_tokens``, ``framing_tokens`` of
        them its system prompt and tool definitions."""
        self._framing = framing_tokens
        self.region.put(conversation_id, prompt_tokens, _ENTRY_BYTES)

    def answered(self, conversation_id: str, output_tokens: int) -> None:
        """That step answered with ``output_tokens``: they are history for the next turn."""
        held = self.region.get(conversation_id)
        if isinstance(held, int):
            self.region.put(conversation_id, held + output_tokens, _ENTRY_BYTES)

    def prompt_tokens(self, conversation_id: str, messages: Sequence[message_pb2.Message]) -> int | None:
        """The estimated prompt of a new turn of ``conversation_id`` whose input is ``messages``,
        with a margin; None before this process sent any step (nothing to go by)."""
        base = self.region.get(conversation_id)
        if not isinstance(base, int):
            if self._framing is None:
                return None
            base = self._framing
        return int((base + _ESTIMATE.messages(messages)) * _MARGIN) + _MARGIN_TOKENS


def refusing_budgets(
    settings: BudgetSettings, conversation_id: str, principal: str, now: dt.datetime
) -> tuple[BudgetLimits, ...]:
    """The budgets whose exhaustion refuses a new turn on ``conversation_id`` asked for by
    ``principal`` at ``now``: its conversation's, its tenant's and the principal's periods (not
    the turn's own, which starts empty). Empty when none is configured."""
    return tuple(
        budgets_for(settings, "", conversation_id, BudgetLimit(), now, principal=principal, with_turn=False)
    )


def budget_refusal(
    budget: BudgetLimits,
    spend: BudgetSpend,
    conversation_id: str,
    now: dt.datetime,
    ask: BudgetAsk | None = None,
) -> BudgetRefused:
    """The refusal of a new turn on ``conversation_id`` by ``budget``, exhausted at ``spend`` (or,
    given the first step's reservation ``ask``, without room for it): naming the budget, what ran
    out (and what the step needs) and when it resets (not counted: :func:`count_refusal`)."""
    if ask is None:
        why = exhausted_text(budget.tokens, budget.usd, spend)
    else:
        why = refusal_text(budget.tokens, budget.usd, spend, ask)
    return BudgetRefused(budget.key.scope, why, resets_in(budget.key, now))


def count_refusal(refusal: BudgetRefused, conversation_id: str) -> None:
    """Count ``refusal`` of a turn on ``conversation_id`` in ``turnwire_budget_exhausted_total``
    (once per refused turn, by whoever refuses it)."""
    metrics.BUDGET_EXHAUSTED.labels(tenant_of_key(conversation_id), refusal.budget).inc()


async def spent_budget(
    store: BudgetStore, settings: BudgetSettings, conversation_id: str, principal: str, now: dt.datetime
) -> BudgetRefused | None:
    """The refusal of a new turn on ``conversation_id`` asked for by ``principal`` by the first
    of its conversation's, tenant's or principal's budgets that is exhausted (None: none is),
    read now (one read, no lock; not counted: :func:`count_refusal`). The engine's check on a
    conversation with a turn running here, for new input that would stop one, and for a turn
    waiting in line; else the check rides the turn's admission (``Store.admit_turn``'s
    ``refuse``). A turn admitted in a race with another's last step meets the budget at its
    first step instead and ends with the same reason (the charge, under the rows' locks, never
    lets it overspend)."""
    budgets = refusing_budgets(settings, conversation_id, principal, now)
    if not budgets:
        return None
    spends = await store.budget_spends([budget.key for budget in budgets])
    for budget in budgets:
        spend = spends.get(budget.key, BudgetSpend())
        if budget.exhausted_by(spend):
            return budget_refusal(budget, spend, conversation_id, now)
    return None


def admission_charge(
    settings: BudgetSettings,
    estimates: FirstStepEstimates,
    request: TurnRequest,
    lease: TurnLease,
    *,
    rates: tuple[float, float] | None,
    now: dt.datetime,
) -> BudgetCharge | None:
    """The reservation a new turn's admission carries for its first step
    (:mod:`.budget_admission`): ``request``'s budgets at ``now``, the prompt ``estimates`` gives,
    the assumed output, priced at ``rates`` (US dollars per input and output token; None: the
    model has no known price). None when no budget applies, when nothing estimates the prompt
    yet, or when a US dollar budget applies to an unpriced model (its first step refuses it, as
    before)."""
    if not applies(settings, request.budget):
        return None
    turn_limit = lowered(settings.turn, request.budget)
    budgets = budgets_for(
        settings,
        request.request_id,
        request.conversation_id,
        turn_limit,
        now,
        principal=request.principal,
        with_turn=turn_limit.limited,
    )
    if not budgets or (rates is None and any(budget.usd is not None for budget in budgets)):
        return None
    prompt = estimates.prompt_tokens(request.conversation_id, request.messages)
    if prompt is None:
        return None
    usd_in, usd_out = rates or (0.0, 0.0)
    most = settings.assumed_max_output_tokens
    ask = BudgetAsk(prompt, prompt * usd_in, usd_out, most, min(settings.min_output_tokens, most))
    return BudgetCharge(request.request_id, request.conversation_id, lease, budgets, ask=ask)
