"""One model stream of a step: its chunks to the reply, the client and ``on_chunk``, and the step's
result (docs/semantics.md §2, "Steps"; §11 for the usage of a stream cut short).

:class:`StepStream` is the part of :class:`~.step_loop.StepLoop` that consumes a provider's stream
and builds the step's :class:`StepFinishContext` and ``StepFinish`` event; the loop around it
(hooks, tool calls, budgets, stop conditions) is :mod:`.step_loop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from google.protobuf import struct_pb2

from turnwire import types as chunks
from turnwire.hooks import (
    ChunkContext,
    StepFinishContext,
)
from turnwire.providers import ProviderError, transcript_call_ids
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.budgets import StepBudgets, step_budgets
from turnwire_server.engine.call_ids import TurnCallIds
from turnwire_server.engine.compaction import Compactor
from turnwire_server.engine.errors import ModelTimeout, SlowConsumer, TurnFailure
from turnwire_server.engine.settings import EngineSettings
from turnwire_server.engine.step_record import bounded_metadata
from turnwire_server.engine.tool_calls import ToolCallRunner
from turnwire_server.engine.turn_state import TurnWorkingState
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.base import TurnRunStore

log = logging.getLogger("turnwire.turn")

FIRST_TOKEN_HANDOVER_SECONDS = 0.25
"""How long a turn's task waits, at most, for its RPC to take the first token before it goes on
(:meth:`StepStream._first_token`): a reader that does not take it by then is handled by the usual
backpressure (docs/semantics.md §5)."""

_FINISH_REASONS = {
    "stop": event_pb2.FINISH_REASON_STOP,
    "length": event_pb2.FINISH_REASON_LENGTH,
    "tool-calls": event_pb2.FINISH_REASON_TOOL_CALLS,
    "content-filter": event_pb2.FINISH_REASON_CONTENT_FILTER,
    "error": event_pb2.FINISH_REASON_ERROR,
    "other": event_pb2.FINISH_REASON_OTHER,
}

_RESOLVED = (message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE, message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR)


class StepStream:
    """A step's model stream and result; :class:`~.step_loop.StepLoop` (its constructor's
    arguments are documented there) runs the steps around it."""

    def __init__(
        self,
        state: TurnWorkingState,
        *,
        store: TurnRunStore,
        providers: ProviderRegistry,
        settings: EngineSettings,
        stop: Callable[[BaseException], object],
        compactor: Compactor | None = None,
        budgets: StepBudgets | None = None,
    ) -> None:
        self.state = state
        self.store = store
        self.providers = providers
        self.settings = settings
        self.stop = stop
        self.compactor = compactor
        # The current step's metric labels (engine/metrics.py).
        self._provider_label = ""
        self._model_label = ""
        # The current step's model id and provider type, which price its usage (engine/cost.py).
        self._model_id = ""
        self._provider_type: str | None = None
        self._metadata_view: struct_pb2.Struct | None = None  # the finished step's, bounded
        # The attempt's charges: the admission's (its first reservation stored), else new ones
        # (None: no budget configured).
        self.budgets = budgets if budgets is not None else step_budgets(store, settings, state)

    async def wait_for_reader(self) -> None:
        """Backpressure: wait for the client to read a backlog. One that reads nothing that helps
        within ``slow_reader_timeout_seconds`` has its turn stopped (SLOW_CONSUMER), or, with
        disconnect policy CONTINUE, is let go: its call ends and the turn goes on without it
        (it re-attaches with ResumeTurn; docs/semantics.md §5)."""
        timeout = self.settings.limits.slow_reader_timeout_seconds
        if not await self.state.writer.drained(timeout):
            if self.state.request.disconnect == "continue":
                reason = SlowConsumer(timeout, stopped=False)
                log.warning("turn %s goes on without its caller: %s", self.state.request.request_id, reason)
                self.state.writer.channel.detach(reason)
                return
            self.stop(SlowConsumer(timeout))
            await asyncio.sleep(0)  # the stop cancels this task: let it land here

    def _price(self, usage: chunks.Usage) -> chunks.Cost | None:
        """The cost of the current step's ``usage`` (None: unknown, docs/cost.md)."""
        return self.settings.prices.cost(self._model_id, self._provider_type, usage)

    def _step_result(
        self, step_number: int, finish: chunks.FinishStep, cost: chunks.Cost | None
    ) -> StepFinishContext:
        turn = self.state
        assistant = turn.assistant
        assistant.close_all()
        calls = assistant.step_tool_calls()
        # Hidden reasoning stays between the engine and the model: hooks do not see it either.
        reasoning = assistant.step_reasoning() if turn.send_reasoning else []
        # One bounded record for the hooks, the event and the stored step (step_record.py).
        metadata, view, dropped = bounded_metadata(finish.provider_metadata)
        warnings = (*finish.warnings, *assistant.step_warnings(), *dropped)
        assistant.record_step(
            response_id=finish.response_id,
            response_model=finish.response_model,
            provider_metadata=view,
            warnings=warnings,
        )
        self._metadata_view = view
        return StepFinishContext(
            step_number=step_number,
            text=assistant.step_text(),
            reasoning=reasoning,
            reasoning_text="".join(r.text for r in reasoning),
            tool_calls=calls,
            tool_results=[*(c for c in calls if c.state in _RESOLVED), *assistant.step_late_results()],
            finish_reason=finish.finish_reason,
            raw_finish_reason=finish.raw_finish_reason,
            usage=finish.usage,
            response_id=finish.response_id,
            response_model=finish.response_model,
            model=self._model_id,
            provider_metadata=metadata,
            warnings=warnings,
            sources=assistant.step_sources(),
            files=assistant.step_files(),
            conversation_id=turn.request.conversation_id,
            request_id=turn.request.request_id,
            cost=cost,
            budgets=self.budgets.states() if self.budgets is not None else (),
        )

    def _step_finish_event(self, result: StepFinishContext, finish: chunks.FinishStep) -> None:
        event = self.state.writer.new().step_finish
        event.step_number = result.step_number
        event.finish_reason = _FINISH_REASONS.get(finish.finish_reason, event_pb2.FINISH_REASON_OTHER)
        event.raw_finish_reason = finish.raw_finish_reason
        finish.usage.copy_to(event.usage)
        if result.cost is not None:
            result.cost.copy_to(event.cost)
        event.response_id = finish.response_id
        event.response_model = finish.response_model
        event.model = result.model
        if self._metadata_view is not None and self._metadata_view.fields:
            event.provider_metadata.CopyFrom(self._metadata_view)
        event.warnings.extend(result.warnings)

    async def _stream(
        self,
        stream: AsyncGenerator[Any, None],
        step_number: int,
        allowed: set[str],
        runner: ToolCallRunner,
        chunk_timeout: float | None,
    ) -> chunks.FinishStep:
        """Consume one model stream: events, message parts, on_chunk. Returns its FinishStep.

        Chunks are dispatched on their exact type (cheaper than isinstance or
        match on the hot path), hence ``Any`` for the stream's items.
        """
        turn = self.state
        writer = turn.writer
        assistant = turn.assistant
        hooks = turn.hooks
        observe = hooks.observes_chunks
        send_reasoning = turn.send_reasoning
        progress = turn.checkpoints.progress
        request = turn.request
        finish: chunks.FinishStep | None = None
        partial: chunks.Usage | None = None
        first_token = not turn.first_token_seen
        loop = asyncio.get_running_loop()
        ids = turn.call_ids
        if ids is None:
            ids = turn.call_ids = TurnCallIds(
                assistant.call_state,
                assistant.awaits_provider_result,
                lambda: (*assistant.tool_call_ids(), *transcript_call_ids(turn.step_messages)),
            )
        ids.provider = self._provider_label
        try:
            async with contextlib.aclosing(stream) as model_stream, asyncio.timeout(chunk_timeout) as gap:
                async for received in model_stream:
                    chunk: Any = received  # a tool call's under its id in the turn (TurnCallIds)
                    if chunk_timeout is not None:
                        gap.reschedule(loop.time() + chunk_timeout)
                    kind = type(chunk)
                    # Ordered by frequency: deltas dominate.
                    if kind is chunks.TextDelta:
                        assistant.append(chunk.id, chunk.delta)
                        writer.text_delta(chunk.id, chunk.delta)
                        if first_token:
                            first_token = await self._first_token(sent=True)
                    elif kind is chunks.ReasoningDelta:
                        # Hidden reasoning (send_reasoning=False) is kept for the model's
                        # next step but neither streamed nor stored.
                        assistant.append(chunk.id, chunk.delta)
                        if send_reasoning:
                            writer.reasoning_delta(chunk.id, chunk.delta)
                        if first_token:
                            first_token = await self._first_token(sent=send_reasoning)
                    elif kind is chunks.ToolInputDelta:
                        chunk = ids.delta(chunk)
                        input_delta = writer.new().tool_input_delta
                        input_delta.tool_call_id = chunk.tool_call_id
                        input_delta.input_text_delta = chunk.delta
                    elif kind is chunks.TextStart:
                        assistant.open_block(chunk.id, "text")
                        writer.new().text_start.id = chunk.id
                    elif kind is chunks.TextEnd:
                        assistant.close_block(chunk.id)
                        writer.new().text_end.id = chunk.id
                    elif kind is chunks.ReasoningStart:
                        assistant.open_block(chunk.id, "reasoning")
                        if send_reasoning:
                            writer.new().reasoning_start.id = chunk.id
                    elif kind is chunks.ReasoningEnd:
                        assistant.close_block(chunk.id, chunk)
                        if send_reasoning:
                            writer.new().reasoning_end.id = chunk.id
                    elif kind is chunks.ToolInputStart:
                        chunk = ids.start(chunk)
                        executed = chunk.provider_executed
                        assistant.start_tool_call(chunk.tool_call_id, chunk.tool_name, executed)
                        input_start = writer.new().tool_input_start
                        input_start.tool_call_id = chunk.tool_call_id
                        input_start.tool_name = chunk.tool_name
                        input_start.provider_executed = executed
                    elif kind is chunks.ToolCall:
                        chunk = ids.call(chunk)
                        runner.accept(chunk, allowed)
                    elif kind is chunks.ToolResult:
                        chunk = ids.result(chunk)
                        runner.provider_result(chunk)
                    elif kind is chunks.Source:
                        writer.new().source.CopyFrom(assistant.add_source(chunk))
                    elif kind is chunks.File:
                        writer.new().file.CopyFrom(assistant.add_file(chunk))
                    elif kind is chunks.UsageUpdate:
                        partial = chunk.usage
                    elif kind is chunks.FinishStep:
                        finish = chunk
                    if observe:
                        await hooks.on_chunk(
                            ChunkContext(request.conversation_id, request.request_id, step_number, chunk)
                        )
                    progress()
                    if writer.backlogged:
                        await self.wait_for_reader()
        except BaseException as error:
            # Cut short (cancel, stall, in-stream error, timeout): the usage the provider
            # reported so far still counts (docs/semantics.md §11).
            if finish is None and partial is not None:
                turn.usage.add(partial)
                metrics.count_tokens(self._model_label, partial)
                cost = self._price(partial)
                turn.cost.add(cost)
                turn.tracing.cut_chat(partial, cost)
                metrics.count_cost(request.conversation_id, self._provider_label, self._model_label, cost)
            if isinstance(error, ProviderError):
                # Where a provider's text enters the turn: masked once for the client, the
                # store, the span and the log alike (docs/security.md, "Secrets").
                error.redact(self.settings.redact)
                metrics.count_provider_error(self._provider_label, error)
                raise TurnFailure("stream", error) from error
            if isinstance(error, TimeoutError) and chunk_timeout is not None:
                raise TurnFailure(
                    "stream", ModelTimeout(f"no model output for {chunk_timeout:g} s (chunk timeout)")
                ) from None
            raise
        if finish is None:
            unfinished = ProviderError(
                "the model stream ended without a finish", provider="engine", in_stream=True
            )
            metrics.count_provider_error(self._provider_label, unfinished)
            raise TurnFailure("stream", unfinished)
        return finish

    async def _first_token(self, *, sent: bool) -> bool:
        """Once per turn, its first token written: observe its time to first token, have the
        turn's spans started once the client has been sent it (``Tracing.start_later``) and, when
        it was ``sent`` as an event, let the RPC take it before this task goes on. Without that
        wait a model stream whose next chunks are already read (a short answer arrives in one
        read) is consumed to its end, and the step finished, before the RPC's task runs: the
        first token would leave only then (bench/ttft.md, issue 33). False, for the caller's flag."""
        turn = self.state
        turn.first_token_seen = True
        turn.timeline.first_token()
        metrics.TIME_TO_FIRST_TOKEN.labels(self._model_label).observe(time.perf_counter() - turn.admitted)
        channel = turn.writer.channel
        start = turn.tracing.start_later()
        if start is not None:
            channel.when_taken(start)
        if sent:
            await channel.taken(FIRST_TOKEN_HANDOVER_SECONDS)
        return False
