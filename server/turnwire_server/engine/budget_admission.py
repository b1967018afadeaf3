"""A new turn's first reservation in the transaction that admits it (docs/cost.md, "What it
costs per request").

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

from collections.abc import Sequence

from turnwire.compaction import EstimateTokens
from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CACHES, CacheRegion

__all__ = ["FirstStepEstimates"]

_ESTIMATE = EstimateTokens()
_ENTRY_BYTES = 160  # a held estimate: the conversation id's key, an int, the cache's entry
_MARGIN = 1.1  # of the estimated prompt, for what a turn's hooks add (a longer system prompt, tools)
_MARGIN_TOKENS = 64


class FirstStepEstimates:
    """What a new turn's first step is likely to send, as this process last saw it: per
    conversation, the tokens of its last step's prompt plus that step's output (the history a
    next turn starts from, with the system prompt and tools), in a region of the process's cache
    budget (bounded in bytes, least recently used dropped first); and the system prompt and tools
    of the last step sent at all, for a conversation never seen (assumed new). Estimates with
    :class:`~turnwire.compaction.EstimateTokens`, as the reservations do. Not thread-safe: the
    event loop's."""

    def __init__(self, region: CacheRegion | None = None) -> None:
        self.region = CACHES.region("first-step estimates") if region is None else region
        self._framing: int | None = None

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
