"""Turns and tokens per minute per principal (``rate_limits:``), on the ``limits`` library.

A principal is a name within a tenant: its windows are keyed by both (tenant first; a tenant name
holds no ``/``, so the key names one pair), and overrides are looked up the same way
(:meth:`RateLimitSettings.for_caller`). Two tenants' principals of the same name never share a
window or an override (issue 32 item 4).

Both limits are ``limits``' sliding-window counters of one minute (the current minute's count
plus the previous one's, weighted by how much of it is still in the window: two counters per
principal, whatever the limit) in its in-memory storage, so they hold per replica: N replicas
behind a load balancer admit up to N times the configured rate.

* **Turns**: each call that starts a turn (``Chat``, ``SaveMessages``, ``ContinueLastTurn``,
  ``SubmitToolResults``, ``SubmitToolApprovals``, ``SubmitMessages``) takes one from the
  principal's window when it arrives; with none left it is refused.
* **Tokens** are known only as the model reports them, so they are charged afterwards, from the
  ``StepFinish`` usage (``total_tokens``) streamed to the call that started the turn; a
  turn-starting call is refused while the window is spent. ``limits`` records a cost only when
  it fits, so a step that overshoots fills the window to its limit and carries no debt into the
  next minute. Not charged: replays (``ResumeTurn``, ``WatchSubmission``: the same steps
  again), steps of a turn that goes on after its caller left (disconnect policy ``CONTINUE``),
  and the turns of submissions, which no caller streams (they do count as turns).

A refusal is ``RESOURCE_EXHAUSTED`` with ErrorInfo reason ``RATE_LIMITED`` (metadata
``limit``: ``turns_per_minute`` or ``tokens_per_minute``) and a RetryInfo delay until the
window has room again (AIP-193).
"""

from __future__ import annotations

import math
import time

import grpc
from limits import RateLimitItem, RateLimitItemPerMinute
from limits.aio.storage import MemoryStorage
from limits.aio.strategies import SlidingWindowCounterRateLimiter

from turnwire_server.access_settings import RateLimitSettings
from turnwire_server.api.caller import Caller
from turnwire_server.api.status import TurnwireStatusError


def _window(caller: Caller) -> tuple[str, str]:
    """The identifiers of ``caller``'s windows: its tenant, then its principal."""
    return (caller.tenant, caller.principal)


class RateLimits:
    """The windows of every (tenant, principal) on this replica."""

    def __init__(self, settings: RateLimitSettings) -> None:
        self.settings = settings
        self._limiter = SlidingWindowCounterRateLimiter(MemoryStorage())
        self._items: dict[tuple[str, int], RateLimitItem] = {}

    def _item(self, kind: str, per_minute: int) -> RateLimitItem:
        item = self._items.get((kind, per_minute))
        if item is None:
            item = self._items[(kind, per_minute)] = RateLimitItemPerMinute(per_minute, namespace=kind)
        return item

    async def admit_turn(self, caller: Caller) -> None:
        """Take one turn from ``caller``'s window. Raises :class:`TurnwireStatusError`
        (RATE_LIMITED) when the turn or the token window is spent."""
        limit = self.settings.for_caller(caller.principal, caller.tenant)
        if limit.tokens_per_minute:
            tokens = self._item("tokens", limit.tokens_per_minute)
            if not await self._limiter.test(tokens, *_window(caller)):
                raise await self._refusal(tokens, caller, "tokens_per_minute", limit.tokens_per_minute)
        if limit.turns_per_minute:
            turns = self._item("turns", limit.turns_per_minute)
            if not await self._limiter.hit(turns, *_window(caller)):
                raise await self._refusal(turns, caller, "turns_per_minute", limit.turns_per_minute)

    async def charge_tokens(self, caller: Caller, tokens: int) -> None:
        """Charge ``tokens`` a step of ``caller``'s turn used (up to what the window has left)."""
        limit = self.settings.for_caller(caller.principal, caller.tenant)
        if not limit.tokens_per_minute or tokens <= 0:
            return
        item = self._item("tokens", limit.tokens_per_minute)
        stats = await self._limiter.get_window_stats(item, *_window(caller))
        cost = min(tokens, stats.remaining)
        if cost > 0:
            await self._limiter.hit(item, *_window(caller), cost=cost)

    async def _refusal(
        self, item: RateLimitItem, caller: Caller, name: str, amount: int
    ) -> TurnwireStatusError:
        stats = await self._limiter.get_window_stats(item, *_window(caller))
        delay = max(1, math.ceil(stats.reset_time - time.time()))
        return TurnwireStatusError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"rate limit reached: {amount} {name.replace('_per_minute', '')} per minute "
            f"(rate_limits.{name}); retry after {delay} s",
            reason="RATE_LIMITED",
            retry_after_seconds=delay,
            metadata={"limit": name, "per_minute": str(amount)},
        )
