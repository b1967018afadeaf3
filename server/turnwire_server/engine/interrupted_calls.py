"""What a recovery does with the calls of its reply that a crash left without a result.

docs/semantics.md §8, "Tool effects". A recovery keeps such calls open
(:func:`~turnwire_server.engine.transcript.repair_unresolved_tool_calls` with
``keep_runnable``) and, once ``before_turn`` settled the turn's tools, this module decides each:

- a call that never started (no ``started`` mark: the sidecar stores that mark before any tool
  runs) has had no effect: it runs as it would have, hooks and all;
- a started call of an idempotent tool (:func:`~turnwire.tools.is_idempotent`) runs again, with the
  same idempotency key, ``rerun`` set for its hooks and its tool;
- any other started call is not run again: it gets the interrupted result (its effect may or may
  not have happened), streamed, stored, and given to ``after_tool_call`` with outcome
  ``interrupted``;
- a call whose tool is no longer offered gets an error result saying so (started ones the
  interrupted result).

A call whose result is stored is never looked at: it is never run again.
"""

from __future__ import annotations

from collections.abc import Callable

from turnwire import types as chunks
from turnwire.tools import is_idempotent
from turnwire.values import tool_call_input
from turnwire_server.engine.tool_calls import ToolCallRunner
from turnwire_server.engine.transcript import runnable_on_recovery
from turnwire_server.engine.turn_state import TurnWorkingState

RunnerFactory = Callable[[TurnWorkingState], ToolCallRunner]
"""Makes the tool runner for a turn state (the step loop's settings: timeout, backpressure, limits)."""


async def resume_interrupted_calls(state: TurnWorkingState, runner_for: RunnerFactory) -> None:
    """Run, run again or interrupt the open calls of the reply a recovery continues
    (``state.continue_reply``; see the module docstring), before its first model call, which is
    then sent their results with the reply. Raises ``asyncio.CancelledError`` when the turn is
    cancelled meanwhile (after the calls' hooks)."""
    if not state.continue_reply:
        return
    runner = runner_for(state)
    step_number = -1
    last_step = 0
    queued = False
    for part in list(state.assistant.message.parts):
        kind = part.WhichOneof("kind")
        if kind == "step_start":
            step_number += 1
            continue
        if kind != "tool_call" or not runnable_on_recovery(part.tool_call):
            continue
        stored = part.tool_call
        call = chunks.ToolCall(
            stored.tool_call_id, stored.tool_name, tool_call_input(stored), raw_input=stored.input_json
        )
        step = max(step_number, 0)
        tool = state.tools.get(stored.tool_name)
        if tool is not None and (not stored.started or is_idempotent(tool)):
            runner.queue(call, tool, rerun=stored.started)
            queued, last_step = True, step
        elif stored.started:
            await runner.interrupted(call, step)
        else:
            state.assistant.set_error(
                stored.tool_call_id,
                f"The tool '{stored.tool_name}' is no longer available, so it was not run.",
            )
            event = state.writer.new().tool_output_error
            event.tool_call_id = stored.tool_call_id
            event.tool_name = stored.tool_name
            event.error_text = part.tool_call.error_text
    if queued:
        await runner.run_pending(last_step)
