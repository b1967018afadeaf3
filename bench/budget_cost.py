"""What budgets (issue 37, docs/cost.md "Budgets") add to a request's store writes, on SQLite and
PostgreSQL, against the 0.3 ms CPU allowance per request.

One request is a turn of ``--steps`` model steps, measured from its admission to its final write:
the writes a running turn makes in any case (a checkpoint of the reply at the end of each step but
the last, ``save_message``; the final write, ``finish_turn``) plus what budgets add, in three arms
run interleaved on the same stores:

- **off**: no budget configured (``step_budgets`` returns None: no estimate, no charge);
- **separate** (before the folds): each step's reservation its own transaction
  (``charge_budget``, settling the previous step), the step's checkpoint another, the last
  settlement another (``StepBudgets.close``), then the final write;
- **folded** (now): the first step's reservation its own transaction, each later step's reservation
  and the previous step's settlement riding that step's checkpoint (``charge_budget(...,
  checkpoint=...)``), the last settlement riding the final write (``finish_turn(..., budget=...)``).

The added cost of an arm is its CPU per request minus the off arm's: this process's
(``time.process_time``: the prompt estimate, the programs, the driver; the SQLite writer thread
included) and, on PostgreSQL, the server backends' (``/proc/<pid>/stat`` of the database's
sessions). Budgets: the turn's, the conversation's and the tenant's day, in tokens and US dollars
(three rows locked per charge), a model priced by ``pricing.models``, ``--messages`` messages of
400 bytes in each step's history. A request PASSes when budgets add at most 0.3 ms of CPU to it
(client plus server). Run: ``.venv/bin/python bench/budget_cost.py [--steps 1] [--rounds 15] [--block 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import datetime as dt
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stores import both_stores, interleaved, print_arms

from turnwire.providers import ModelRequest
from turnwire.types import Cost, ModelSettings, Usage
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.budgets import StepBudgets
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.store import Store, TurnRecord

MODEL = "bench:model"
PRICES = PriceBook(PricingSettings.model_validate({"models": {MODEL: {"input_mtok": 3, "output_mtok": 15}}}))
BUDGETS = BudgetSettings.model_validate(
    {
        "turn": {"tokens": 10**12, "usd": 10**6},
        "conversation": {"tokens": 10**12, "usd": 10**6},
        "tenant": {"day": {"tokens": 10**12, "usd": 10**6}},
    }
)
ALLOWANCE_US = 300.0
ARMS = ("off", "separate", "folded")


def _history(messages: int) -> list[message_pb2.Message]:
    history = []
    for n in range(messages):
        message = message_pb2.Message(
            id=f"m{n}", role=message_pb2.ROLE_USER if n % 2 == 0 else message_pb2.ROLE_ASSISTANT
        )
        message.parts.add().text.text = "word " * 80
        history.append(message)
    return history


def _taken(reply: message_pb2.Message) -> Callable[[], Awaitable[message_pb2.Message]]:
    """``Checkpointer.take`` of a turn whose reply is ``reply`` and no checkpoint in flight."""

    async def take() -> message_pb2.Message:
        return reply

    return take


async def _turn(store: Store, arm: str, steps: int, request: ModelRequest, n: int) -> None:
    """One request of ``arm``: its admission (not measured by the caller's difference: every arm
    has it), its steps' writes and its final write."""
    turn = TurnRecord(
        request_id=f"{arm}-r{n}",
        conversation_id=f"{arm}-c{n}",
        assistant_message_id=f"{arm}-a{n}",
        continuation=False,
        model=MODEL,
        state="running",
        start_time=dt.datetime.now(dt.UTC),
        owner="bench",
    )
    user = message_pb2.Message(id=f"{arm}-u{n}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    await store.start_turn(turn, [user])
    reply = message_pb2.Message(id=turn.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
    budgets = None
    if arm != "off":
        budgets = StepBudgets(
            store,
            BUDGETS,
            PRICES,
            request_id=turn.request_id,
            conversation_id=turn.conversation_id,
            lease=turn.lease,
            turn_limit=BUDGETS.turn,
            recovered=False,
        )
    for step in range(steps):
        if budgets is not None:
            await budgets.reserve(
                request, MODEL, None, None, checkpoint=_taken(reply) if arm == "folded" and step > 0 else None
            )
            budgets.used(Usage(input_tokens=500, output_tokens=50), Cost(0.002, "config"))
        reply.parts.add().text.text = f"step {step} " * 40
        if step < steps - 1 and arm != "folded":  # the step's checkpoint (folded: the next charge)
            await store.save_message(turn.conversation_id, reply, lease=turn.lease)
    charge = None
    if budgets is not None and arm == "separate":
        await budgets.close()
    elif budgets is not None:
        charge = budgets.final_charge()
    ended = dataclasses.replace(turn, state="completed", end_time=dt.datetime.now(dt.UTC))
    grant = await store.finish_turn(ended, reply, budget=charge)
    if budgets is not None and charge is not None:
        budgets.settled_by(grant)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=20, help="requests per arm in a row")
    parser.add_argument("--rounds", type=int, default=15, help="blocks of each arm, interleaved")
    parser.add_argument("--steps", type=int, default=1, help="model steps per request")
    parser.add_argument("--messages", type=int, default=20, help="messages in each step's history")
    args = parser.parse_args()
    request = ModelRequest(
        model="model",
        system="You are a helpful assistant.",
        messages=_history(args.messages),
        settings=ModelSettings(),
    )
    async with both_stores() as (lite, pg, url):

        def run(store: Store, arm: str) -> Callable[[int], Awaitable[None]]:
            return lambda n: _turn(store, arm, args.steps, request, n)

        stores = (("SQLite", lite, None), ("PostgreSQL", pg, url))
        samples = await interleaved(stores, ARMS, run, rounds=args.rounds, block=args.block)
    load = os.getloadavg()[0]
    print_arms(samples, ARMS, ALLOWANCE_US)
    print(
        f"\n{args.steps} model step(s) per request; medians of {args.rounds} interleaved blocks of "
        f"{args.block} requests per arm (client: of the requests; server: of the blocks); budgets: turn, "
        f"conversation, tenant/day (tokens and USD); {args.messages} messages of 400 bytes per step; "
        f"load average {load:.1f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
