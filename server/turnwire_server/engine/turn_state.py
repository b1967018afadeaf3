"""The mutable state of one running turn, shared by the turn, its step loop and its tool runner.

One explicit type instead of collaborators reaching into the turn object:
what the step loop and the tool runner read and write is exactly these fields.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from turnwire.compaction import CallKey
from turnwire.hooks import ConcurrentInput, StepFinishContext
from turnwire.tools import Tool
from turnwire.types import BudgetState, Usage
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.assistant_message import AssistantMessage
from turnwire_server.engine.call_ids import TurnCallIds
from turnwire_server.engine.checkpoints import Checkpointer
from turnwire_server.engine.cost import CostTotal
from turnwire_server.engine.events import EventWriter
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.engine.turn_timeline import TurnTimeline
from turnwire_server.hooks.chain import TurnHooks
from turnwire_server.store.records import BudgetCharge, BudgetGrant, TurnLease


class BudgetSettlement(Protocol):
    """An attempt's budget charges (:class:`turnwire_server.engine.budgets.StepBudgets`) left
    to settle when the turn ends: in its final write when it has one, else on their own."""

    def final_charge(self) -> BudgetCharge | None:
        """The settlement the turn's final write carries (None: nothing is reserved)."""
        ...

    def settled_by(self, grant: BudgetGrant | None) -> None:
        """The final write stored :meth:`final_charge` (``grant``: what it returned)."""
        ...

    async def close(self) -> None:
        """Settle on their own (a store transaction of its own)."""
        ...

    def states(self) -> tuple[BudgetState, ...]:
        """The budgets' states as the last charge left them."""
        ...


@dataclass(slots=True)
class TurnWorkingState:
    """One running turn's working state (not its stored state,
    :data:`turnwire_server.store.records.TurnState`).

    ``tools`` is the turn's tool set (``before_turn`` may add to it);
    ``cancelled`` is set when the turn is cancelled or interrupted (tools and
    hooks see it); ``steps`` are the finished steps; ``steps_started`` counts
    started steps (a step cut short counts); ``send_reasoning`` is false when
    ``before_turn`` hid reasoning; ``step_messages`` is what the model was sent
    in the current step (``ToolCallContext.messages``); ``attempt`` is the attempt being
    run (from 1; a recovery runs 2 and later); ``continue_reply`` is true while a recovery
    continues a stored partial reply and its first step has not finished (the model is
    then asked to continue it, docs/semantics.md §1).
    ``view`` is the history the model is sent this attempt (compacted: summary, tail, dropped
    outputs) and ``keep_from`` where this turn's input starts in it; ``elided_current`` the
    outputs of this reply's own calls the model is no longer sent; ``compactions`` counts the
    proactive compactions of this attempt (docs/semantics.md §9).
    ``admitted`` is when the turn was admitted (``time.perf_counter``) and ``first_token_seen``
    whether its time to first token was measured (once per turn, ``engine/metrics.py``).
    ``tracing`` creates the spans of its model and tool calls; ``timeline`` records what took its
    time, stored with its end (docs/inspector.md).
    ``concurrent_input`` is what ``before_turn`` is told about the strategy the request used on
    a busy conversation (None: a recovery or a submission).
    ``lease`` is the fencing token every write of the turn carries (None until its record
    exists): the store refuses a write once another replica took the turn over
    (docs/semantics.md §5, "Fencing").
    ``budget_states`` are the turn's budgets once its attempt's last charge settled them
    (``on_chat_response``'s; docs/cost.md, "Budgets in hooks"); ``unsettled`` the budget charges
    of the last attempt, until the turn's final write (or their own) settles them.
    """

    request: TurnRequest
    hooks: TurnHooks
    writer: EventWriter
    assistant: AssistantMessage
    checkpoints: Checkpointer
    tools: dict[str, Tool]
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    usage: Usage = field(default_factory=Usage)
    cost: CostTotal = field(default_factory=CostTotal)
    steps: list[StepFinishContext] = field(default_factory=list)
    steps_started: int = 0
    send_reasoning: bool = True
    step_messages: Sequence[message_pb2.Message] = ()
    call_ids: TurnCallIds | None = None  # made at the turn's first step (step_stream.py)
    attempt: int = 1
    continue_reply: bool = False
    view: Sequence[message_pb2.Message] = ()
    keep_from: int = 0
    elided_current: frozenset[CallKey] = frozenset()
    compactions: int = 0
    admitted: float = 0.0
    first_token_seen: bool = False
    tracing: Tracing = TRACING_OFF
    concurrent_input: ConcurrentInput | None = None
    lease: TurnLease | None = None
    budget_states: Sequence[BudgetState] = ()
    unsettled: BudgetSettlement | None = None
    timeline: TurnTimeline = field(default_factory=lambda: TurnTimeline(0.0))
