"""Server-side tool calls of one step: validation, hooks, concurrent execution, results.

Calls start in the order the model emitted them and run concurrently; result
events and ``after_tool_call`` come in completion order; the stored message
keeps emission order (docs/semantics.md §3). Decisions and error
rules are that section's ``before_tool_call`` table.

Before a step's calls run (before ``before_tool_call``), each is marked ``started`` and the reply
is stored once for all of them (the step's checkpoint): a call found started without a result
after a crash may have had its effect (docs/semantics.md §8, "Tool effects").
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextlib
import dataclasses
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from turnwire import types as chunks
from turnwire.errors import ABORTED_TOOL_ERROR, INTERRUPTED_RUNNING_TOOL_ERROR
from turnwire.hooks import (
    ChunkContext,
    RepairToolCall,
    ToolCallContext,
    ToolCallOutcome,
    ToolCallResultContext,
)
from turnwire.tools import Tool, ToolError, ToolExecution, tool_timeout
from turnwire.values import NotJsonError, parse_tool_input
from turnwire_client.v1 import message_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.assistant_message import OutputTooLarge
from turnwire_server.engine.client_tools import hold_call
from turnwire_server.engine.ids import tool_idempotency_key
from turnwire_server.engine.turn_state import TurnWorkingState
from turnwire_server.engine.turn_timeline import TOOL
from turnwire_server.hooks.chain import HookError

log = logging.getLogger("turnwire.tools")

BLOCKED_TEXT = 'Tool "{name}" was blocked by beforeToolCall.'
BLOCKED = message_pb2.TOOL_CALL_DECISION_BLOCKED
SUBSTITUTED = message_pb2.TOOL_CALL_DECISION_SUBSTITUTED
_DECISIONS = {"blocked": BLOCKED, "substituted": SUBSTITUTED}
"""``after_tool_call`` outcomes that a hook's decision produced → the mark on the stored part."""
"""What the model sees for a block without a reason (Think's exact wording)."""


