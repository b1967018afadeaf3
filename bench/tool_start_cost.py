"""What the durable "started" record of tool calls (issue 40, docs/semantics.md §8 "Tool effects")
adds to a request's store writes, on SQLite and PostgreSQL, against the 0.3 ms CPU allowance per
request.

One request is a turn of two model steps, the first calling ``--calls`` tools, measured from its
admission to its final write, in three arms run interleaved on the same stores:

- **before** (no started record): the first step's checkpoint after its tools ran (the reply with
  the calls and their results, ``save_message``), then the final write (``finish_turn``);
- **separate**: the started record as a write of its own (the reply with the calls marked
  ``started``) before the tools run, then the step's checkpoint after them, then the final write;
- **folded** (now): the started record is the step's checkpoint, written before the tools run; the
  results ride the interval's timer or, in a request shorter than an interval (this one), the final
  write (``ToolCallRunner.start_stored``, ``StepLoop``).

The added cost of an arm is its CPU per request minus the before arm's: this process's
(``time.process_time``: the programs, the driver; the SQLite writer thread included) and, on
PostgreSQL, the server backends' (``/proc/<pid>/stat`` of the database's sessions). A request
PASSes when the arm adds at most 0.3 ms of CPU to it (client plus server). Run:
``.venv/bin/python bench/tool_start_cost.py [--calls 1] [--rounds 9] [--block 20]`` (about a
minute).
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
from support.store_turns import started_turn

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store

ALLOWANCE_US = 300.0
ARMS = ("before", "separate", "folded")


async def _turn(store: Store, arm: str, calls: int, n: int) -> None:
    """One request of ``arm`` (see the module docstring): its admission (every arm has it), the
    tool step's writes and the final write."""
    turn = await started_turn(store, f"{arm}-c{n}", n)
    reply = message_pb2.Message(id=turn.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
    reply.parts.add().step_start.SetInParent()
    reply.parts.add().text.text = "let me look that up " * 5
    parts = []
    for index in range(calls):
        call = reply.parts.add().tool_call
        call.tool_call_id = f"call_0_{index}"
        call.tool_name = "lookup"
        call.input_json = '{"query": "the weather in Lisbon tomorrow"}'
        call.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
        parts.append(call)
    if arm != "before":  # the started record, before the tools run
        for call in parts:
            call.started = True
        await store.save_message(turn.conversation_id, reply, lease=turn.lease)
    for call in parts:  # the tools ran
        call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        call.output_json = '{"forecast": "sunny", "high_c": 24}'
    if arm != "folded":  # the step's checkpoint (folded: the started record was it)
        await store.save_message(turn.conversation_id, reply, lease=turn.lease)
    reply.parts.add().step_start.SetInParent()
    reply.parts.add().text.text = "It will be sunny, 24 °C. " * 4
    ended = dataclasses.replace(turn, state="completed", end_time=dt.datetime.now(dt.UTC))
    await store.finish_turn(ended, reply)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--block", type=int, default=20, help="requests per arm in a row")
    parser.add_argument("--rounds", type=int, default=9, help="blocks of each arm, interleaved")
    parser.add_argument("--calls", type=int, default=1, help="tool calls in the request's tool step")
    args = parser.parse_args()
    async with both_stores() as (lite, pg, url):

        def run(store: Store, arm: str) -> Callable[[int], Awaitable[None]]:
            return lambda n: _turn(store, arm, args.calls, n)

        stores = (("SQLite", lite, None), ("PostgreSQL", pg, url))
        samples = await interleaved(stores, ARMS, run, rounds=args.rounds, block=args.block)
    print_arms(samples, ARMS, ALLOWANCE_US)
    print(
        f"\n{args.calls} tool call(s) in the request's tool step, two model steps; medians of "
        f"{args.rounds} interleaved blocks of {args.block} requests per arm (client: of the requests; "
        f"server: of the blocks); load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
