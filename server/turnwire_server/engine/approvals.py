"""What a turn does first with answered approvals: announce denials, run approved calls.

docs/semantics.md §6. Before a turn's first model call (after ``before_turn``), every
approved call still waiting to run (``approval-responded``, approved) is run like any
server tool call: ``before_tool_call`` still decides (a block wins), ``after_tool_call``
fires, the ``ToolOutputAvailable``/``ToolOutputError`` events stream in this turn's
stream. Each result is recorded in the assistant message that holds the call (not this
turn's new reply) and that message is stored; the model then sees the results, and is
told about denied calls (their ``output-denied`` results). Calls denied just before this
turn (``TurnRequest.tool_denials``) are announced first with ``ToolOutputDenied``.

Each such call is announced first with ``ToolInputAvailable`` (its input and its
``approval_id``, :func:`announce_answered_call`): its ``ToolInputStart`` was in the stream of
the turn that asked for the approval, and a door that shows a call with its input (an OpenAI
``mcp_call``'s ``arguments`` and ``approval_request_id``, an AI SDK tool part, AG-UI's
``TOOL_CALL_ARGS``) reads it from this stream alone.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable

from turnwire import types as chunks
from turnwire.values import tool_call_input
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.assistant_message import AssistantMessage
from turnwire_server.engine.pending_calls import OpenCalls, is_approved
from turnwire_server.engine.tool_calls import ToolCallRunner
from turnwire_server.engine.turn_state import TurnWorkingState
from turnwire_server.store.turns import TurnStore

RunnerFactory = Callable[[TurnWorkingState], ToolCallRunner]
"""Makes the tool runner for a turn state (the step loop's settings: timeout, backpressure, limits)."""


def announce_answered_call(
    event: event_pb2.TurnEvent, tool_call_id: str, tool_name: str, input_json: str, approval_id: str
) -> event_pb2.ToolInputAvailable:
    """Make ``event`` the ``ToolInputAvailable`` of a call an earlier turn made whose approval was
    answered (``approval_id``), sent before its result in the stream that gives it (see the
    module docstring); ``input_json`` is the call's stored input. Returns the payload."""
    announced = event.tool_input_available
    announced.tool_call_id = tool_call_id
    announced.tool_name = tool_name
    announced.input_json = input_json
    announced.approval_id = approval_id
    return announced


def announce_denials(state: TurnWorkingState) -> None:
    """Send ``ToolInputAvailable`` then ``ToolOutputDenied`` for each call the request says was
    just denied."""
    for denial in state.request.tool_denials:
        announce_answered_call(
            state.writer.new(), denial.tool_call_id, denial.tool_name, denial.input_json, denial.approval_id
        )
        event = state.writer.new().tool_output_denied
        event.tool_call_id = denial.tool_call_id
        event.tool_name = denial.tool_name
        event.reason = denial.reason


def _saver(
    store: TurnStore, state: TurnWorkingState, message: message_pb2.Message
) -> Callable[[], Awaitable[bool]]:
    """What stores ``message`` (an earlier reply whose approved calls run, marked ``started``)
    before they run (docs/semantics.md §8, "Tool effects")."""

    async def save() -> bool:
        await store.save_message(state.request.conversation_id, message, lease=state.lease)
        return True

    return save


async def run_approved_calls(
    state: TurnWorkingState,
    store: TurnStore,
    open_calls: OpenCalls,
    runner_for: RunnerFactory,
) -> list[tuple[message_pb2.Message, message_pb2.Message]]:
    """Run the approved calls of ``open_calls.history`` (only the messages ``open_calls`` found
    are looked at) and store each message that held one, even when the turn is cancelled
    meanwhile. The messages are shared (never changed in place): the results land in a copy of
    each such message, which takes its place in ``open_calls.history``. Returns ``(message,
    its copy with the results)`` pairs, for the caller's other lists.

    A call whose tool is no longer in the turn's tool set gets an error result naming it.
    Raises ``asyncio.CancelledError`` when the turn is cancelled (after storing).
    """
    messages = open_calls.history
    replaced: list[tuple[message_pb2.Message, message_pb2.Message]] = []
    for index in open_calls.at:
        stored = messages[index]
        if not any(part.HasField("tool_call") and is_approved(part.tool_call) for part in stored.parts):
            continue
        message = message_pb2.Message()
        message.CopyFrom(stored)
        messages[index] = message
        replaced.append((stored, message))
        approved = [
            part.tool_call
            for part in message.parts
            if part.HasField("tool_call") and is_approved(part.tool_call)
        ]
        original = AssistantMessage.resume(message)
        runner = runner_for(dataclasses.replace(state, assistant=original, step_messages=messages))
        runner.record_start = _saver(store, state, message)
        for call in approved:
            chunk = chunks.ToolCall(
                call.tool_call_id, call.tool_name, tool_call_input(call), raw_input=call.input_json
            )
            announced = announce_answered_call(
                state.writer.new(), call.tool_call_id, call.tool_name, call.input_json, call.approval.id
            )
            if call.HasField("input"):  # the deprecated Struct view, as every ToolInputAvailable's
                announced.input.CopyFrom(call.input)
            tool = state.tools.get(call.tool_name)
            if tool is None:
                original.set_error(
                    call.tool_call_id,
                    f"The approved tool '{call.tool_name}' is no longer available, so it was not run.",
                )
                event = state.writer.new().tool_output_error
                event.tool_call_id = call.tool_call_id
                event.tool_name = call.tool_name
                event.error_text = call.error_text
                continue
            runner.queue(chunk, tool)
        try:
            await runner.run_pending(0)
        finally:
            # Shielded: the results (or the abort errors of a cancel) must reach the store.
            await asyncio.shield(
                store.save_message(state.request.conversation_id, message, lease=state.lease)
            )
    return replaced