class ToolCallRunner:
    """Collects a step's complete tool calls, then runs them with their hooks.

    ``tool_timeout_seconds`` bounds each execution (a tool's own ``timeout_seconds`` replaces it);
    ``wait_for_reader`` is awaited after a result when the client is behind (backpressure); ``repair`` is the
    turn's ``repair_tool_call`` (or None); ``max_output_bytes`` bounds a result's
    JSON text (0: no bound; a larger result becomes the call's error). ``record_start`` stores the
    message that holds the calls (their ``started`` marks) and returns once it is stored, False
    when it could not be (the turn is ending or was taken over); default: the turn's checkpoint
    (:meth:`Checkpointer.store_now`).
    """

    def __init__(
        self,
        state: TurnWorkingState,
        tool_timeout_seconds: float,
        wait_for_reader: Callable[[], Awaitable[None]],
        repair: RepairToolCall | None = None,
        *,
        max_output_bytes: int = 0,
        redact: Callable[[str], str] = str,
        record_start: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self.turn = state  # the turn's working state
        self.record_start = record_start or state.checkpoints.store_now
        self._redact = redact  # EngineSettings.redact: a tool's error text is outside text
        self._tool_timeout_seconds = tool_timeout_seconds
        self._wait_for_reader = wait_for_reader
        self._max_output_bytes = max_output_bytes
        self._repair = repair
        self._pending: list[tuple[chunks.ToolCall, Tool, bool]] = []  # (call, tool, rerun)
        self._invalid: list[tuple[chunks.ToolCall, str, collections.abc.Set[str]]] = []
        self._had_results = False
        #: True once the last :meth:`run_pending` stored its calls as started (the step's
        #: checkpoint, docs/semantics.md §8 "Tool effects"; the step loop then writes no other).
        self.start_stored = False
        #: True once a call of this turn waits for the client (a client tool's call, an approval
        #: request): the step loop then ends the turn after the current step (docs/semantics.md §6).
        self.waiting = False

    def accept(self, call: chunks.ToolCall, allowed: collections.abc.Set[str]) -> None:
        """Record a complete call from the stream; invalid ones become input errors (or wait for
        :meth:`repair_invalid` when a ``repair_tool_call`` hook is set).

        A provider-executed call is stored and announced, never run and never offered to a hook
        (its result comes as a :class:`~turnwire.types.ToolResult`); a call of a tool the API
        defines as the application's (``call.client_executed``) that the turn has no tool for is
        held for the client as a client tool's call (docs/semantics.md §3, §6)."""
        turn = self.turn
        turn.assistant.complete_tool_call(call)
        if call.provider_executed:
            self._announce(call, provider_executed=True)
            return
        if call.client_executed and call.error is None and call.tool_name not in turn.tools:
            self._announce(call)
            turn.assistant.tool_call(call.tool_call_id).client_executed = True
            turn.checkpoints.progress()
            self.waiting = True
            return
        error = self._problem(call, allowed)
        if error is None:
            self._available(call, allowed)
        elif self._repair is not None:
            self._invalid.append((call, error, allowed))
        else:
            self._input_error(call, error)

    def _problem(self, call: chunks.ToolCall, allowed: collections.abc.Set[str]) -> str | None:
        if call.error is not None:
            return call.error
        if call.tool_name not in self.turn.tools or call.tool_name not in allowed:
            names = ", ".join(sorted(allowed)) or "none"
            return f"Model tried to call unavailable tool '{call.tool_name}'. Available tools: {names}."
        return None

    def _announce(self, call: chunks.ToolCall, *, provider_executed: bool = False) -> None:
        """The ``ToolInputAvailable`` event of a complete call."""
        event = self.turn.writer.new().tool_input_available
        event.tool_call_id = call.tool_call_id
        event.tool_name = call.tool_name
        part = self.turn.assistant.tool_call(call.tool_call_id)
        event.input_json = part.input_json
        if part.HasField("input"):
            event.input.CopyFrom(part.input)
        event.provider_executed = provider_executed

    def provider_result(self, result: chunks.ToolResult) -> None:
        """Store and stream the result of a provider-executed call (no tool hook runs: the provider
        ran it; ``on_chunk`` sees the chunk, as for any chunk of the stream)."""
        turn = self.turn
        part = turn.assistant.set_provider_result(result)
        if part.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
            error = turn.writer.new().tool_output_error
            error.tool_call_id = part.tool_call_id
            error.tool_name = part.tool_name
            error.error_text = part.error_text
            error.provider_executed = True
        else:
            output = turn.writer.new().tool_output_available
            output.tool_call_id = part.tool_call_id
            output.tool_name = part.tool_name
            output.output_json = part.output_json
            if part.HasField("output"):
                output.output.CopyFrom(part.output)
            output.provider_executed = True

    def _available(self, call: chunks.ToolCall, allowed: collections.abc.Set[str]) -> None:
        turn = self.turn
        self._announce(call)
        tool = turn.tools[call.tool_name]
        if hold_call(turn, call.tool_call_id, tool, call.input or {}):
            self.waiting = True
            return
        self._pending.append((call, tool, False))

    def queue(self, call: chunks.ToolCall, tool: Tool, *, rerun: bool = False) -> None:
        """Queue a call to run with the next :meth:`run_pending` without announcing it: an approved
        call resumed by a continuation (docs/semantics.md §6), or one a recovery runs (``rerun``:
        it was started before the crash and its tool is idempotent; §8, "Tool effects")."""
        self._pending.append((call, tool, rerun))

    def _input_error(self, call: chunks.ToolCall, error: str) -> None:
        turn = self.turn
        turn.assistant.set_error(call.tool_call_id, error)
        self._had_results = True
        event = turn.writer.new().tool_input_error
        event.tool_call_id = call.tool_call_id
        event.tool_name = call.tool_name
        event.raw_input = call.raw_input
        event.error_text = error

    async def repair_invalid(self, finish_reason: str) -> None:
        """Give invalid calls to ``repair_tool_call`` once the stream ended, except after an output
        limit (a cut-off call is never run with repaired, partial input)."""
        invalid, self._invalid = self._invalid, []
        for call, error, allowed in invalid:
            repaired: chunks.ToolCall | None = None
            if finish_reason != "length" and self._repair is not None:
                try:
                    outcome = self._repair(call, error)
                    repaired = await outcome if inspect.isawaitable(outcome) else outcome
                except Exception as repair_error:
                    log.warning("repair_tool_call raised for %s: %s", call.tool_call_id, repair_error)
            if repaired is not None and repaired.input is None and repaired.error is None:
                # A repair that gave only the input text: use it when it is a JSON object.
                parsed, problem = parse_tool_input(repaired.raw_input)
                repaired = dataclasses.replace(repaired, input=parsed, error=problem)
            if repaired is not None and self._problem(repaired, allowed) is None:
                fixed = dataclasses.replace(repaired, tool_call_id=call.tool_call_id)
                self.turn.assistant.complete_tool_call(fixed)
                self._available(fixed, allowed)
            else:
                self._input_error(call, error)

    async def run_pending(self, step_number: int) -> bool:
        """Run the step's accepted calls concurrently; True when the step produced any tool result."""
        pending, self._pending = self._pending, []
        had_results, self._had_results = self._had_results, False
        self.start_stored = False
        if not pending:
            return had_results
        refused = await self._start(pending)
        if len(pending) == 1:
            await self._run(*pending[0], step_number, refused)
        else:
            async with asyncio.TaskGroup() as group:
                for call, tool, rerun in pending:
                    group.create_task(self._run(call, tool, rerun, step_number, refused))
        return True

    async def _start(self, pending: list[tuple[chunks.ToolCall, Tool, bool]]) -> str | None:
        """Mark ``pending`` calls ``started`` and store that before any of them runs, in one write
        (docs/semantics.md §8, "Tool effects"). Returns None when they may run, else the error
        text every one of them gets instead (the start could not be stored: running them would
        leave a crash unable to tell that they may have had their effect)."""
        assistant = self.turn.assistant
        fresh = False
        for call, _, _ in pending:
            part = assistant.tool_call(call.tool_call_id)
            fresh = fresh or not part.started
            part.started = True
        if not fresh:  # all of them re-runs: their start is stored already
            return None
        try:
            if await self.record_start():
                self.start_stored = True
                return None
        except Exception as error:
            log.warning("the start of %d tool call(s) could not be stored: %s", len(pending), error)
            return "The tool call was not run: its start could not be stored (the store failed)."
        return "The tool call was not run: the turn is ending (or another replica runs it)."

    async def interrupted(self, call: chunks.ToolCall, step_number: int) -> None:
        """Give ``call``, started before a crash and not run again (its tool is not idempotent),
        its interrupted result: stored (``interrupted`` set) and streamed as ``ToolOutputError``
        with ``interrupted`` set, then ``after_tool_call`` with outcome ``interrupted``
        (docs/semantics.md §8, "Tool effects")."""
        self._had_results = True
        await self._error(call, step_number, INTERRUPTED_RUNNING_TOOL_ERROR, interrupted=True)
        metrics.TOOL_CALLS.labels(call.tool_name, "interrupted").inc()
        text = INTERRUPTED_RUNNING_TOOL_ERROR
        await self.turn.hooks.after_tool_call(
            self._finished(call, step_number, 0.0, error=text, outcome="interrupted")
        )

    async def _run(
        self, call: chunks.ToolCall, tool: Tool, rerun: bool, step_number: int, refused: str | None
    ) -> None:
        tracing = self.turn.tracing
        timeline = self.turn.timeline
        with (
            timeline.span(TOOL, call.tool_name, tool_call_id=call.tool_call_id) as timed,
            tracing.tool(call.tool_call_id, call.tool_name, tool, call.input or {}) as span,
        ):
            outcome, output, error_text = await self._call(call, tool, rerun, step_number, refused)
            tracing.end_tool(span, outcome=outcome, output=output, error_text=error_text)
            timeline.end(timed, outcome)

    async def _call(
        self, call: chunks.ToolCall, tool: Tool, rerun: bool, step_number: int, refused: str | None
    ) -> tuple[ToolCallOutcome, Any, str | None]:
        """Run one call with its hooks; returns its outcome, output and error text. ``refused``
        (its start could not be stored) fails it without running it or ``before_tool_call``.
        Raises CancelledError when the turn was cancelled during it (after its
        ``after_tool_call``)."""
        turn = self.turn
        request = turn.request
        key = self._key(call)
        model_input: dict[str, Any] = call.input or {}
        streaming = bool(getattr(tool, "streaming", False))
        started = time.perf_counter()
        success = True
        outcome: ToolCallOutcome = "executed"
        output: Any = None
        error_text: str | None = None
        cancelled = False
        try:
            if refused is not None:
                raise _Refused(refused)
            try:
                decision = await turn.hooks.before_tool_call(
                    ToolCallContext(
                        conversation_id=request.conversation_id,
                        request_id=request.request_id,
                        tool_call_id=call.tool_call_id,
                        tool_name=call.tool_name,
                        input=model_input,
                        step_number=step_number,
                        messages=turn.step_messages,
                        cancelled=turn.cancelled,
                        idempotency_key=key,
                        rerun=rerun,
                    )
                )
            except HookError as hook_error:
                success, error_text = False, self._redact(_describe(hook_error.__cause__ or hook_error))
            else:
                if decision.action == "block":
                    outcome = "blocked"
                    output = decision.reason or BLOCKED_TEXT.format(name=call.tool_name)
                    if streaming:
                        await self._result(call, step_number, output, preliminary=True, decided=BLOCKED)
                elif decision.action == "substitute":
                    outcome = "substituted"
                    output = decision.output
                    if streaming:
                        await self._result(call, step_number, output, preliminary=True, decided=SUBSTITUTED)
                else:
                    run_input = dict(decision.input) if decision.input is not None else model_input
                    try:
                        output = await self._execute(call, tool, run_input, step_number, key=key, rerun=rerun)
                    except Exception as tool_error:
                        success, error_text = False, self._redact(_describe(tool_error))
                        # The model sees the message alone; the type goes to the log (§11).
                        log.info(
                            "tool %s (call %s) raised %s: %s",
                            call.tool_name,
                            call.tool_call_id,
                            type(tool_error).__name__,
                            error_text,
                        )
        except _Refused as refusal:
            success, error_text = False, str(refusal)
        except asyncio.CancelledError:
            # Cut off by a cancel: the call still gets its after_tool_call, with the error
            # (docs/semantics.md §5); the cancel goes on once the hooks have run.
            cancelled, success, error_text = True, False, ABORTED_TOOL_ERROR
        duration_ms = (time.perf_counter() - started) * 1000.0
        if success:
            try:
                decided = _DECISIONS.get(outcome, message_pb2.TOOL_CALL_DECISION_UNSPECIFIED)
                await self._result(call, step_number, output, preliminary=False, decided=decided)
            except NotJsonError as not_json:
                success, error_text = False, f"the tool's result is not JSON: {not_json}"
            except OutputTooLarge as too_large:
                success, error_text = False, str(too_large)
        if not success:
            outcome = "failed"
            await self._error(call, step_number, error_text or "tool failed")
        metrics.TOOL_CALLS.labels(call.tool_name, outcome).inc()
        metrics.TOOL_CALL_DURATION.labels(call.tool_name).observe(duration_ms / 1000.0)
        await turn.hooks.after_tool_call(
            self._finished(
                call,
                step_number,
                duration_ms,
                output=output if success else None,
                error=None if success else (error_text or "tool failed"),
                outcome=outcome,
                rerun=rerun,
            )
        )
        if cancelled:
            raise asyncio.CancelledError
        return outcome, output, error_text

    def _finished(
        self,
        call: chunks.ToolCall,
        step_number: int,
        duration_ms: float,
        *,
        output: Any = None,
        error: str | None,
        outcome: ToolCallOutcome,
        rerun: bool = False,
    ) -> ToolCallResultContext:
        """``after_tool_call``'s context for ``call`` (the model's input); a call with an
        ``error`` did not succeed."""
        request = self.turn.request
        return ToolCallResultContext(
            conversation_id=request.conversation_id,
            request_id=request.request_id,
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            input=call.input or {},
            step_number=step_number,
            duration_ms=duration_ms,
            success=error is None,
            output=output,
            error=error,
            outcome=outcome,
            rerun=rerun,
            idempotency_key=self._key(call),
        )

    def _key(self, call: chunks.ToolCall) -> str:
        """``call``'s idempotency key (docs/tools.md, "Idempotency keys")."""
        turn = self.turn
        reply = None if turn.request.legacy_call_keys else turn.assistant.message.id
        return tool_idempotency_key(turn.request.conversation_id, reply, call.tool_call_id)

    async def _execute(
        self,
        call: chunks.ToolCall,
        tool: Tool,
        run_input: dict[str, Any],
        step_number: int,
        *,
        key: str,
        rerun: bool,
    ) -> Any:
        turn = self.turn
        execution = ToolExecution(
            tool_call_id=call.tool_call_id,
            conversation_id=turn.request.conversation_id,
            request_id=turn.request.request_id,
            step_number=step_number,
            cancelled=turn.cancelled,
            idempotency_key=key,
            rerun=rerun,
        )
        timeout = tool_timeout(tool, self._tool_timeout_seconds)
        # Expiry cancels the awaiting call: a process-isolated tool's worker process is killed,
        # a sync tool's thread is abandoned (it cannot be stopped), an async tool is cancelled.
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                result = await tool.execute(run_input, execution)
                if isinstance(result, collections.abc.AsyncIterator):
                    # A streaming tool: every yield is a preliminary result, the last one final.
                    # Closed at once when cut short (a cancel between two yields), so the tool's
                    # cleanup (a remote call's cancellation) does not wait for garbage collection.
                    last: Any = None
                    async with _closing(result):
                        async for value in result:
                            last = value
                            await self._result(call, step_number, value, preliminary=True)
                    return last
                return result
        except TimeoutError:
            if not deadline.expired():
                raise  # the tool's own TimeoutError (a socket's, say): an ordinary tool error
            raise ToolError(f"tool {call.tool_name!r} timed out after {timeout:g} s") from None

    async def _result(
        self,
        call: chunks.ToolCall,
        step_number: int,
        output: Any,
        *,
        preliminary: bool,
        decided: message_pb2.ToolCallDecision.ValueType = message_pb2.TOOL_CALL_DECISION_UNSPECIFIED,
    ) -> None:
        """Store and stream one (preliminary or final) result; ``decided`` marks a result a
        ``before_tool_call`` decision produced (blocked or substituted) on the part and the event."""
        turn = self.turn
        part = turn.assistant.set_output(
            call.tool_call_id, output, preliminary=preliminary, max_bytes=self._max_output_bytes
        )
        part.decision = decided
        event = turn.writer.new().tool_output_available
        event.tool_call_id = call.tool_call_id
        event.tool_name = call.tool_name
        event.output_json = part.output_json
        if part.HasField("output"):
            event.output.CopyFrom(part.output)
        event.preliminary = preliminary
        event.decision = decided
        await self._observe(part, step_number)

    async def _error(
        self, call: chunks.ToolCall, step_number: int, error_text: str, *, interrupted: bool = False
    ) -> None:
        """Store and stream the call's error; ``interrupted`` marks the interrupted result of a
        call a crash cut off (docs/semantics.md §8, "Tool effects")."""
        turn = self.turn
        part = turn.assistant.set_error(call.tool_call_id, error_text)
        part.interrupted = interrupted
        event = turn.writer.new().tool_output_error
        event.tool_call_id = call.tool_call_id
        event.tool_name = call.tool_name
        event.error_text = error_text
        event.interrupted = interrupted
        await self._observe(part, step_number)

    async def _observe(self, part: Any, step_number: int) -> None:
        turn = self.turn
        turn.checkpoints.progress()
        if turn.writer.backlogged:
            await self._wait_for_reader()
        if turn.hooks.observes_chunks:
            await turn.hooks.on_chunk(
                ChunkContext(turn.request.conversation_id, turn.request.request_id, step_number, part)
            )


class _Refused(Exception):
    """A call not run because its start could not be stored (:meth:`ToolCallRunner._start`)."""


@contextlib.asynccontextmanager
async def _closing(iterator: collections.abc.AsyncIterator[Any]) -> collections.abc.AsyncIterator[None]:
    """Close ``iterator`` on the way out when it can be closed (an async generator)."""
    try:
        yield
    finally:
        close = getattr(iterator, "aclose", None)
        if close is not None:
            await close()


def _describe(error: BaseException) -> str:
    """The error text the model sees: the exception's message as raised (``"boom"`` for
    ``Exception("boom")``; docs/semantics.md §11), its type name only when it has no message."""
    return str(error) or type(error).__name__
