"""The step loop of one turn (docs/semantics.md §2 and "Steps").

``before_turn`` → for each step: ``before_step`` → model stream (``on_chunk``
per chunk, events to the client) → tool calls → ``on_step_finish``; until a
step produces no tool result, a ``stop_when`` condition holds, or
``max_steps`` model calls ran.

Timeouts (``TurnConfig.timeout``) end the turn in error (DEADLINE_EXCEEDED);
the stall watchdog (``stream_stall_timeout_seconds``) ends it INTERRUPTED
(docs/semantics.md §5).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from turnwire.compaction import elide_outputs
from turnwire.error_classes import finish_overflows
from turnwire.hooks import (
    ChatErrorContext,
    StepContext,
    StepFinishContext,
    TurnConfig,
    TurnContext,
    TurnTimeout,
)
from turnwire.providers import ModelRequest, Provider
from turnwire.tools import definition_of
from turnwire.types import ModelSettings
from turnwire_client.v1 import message_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.approvals import announce_denials, run_approved_calls
from turnwire_server.engine.budgets import step_budgets, step_limit, unsettled
from turnwire_server.engine.compaction import input_start
from turnwire_server.engine.continuation import continued
from turnwire_server.engine.errors import ModelTimeout, StreamStalled, TurnFailure
from turnwire_server.engine.ids import conversation_cache_key
from turnwire_server.engine.interrupted_calls import resume_interrupted_calls
from turnwire_server.engine.output_clamp import ClampedStep, clamped_step
from turnwire_server.engine.pending_calls import OpenCalls, repair_pending, with_pending_placeholders
from turnwire_server.engine.step_stream import StepStream
from turnwire_server.engine.tool_calls import ToolCallRunner
from turnwire_server.engine.turn_state import TurnWorkingState
from turnwire_server.engine.turn_timeline import COMPACTION, MODEL, STEP
from turnwire_server.hooks.chain import HookError, merge_config
from turnwire_server.store.records import TurnAdmission


class StepLoop(StepStream):
    """Runs ``before_turn`` and the steps of one attempt of a turn.

    ``stop(error)`` stops the turn from inside: the stall watchdog passes a
    :class:`~turnwire_server.engine.errors.StreamStalled` (the turn ends
    INTERRUPTED), a client too slow to read a :class:`SlowConsumer`. ``compactor`` (when
    compaction is configured) makes the history view and runs ``compact_after`` and the
    proactive guard (docs/semantics.md §9). ``budgets``: the attempt's budget charges when the
    turn's admission already reserved its first step (:mod:`.budget_admission`).
    """

    async def run(self, admission: TurnAdmission | None = None) -> None:
        """Assemble, ``before_turn``, then the steps; ``admission`` is what the turn's input
        commit read (the history, the compaction record), where the store read it then (else
        they are loaded here). Raises :class:`TurnFailure`."""
        turn = self.state
        request = turn.request
        history = admission.history if admission is not None else None
        if history is None:
            history = await self.store.load_messages(request.conversation_id)
        # The one pass over the history before the model call (issue 17; over the new messages
        # only, when the conversation was only appended to): the open calls, and where a failed
        # attempt's partial reply is.
        open_calls = OpenCalls.find(
            history, reply_id=turn.assistant.message.id, conversation_id=request.conversation_id
        )
        if turn.continue_reply:
            # A recovery's reply is the turn's own (turn.assistant): its open calls are decided
            # once the tools are known (interrupted_calls), never repaired as another turn's.
            open_calls = open_calls.without_reply()
        # Calls the client may still answer are kept (docs/semantics.md §8, pending_calls).
        repaired = repair_pending(
            open_calls,
            now=dt.datetime.now(dt.UTC),
            expiry_seconds=self.settings.durability.pending_expiry_seconds,
        )
        for message in repaired:
            await self.store.save_message(request.conversation_id, message, lease=turn.lease)
        # A retry under a failed turn's request id replaces that turn's partial reply (same id):
        # the model answers the question again rather than continuing the failed attempt.
        open_calls = open_calls.without_reply()
        history = open_calls.history
        view = await self._view(history, admission)
        try:
            ctx, config = await turn.hooks.before_turn(
                TurnContext(
                    conversation_id=request.conversation_id,
                    request_id=request.request_id,
                    system=self.settings.system_prompt,
                    messages=view,
                    tools=turn.tools,
                    model=request.model,
                    continuation=request.continuation,
                    body=request.body,
                    attempt=turn.attempt,
                    concurrent_input=turn.concurrent_input,
                    entry=request.entry,
                    subagent_path=request.subagent_path,
                )
            )
        except HookError as error:
            raise TurnFailure("turn", error) from error
        turn.tools = dict(ctx.tools)
        turn.send_reasoning = config.send_reasoning is not False
        turn.assistant.store_reasoning = turn.send_reasoning
        timeout = config.timeout or TurnTimeout()
        stall_seconds = (
            config.stream_stall_timeout_seconds
            if config.stream_stall_timeout_seconds is not None
            else self.settings.limits.stream_stall_timeout_seconds
        )
        watchdog = (
            asyncio.create_task(self._watch_stalls(stall_seconds), name="stall watchdog")
            if stall_seconds
            else None
        )
        try:
            async with asyncio.timeout(timeout.total_seconds), unsettled(lambda: self.budgets, turn):
                # Answered approvals first: denials announced, approved calls run (§6).
                announce_denials(turn)
                ran = await run_approved_calls(turn, self.store, open_calls, self._runner_for(config))
                if ran:  # the messages with results replace the ones held elsewhere too
                    turn.view = _replaced(turn.view, ran)
                    ctx = dataclasses.replace(ctx, messages=_replaced(ctx.messages, ran))
                # A recovery's calls a crash left without a result: run, re-run or interrupted (§8).
                await resume_interrupted_calls(turn, self._runner_for(config))
                await self._steps(ctx, config, timeout, open_calls)
        except TimeoutError:
            raise TurnFailure(
                "stream",
                ModelTimeout(f"the turn exceeded its total timeout of {timeout.total_seconds:g} s"),
            ) from None
        finally:
            if watchdog is not None:
                watchdog.cancel()

    async def _view(
        self, history: list[message_pb2.Message], admission: TurnAdmission | None
    ) -> Sequence[message_pb2.Message]:
        """What the model is sent of ``history``: as stored, or its compacted view (by the
        compaction record ``admission`` brought, if it read one), compacted again first when it
        passed ``compact_after`` tokens (between turns, §9)."""
        turn = self.state
        compactor = self.compactor
        turn.keep_from = input_start(history, [m.id for m in turn.request.messages])
        if compactor is None:
            turn.view = history
            return history
        view = await compactor.load_view(history, admission)
        turn.keep_from = input_start(view, [m.id for m in turn.request.messages])
        threshold = compactor.config.compact_after
        if threshold is not None and await compactor.count(self.settings.system_prompt, view) > threshold:
            with turn.timeline.span(COMPACTION, "compaction", detail="threshold"):
                compacted = await compactor.compact(
                    "threshold",
                    system=self.settings.system_prompt,
                    view=view,
                    keep_from=turn.keep_from,
                    current=None,
                    elided_current=frozenset(),
                    attempt=turn.attempt,
                    writer=turn.writer,
                )
            turn.usage.add(compacted.usage)
            turn.cost.merge(compacted.cost)
            view, turn.keep_from = compacted.view, compacted.keep_from
        turn.view = view
        return view

    async def _guard(self, step_number: int, ctx: TurnContext) -> list[message_pb2.Message] | None:
        """The proactive guard before step ``step_number`` (§9): when the previous step's input
        tokens (``total_tokens`` when the provider gave none) reached ``max_input_tokens *
        headroom`` (or it ended because the window was full), compact the history and return the
        new one (None: nothing to do). At most
        ``max_compactions`` per attempt; one that shortened nothing still uses its slot."""
        turn = self.state
        compactor = self.compactor
        if compactor is None or step_number == 0 or not turn.steps:
            return None
        guard = compactor.config.guard_tokens
        if guard is None or turn.compactions >= compactor.config.max_compactions:
            return None
        previous = turn.steps[-1]
        used = previous.usage.input_tokens or previous.usage.total_tokens
        # A step the provider cut off because the window was full (Anthropic's
        # model_context_window_exceeded) needs the compaction whatever its usage says.
        if used < guard and not finish_overflows(previous.raw_finish_reason):
            return None
        turn.compactions += 1
        history = list(ctx.messages)
        with turn.timeline.span(COMPACTION, "compaction", detail="proactive"):
            compacted = await compactor.compact(
                "proactive",
                system=ctx.system,
                view=history,
                keep_from=input_start(history, [m.id for m in turn.request.messages]),
                current=turn.assistant.snapshot() if turn.assistant.has_parts else None,
                elided_current=turn.elided_current,
                attempt=turn.attempt,
                writer=turn.writer,
            )
        turn.usage.add(compacted.usage)
        turn.cost.merge(compacted.cost)
        turn.elided_current = compacted.elided_current
        if not compacted.shortened:
            return None
        # A reactive compaction later in this attempt starts from this view.
        turn.view, turn.keep_from = compacted.view, compacted.keep_from
        return compacted.view

    async def _watch_stalls(self, stall: float) -> None:
        """Interrupt the turn when no event was sent for ``stall`` seconds (tool time included)."""
        writer = self.state.writer
        last_sequence = writer.sequence_number
        last_change = time.monotonic()
        # Polling the event counter costs nothing per event; it fires within stall * 1.25.
        while True:
            await asyncio.sleep(stall / 4)
            now = time.monotonic()
            if writer.sequence_number != last_sequence:
                last_sequence, last_change = writer.sequence_number, now
            elif now - last_change >= stall:
                self.stop(StreamStalled(f"no event for {stall:g} s (stream_stall_timeout_seconds)"))
                return

    async def _steps(
        self, ctx: TurnContext, config: TurnConfig, limits: TurnTimeout, open_calls: OpenCalls
    ) -> None:
        """The steps, from ``ctx`` (the turn after ``before_turn``); ``open_calls`` is the search
        of the history, reused when ``ctx.messages`` is that history."""
        turn = self.state
        request = turn.request
        max_steps = config.max_steps or self.settings.limits.max_steps
        if ctx.messages is not open_calls.history:  # a compacted view, or a middleware's messages
            open_calls = OpenCalls.find(ctx.messages)
        base_messages = _base_messages(open_calls)
        settings = merge_config(
            ModelSettings(timeout_seconds=limits.step_seconds or limits.total_seconds),
            config.model_settings or ModelSettings(),
        )
        runner = self._runner_for(config)(turn)
        for step_number in range(max_steps):
            compacted = await self._guard(step_number, ctx)
            if compacted is not None:
                ctx = dataclasses.replace(ctx, messages=compacted)
                base_messages = _base_messages(OpenCalls.find(compacted))
            timeline = turn.timeline
            timeline.step = step_number
            step_span = timeline.begin(STEP, f"step {step_number}")
            step_ctx = StepContext(
                conversation_id=request.conversation_id,
                request_id=request.request_id,
                step_number=step_number,
                steps=tuple(turn.steps),
                model=ctx.model,
                system=ctx.system,
                messages=self._model_messages(base_messages),
                budgets=await self.budgets.current()
                if self.budgets is not None and turn.hooks.runs("before_step")
                else (),
            )
            try:
                step_config = await turn.hooks.before_step(step_ctx)
            except HookError as error:
                raise TurnFailure("step", error) from error
            limit = step_limit(step_config.max_step_tokens, step_config.max_step_usd)
            if limit is not None and self.budgets is None:  # none configured: this step's only
                self.budgets = step_budgets(self.store, self.settings, turn, always=True)
            configured = step_config.model or ctx.model
            model_id = self.settings.fallbacks.first(configured)  # its provider's breaker may be open
            tried = [configured, model_id] if model_id != configured else [model_id]
            provider, model_name = self._use_model(model_id)
            active = step_config.active_tools if step_config.active_tools is not None else config.active_tools
            allowed = active_tool_names(turn.tools, active)
            step_settings = (
                merge_config(settings, step_config.model_settings) if step_config.model_settings else settings
            )
            model_request = ModelRequest(
                model=model_name,
                system=step_config.system if step_config.system is not None else ctx.system,
                messages=step_config.messages if step_config.messages is not None else step_ctx.messages,
                tools=[definition_of(turn.tools[name]) for name in allowed],
                tool_choice=step_config.tool_choice or config.tool_choice or "auto",
                settings=step_settings,
                output_schema=config.output,
                step_number=step_number,
                attempt=turn.attempt,
                cache_key=conversation_cache_key(request.conversation_id),
            )
            if self.budgets is not None:
                model_request = await self.budgets.reserve(
                    model_request,
                    model_id,
                    self._provider_type,
                    provider,
                    step=limit,
                    checkpoint=turn.checkpoints.take,
                )
            turn.step_messages = model_request.messages
            turn.assistant.start_step(model_id)
            _step_start(turn, step_number, model_id)
            turn.steps_started = step_number + 1
            tracing = turn.tracing
            clamped: ClampedStep | None = None
            while True:
                events_sent = turn.writer.sequence_number
                try:
                    with (
                        timeline.span(MODEL, model_id),
                        tracing.chat(provider, model_request, request.conversation_id) as span,
                    ):
                        async with asyncio.timeout(limits.step_seconds):
                            finish = await self._stream(
                                provider.stream(model_request),
                                step_number,
                                set(allowed),
                                runner,
                                limits.chunk_seconds,
                            )
                        cost = self._price(finish.usage)
                        if self.budgets is not None:
                            self.budgets.used(finish.usage, cost)
                        tracing.end_chat(span, finish, turn.assistant, cost)
                    break
                except TimeoutError:
                    raise TurnFailure(
                        "stream", ModelTimeout(f"model step {step_number} exceeded {limits.step_seconds:g} s")
                    ) from None
                except TurnFailure as failure:
                    # While nothing of the step was streamed: a smaller output reservation once (§9),
                    # else another model; after output, another model only if so configured and the
                    # step can be run again from its start (fallback.py).
                    streamed = turn.writer.sequence_number != events_sent
                    if streamed and not (
                        self.settings.fallbacks.restarts and turn.assistant.step_discardable
                    ):
                        raise
                    if clamped is None and not streamed:
                        clamped = await clamped_step(turn.hooks, turn.request, model_request, failure.error)
                        if clamped is not None:
                            model_request = clamped.request
                            continue
                    context = ChatErrorContext(
                        request.conversation_id,
                        request.request_id,
                        failure.error,
                        "stream",
                        messages_persisted=True,
                    )
                    fallback = await self.settings.fallbacks.after_failure(
                        turn.hooks, context, model_id, tried
                    )
                    if fallback is None:
                        raise
                    if streamed:
                        turn.assistant.discard_step()
                    tried.append(fallback)
                    model_id = fallback
                    provider, model_name = self._use_model(model_id)
                    model_request = dataclasses.replace(model_request, model=model_name)
                    if self.budgets is not None:  # reserved again, at the fallback's prices
                        if not streamed:  # else its output was billed: charged its reservation
                            self.budgets.unanswered()
                        model_request = await self.budgets.reserve(
                            model_request, model_id, self._provider_type, provider, step=limit
                        )
                    self._fallback_attempt(step_number, model_id)
            self.settings.fallbacks.succeeded(model_id)
            if clamped is not None:
                finish.warnings = (*finish.warnings, clamped.warning)
            # The model call is done: its usage and cost count now, before the step's tools run,
            # so a turn stopped while they run (a cancel, a stall, new input, a deadline) still
            # reports them in its TurnEnd, its stored cost and the metrics (docs/semantics.md §11).
            turn.usage.add(finish.usage)
            turn.cost.add(cost)
            metrics.STEPS.labels(self._model_label, finish.finish_reason).inc()
            metrics.count_tokens(self._model_label, finish.usage)
            metrics.count_cost(request.conversation_id, self._provider_label, self._model_label, cost)
            await runner.repair_invalid(finish.finish_reason)
            had_tool_results = await runner.run_pending(step_number)
            result = self._step_result(step_number, finish, cost)
            # A step the provider paused (finish.paused) goes on as a step with results does; a
            # call waiting for the client ends the turn after its step (§6). Decided before
            # on_step_finish, which is told (StepFinishContext.last_step).
            stop = (
                not (had_tool_results or finish.paused)
                or runner.waiting
                or _should_stop(config, result, step_number + 1)
            )
            if stop or step_number + 1 >= max_steps:
                result = dataclasses.replace(result, last_step=True)
            turn.steps.append(result)
            self._step_finish_event(result, finish)
            await turn.hooks.on_step_finish(result)
            timeline.end(step_span, finish.finish_reason)
            timeline.step = None
            turn.continue_reply = False
            if stop:
                # The final write follows at once: no checkpoint of the last step.
                break
            if (self.budgets is None or not self.budgets.writes) and not runner.start_stored:
                # A step whose calls were stored as started had its checkpoint then (§8, "Tool
                # effects"): their results armed the interval's timer, no write of its own.
                turn.checkpoints.now()
            # Else the next step's reservation stores it (one transaction for both); a turn
            # that ends before (a hook, a compaction failed) stores its reply in its final write.

    def _use_model(self, model_id: str) -> tuple[Provider, str]:
        """The provider and provider-local name of ``model_id``, which the step's metrics, cost
        and events are labelled with from here on. Raises :class:`TurnFailure` (stage ``step``)
        when no provider serves it."""
        try:
            provider, model_name = self.providers.resolve(model_id)
        except LookupError as error:
            raise TurnFailure("step", error) from error
        self._provider_label = model_id.partition(":")[0]
        self._model_label = metrics.model_label(model_id, self.settings.metric_models)
        self._model_id, self._provider_type = model_id, getattr(provider, "type", None)
        return provider, model_name

    def _fallback_attempt(self, step_number: int, model_id: str) -> None:
        """AttemptStart (``PROVIDER_FALLBACK``, naming ``model_id``) and the step's StepStart
        again: the client keeps the reply so far (``appends``: the steps before this one) and
        shows the step as the fallback model streams it (docs/semantics.md §12)."""
        turn = self.state
        turn.attempt += 1
        turn.timeline.attempt = turn.attempt
        event = turn.writer.new().attempt_start
        event.attempt = turn.attempt
        event.message_id = turn.assistant.message.id
        event.reason = "PROVIDER_FALLBACK"
        event.model = model_id
        turn.assistant.move_step(model_id)
        snapshot = turn.assistant.snapshot_to_store() if turn.assistant.has_parts else None
        event.appends = snapshot is not None
        if snapshot is not None:
            event.message.CopyFrom(snapshot)
        _step_start(turn, step_number, model_id)

    def _runner_for(self, config: TurnConfig) -> Callable[[TurnWorkingState], ToolCallRunner]:
        def runner(state: TurnWorkingState) -> ToolCallRunner:
            return ToolCallRunner(
                state,
                self.settings.limits.tool_timeout_seconds,
                self.wait_for_reader,
                config.repair_tool_call,
                max_output_bytes=self.settings.limits.max_tool_output_bytes,
                redact=self.settings.redact,
            )

        return runner

    def _model_messages(self, base: list[message_pb2.Message]) -> list[message_pb2.Message]:
        # A snapshot: the provider must not see the live message change under it.
        assistant = self.state.assistant
        if not assistant.has_parts:
            return base
        messages = [*base, elide_outputs(assistant.snapshot(), self.state.elided_current)]
        if self.state.continue_reply:
            # A recovery continues the stored partial reply in the same message (§1, §8).
            return continued(messages)
        return messages


def _replaced(
    messages: Sequence[message_pb2.Message], pairs: Sequence[tuple[message_pb2.Message, message_pb2.Message]]
) -> Sequence[message_pb2.Message]:
    """``messages`` with each first message of ``pairs`` (the very object) replaced by the second
    (a new list); ``messages`` itself when it holds none of them."""
    by_object = {id(old): new for old, new in pairs}
    if not any(id(message) in by_object for message in messages):
        return messages
    return [by_object.get(id(message), message) for message in messages]


def _base_messages(open_calls: OpenCalls) -> list[message_pb2.Message]:
    """What every step sends before this turn's reply: ``open_calls.history`` with placeholders
    for calls still waiting on the client, and, after a reply, what a continuation sends
    (:func:`continued`: its trailing reasoning left out, the continuation prompt after content).
    A reply that ends in tool results (a continuation after client results or approvals) is
    answered as it is: the results are the model's next input."""
    return continued(with_pending_placeholders(open_calls))


def _step_start(turn: TurnWorkingState, step_number: int, model_id: str) -> None:
    """The StepStart of step ``step_number``, naming the model it runs on (a fallback's too)."""
    event = turn.writer.new().step_start
    event.step_number = step_number
    event.model = model_id


def active_tool_names(tools: Mapping[str, Any], active: Sequence[str] | None) -> list[str]:
    """The tool names the model may call: all of ``tools``, limited to ``active`` when given."""
    if active is None:
        return list(tools)
    return [name for name in active if name in tools]


def _should_stop(config: TurnConfig, result: StepFinishContext, steps_run: int) -> bool:
    for condition in config.stop_when or ():
        if condition.step_count is not None and steps_run >= condition.step_count:
            return True
        if condition.tool_called is not None and any(
            call.tool_name == condition.tool_called for call in result.tool_calls
        ):
            return True
    return False
