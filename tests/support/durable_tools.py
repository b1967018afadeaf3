"""Test-only tools for the durable-turn tests, loaded by a real server as ``support.durable_tools:…``.

``wait`` sleeps (a tool a crash can land in); ``submit_followup`` calls the sidecar it runs in,
with the turn's request id as the parent (``turnwire-parent-request-id``), to submit a message
to its own conversation: the target comes from ``TURNWIRE_TEST_TARGET`` in the server's
environment.

The tool-effects tools (docs/semantics.md §8, "Tool effects") append one JSON line per run to the
file ``TURNWIRE_TEST_EFFECTS_LOG`` names (``{"tool", "call", "key", "rerun"}``): the log outlives
a SIGKILL, so it proves how often each ran. ``note`` answers at once; ``send_slow`` (not
idempotent) and ``charge_slow`` (idempotent) wait 60 s, except a re-run, which answers at once.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

from pydantic import BaseModel

from turnwire.tools import ToolExecution, tool
from turnwire_client import TurnwireClient

PARENT_HEADER = "turnwire-parent-request-id"


class WaitInput(BaseModel):
    seconds: float


@tool(WaitInput)
async def wait(args: WaitInput, execution: ToolExecution) -> dict[str, float]:
    """Wait ``seconds``, then answer."""
    await asyncio.sleep(args.seconds)
    return {"waited": args.seconds}


class FollowupInput(BaseModel):
    text: str


@tool(FollowupInput)
async def submit_followup(args: FollowupInput, execution: ToolExecution) -> dict[str, object]:
    """Submit ``text`` to this conversation; it runs after the current turn."""
    metadata = ((PARENT_HEADER, execution.request_id),)
    async with TurnwireClient(os.environ["TURNWIRE_TEST_TARGET"], metadata=metadata) as client:
        response = await client.submit_messages(execution.conversation_id, args.text)
    return {"submission_id": response.submission.submission_id, "accepted": response.accepted}


class CountdownInput(BaseModel):
    start: int


@tool(CountdownInput)
async def countdown(args: CountdownInput, execution: ToolExecution) -> Any:
    """A streaming tool: yields ``start``, ``start - 1`` … 1 as preliminary results, then ``"liftoff"``."""
    for left in range(args.start, 0, -1):
        yield {"left": left}
    yield "liftoff"


class NoInput(BaseModel):
    pass


def _log_run(tool_name: str, execution: ToolExecution) -> None:
    line = {
        "tool": tool_name,
        "call": execution.tool_call_id,
        "key": execution.idempotency_key,
        "rerun": execution.rerun,
    }
    with open(os.environ["TURNWIRE_TEST_EFFECTS_LOG"], "a") as log:
        log.write(json.dumps(line) + "\n")


@tool(NoInput)
async def note(args: NoInput, execution: ToolExecution) -> str:
    """Log the run and answer at once."""
    _log_run("note", execution)
    return "noted"


@tool(NoInput)
async def send_slow(args: NoInput, execution: ToolExecution) -> str:
    """Log the run, then take 60 s (a crash lands in it): not idempotent."""
    _log_run("send_slow", execution)
    await asyncio.sleep(60)
    return "sent"


@tool(NoInput, idempotent=True)
async def charge_slow(args: NoInput, execution: ToolExecution) -> str:
    """Log the run, then take 60 s unless it is a re-run (the key makes a repeat harmless)."""
    _log_run("charge_slow", execution)
    if not execution.rerun:
        await asyncio.sleep(60)
    return "charged once"
