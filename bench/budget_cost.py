"""What budgets (issue 37, docs/cost.md "Budgets") add to each model step, on SQLite and PostgreSQL.

With a budget configured, a step runs :meth:`StepBudgets.reserve` before it is sent (the prompt
estimate over the step's history, the model's rates, and one store transaction that settles the
previous step and reserves this one: ``charge_budget``), and the turn's end one more charge
(``close``). With none configured, ``step_budgets`` returns None and nothing runs: zero by
construction, so only the "on" arm is measured. Budgets here: the turn's, the conversation's and
the tenant's day, in tokens and US dollars (four rows locked per charge), a model priced by
``pricing.models``, a history of ``--messages`` messages of 400 bytes.

Prints CPU per step: this process's (``time.process_time``: the estimate, the program, the
driver; the SQLite writer thread included) and, on PostgreSQL, the server backends'
(``/proc/<pid>/stat`` of the database's sessions), with the wall time per step.
Run: ``.venv/bin/python bench/budget_cost.py [--steps 500] [--messages 20]``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _stores import backend_cpu_s, both_stores

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


def _history(messages: int) -> list[message_pb2.Message]:
    history = []
    for n in range(messages):
        message = message_pb2.Message(
            id=f"m{n}", role=message_pb2.ROLE_USER if n % 2 == 0 else message_pb2.ROLE_ASSISTANT
        )
        message.parts.add().text.text = "word " * 80
        history.append(message)
    return history


async def _turn(
    store: Store, steps: int, messages: int, n: int, url: str | None
) -> tuple[float, float, float]:
    turn = TurnRecord(
        request_id=f"r{n}",
        conversation_id=f"c{n}",
        assistant_message_id=f"a{n}",
        continuation=False,
        model=MODEL,
        state="running",
        start_time=dt.datetime.now(dt.UTC),
        owner="bench",
    )
    user = message_pb2.Message(id=f"u{n}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    await store.start_turn(turn, [user])
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
    request = ModelRequest(
        model="model",
        system="You are a helpful assistant.",
        messages=_history(messages),
        settings=ModelSettings(),
    )
    server_before = backend_cpu_s(url) if url else 0.0
    cpu_before, wall_before = time.process_time(), time.perf_counter()
    for _ in range(steps):
        await budgets.reserve(request, MODEL, None, None)
        budgets.used(Usage(input_tokens=500, output_tokens=50), Cost(0.002, "config"))
    await budgets.close()
    cpu = (time.process_time() - cpu_before) / steps * 1e6
    wall = (time.perf_counter() - wall_before) / steps * 1e6
    server = ((backend_cpu_s(url) - server_before) / steps * 1e6) if url else 0.0
    return cpu, server, wall


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="steps per round (one turn)")
    parser.add_argument("--messages", type=int, default=20, help="messages in each step's history")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = []
    async with both_stores() as (lite, pg, url):
        await _turn(lite, 20, args.messages, -1, None)  # warm: imports, caches
        await _turn(pg, 20, args.messages, -1, url)
        for n in range(args.rounds):
            sqlite_cpu, _, sqlite_wall = await _turn(lite, args.steps, args.messages, n, None)
            pg_cpu, pg_server, pg_wall = await _turn(pg, args.steps, args.messages, n, url)
            rows.append((n + 1, sqlite_cpu, sqlite_wall, pg_cpu, pg_server, pg_wall))
    load = os.getloadavg()[0]
    print(
        "| round | SQLite CPU µs/step | SQLite wall µs/step | PG client CPU µs/step | PG server CPU µs/step "
        "| PG wall µs/step |"
    )
    print("|---|---|---|---|---|---|")
    for n, sc, sw, pc, ps, pw in rows:
        print(f"| {n} | {sc:.0f} | {sw:.0f} | {pc:.0f} | {ps:.0f} | {pw:.0f} |")
    print(
        f"\nbudgets on (turn, conversation, tenant/day; tokens and USD); off: 0 (nothing runs). "
        f"{args.steps} steps per round, {args.messages} messages of 400 bytes per step; "
        f"load average {load:.1f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
