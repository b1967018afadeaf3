"""One turn: persist input, assemble, run the step loop, store the reply, end the stream.

The pipeline and hook order are THINK-SEMANTICS.md sections 2-4:

    turn lock ─ TurnStart ─ persist input ─ assemble ─ repair ─ before_turn
      step loop: before_step → model stream (on_chunk) → tool calls → on_step_finish
      store assistant message ─ release lock ─ on_chat_response ─ TurnEnd

Failures: classify_chat_error → store partial → on_chat_error → TurnEnd(ERROR).
Cancellation: store partial (unfinished tool calls errored) → on_chat_response
(aborted) → TurnEnd(ABORTED).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from google.protobuf import timestamp_pb2
from google.rpc import status_pb2

from middleware import (
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseResult,
    ChunkContext,
    ErrorStage,
    HookError,
    HookTimeline,
    MiddlewareChain,
    StepContext,
    StepResult,
    TurnConfig,
    TurnContext,
)
from middleware.chain import active_tool_names
from middleware.context import TurnOutcome
from server.engine.assistant_message import AssistantMessage
from server.engine.checkpoints import Checkpointer
from server.engine.events import EventWriter
from server.engine.failures import TurnFailure, status_of
from server.engine.tool_calls import ToolCallRunner
from server.engine.transcript import (
    CONTINUATION_PROMPT,
    repair_unresolved_tool_calls,
)
from server.errors import TurnwireStatusError
from server.providers import ModelRequest, ProviderRegistry
from server.providers import base as chunks
from server.providers.base import ModelSettings, Usage
from server.store.base import Store, TurnRecord, TurnState
from server.tools.base import Tool, definition_of
from turnwire.v1 import event_pb2, message_pb2

log = logging.getLogger("turnwire.turn")

_FINISH_REASONS = {
    "stop": event_pb2.FINISH_REASON_STOP,
    "length": event_pb2.FINISH_REASON_LENGTH,
    "tool-calls": event_pb2.FINISH_REASON_TOOL_CALLS,
    "content-filter": event_pb2.FINISH_REASON_CONTENT_FILTER,
    "error": event_pb2.FINISH_REASON_ERROR,
    "other": event_pb2.FINISH_REASON_OTHER,
}

ABORTED_TOOL_ERROR = "The tool call was aborted before it finished."

_OUTCOMES: dict[str, TurnOutcome] = {
    "completed": "completed",
    "error": "error",
    "aborted": "aborted",
}


@dataclass(frozen=True, slots=True)
class TurnRequest:
    """An admitted request for one turn.

    ``messages`` are the new messages to append (validated, ids assigned);
    ``continuation`` is true for ContinueLastTurn; ``response_type`` is the
    RPC's response class (it wraps ``TurnEvent`` in field ``event``).
    """

    conversation_id: str
    request_id: str
    messages: Sequence[message_pb2.Message]
    body: Mapping[str, Any]
    model: str
    continuation: bool
    response_type: Callable[[], Any]
    skip_unless_assistant_last: bool = False


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """Engine-wide defaults. Times: ``checkpoint_interval_ms`` and ``text_coalesce_ms`` in
    milliseconds, ``tool_timeout_seconds`` in seconds."""

    default_model: str = "scripted:demo"
    system_prompt: str = "You are a helpful assistant."
    max_steps: int = 10
    max_queued_turns_per_conversation: int = 32
    text_coalesce_ms: float = 0.0
    checkpoint_interval_ms: float = 250.0
    tool_timeout_seconds: float = 60.0


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


class TurnRun:
    """Runs one turn in its own task; events go to ``writer``'s channel."""

    def __init__(
        self,
        request: TurnRequest,
        *,
        store: Store,
        providers: ProviderRegistry,
        tools: Mapping[str, Tool],
        chain: MiddlewareChain,
        settings: EngineSettings,
        writer: EventWriter,
        on_lock_acquired: Callable[[], None],
    ) -> None:
        self.request = request
        self.store = store
        self.providers = providers
        self.tools = dict(tools)
        self.chain = chain
        self.settings = settings
        self.writer = writer
        self._on_lock_acquired = on_lock_acquired
        self.timeline = HookTimeline() if chain.middlewares else None
        self.message_id = f"msg_{request.request_id}"
        self.assistant = AssistantMessage(self.message_id, _now())
        self.usage = Usage()
        self.steps: list[StepResult] = []
        self.state: TurnState = "running"
        self.status_error: status_pb2.Status | None = None
        self.error: BaseException | None = None
        self.stored_message: message_pb2.Message | None = None
        self.messages_persisted = False
        self.cancelled = asyncio.Event()
        #: Set once the TurnEnd event is queued; cancelling after that is a no-op.
        self.ended = False
        #: Set once the turn lock is released: on_chat_response may start the next turn.
        self.lock_released = False
        self._record: TurnRecord | None = None
        self.checkpoints = Checkpointer(
            lambda message: self.store.save_message(request.conversation_id, message),
            lambda: self.assistant.snapshot() if self.assistant.has_parts else None,
            settings.checkpoint_interval_ms / 1000.0,
            request.request_id,
        )
        self._send_reasoning = True
        self._step_messages: Sequence[message_pb2.Message] = ()

    # --- the whole turn ----------------------------------------------------

    async def run(self) -> None:
        """Run to the end; never raises. The stream always ends with one TurnEnd."""
        try:
            try:
                async with self.store.turn_lock(self.request.conversation_id):
                    self._on_lock_acquired()
                    await self._locked()
                self.lock_released = True
            except asyncio.CancelledError:
                # Cancelled while queued for the lock: nothing was stored.
                if self.state == "running":
                    self.state = "aborted"
                    self._start_event()
            except Exception as error:  # the lock itself failed (shared-store backends)
                if self.state == "running":
                    self._start_event()
                    self._fail_status(TurnFailure("persist", error))
            await self._after_lock()
        finally:
            self.ended = True
            self.writer.close()

    def _start_event(self) -> None:
        if self.writer.sequence_number:
            return
        event = self.writer.new()
        start = event.turn_start
        start.message_id = self.message_id
        start.continuation = self.request.continuation
        start.model = self.request.model

    async def _locked(self) -> None:
        request = self.request
        self._start_event()
        try:
            if request.skip_unless_assistant_last:
                history = await self.store.load_messages(request.conversation_id)
                if not history or history[-1].role != message_pb2.ROLE_ASSISTANT:
                    self.state = "skipped"
                    return
            self._record = TurnRecord(
                request_id=request.request_id,
                conversation_id=request.conversation_id,
                assistant_message_id=self.message_id,
                continuation=request.continuation,
                model=request.model,
                state="running",
                start_time=self.assistant.message.create_time.ToDatetime(dt.UTC),
            )
            for message in request.messages:
                message.create_time.CopyFrom(self.assistant.message.create_time)
            try:
                await self.store.start_turn(self._record, request.messages)
            except Exception as error:
                raise TurnFailure("persist", error) from error
            self.messages_persisted = True
            await self._run_steps()
            self.state = "completed"
        except asyncio.CancelledError:
            self.state = "aborted"
            self.cancelled.set()
        except TurnFailure as failure:
            self.state = "error"
            self.error = failure
        except Exception as error:  # a bug: still end the turn cleanly
            log.exception("turn %s failed unexpectedly", request.request_id)
            self.state = "error"
            self.error = TurnFailure("turn", error)
        if self.state == "error" and isinstance(self.error, TurnFailure):
            self._classification = await self._classify(self.error)
        await self._store_result()

    async def _store_result(self) -> None:
        if self._record is None or not self.messages_persisted:
            return
        if self.state in ("aborted", "error"):
            self.assistant.fail_unresolved(ABORTED_TOOL_ERROR)
        message = self.assistant.finalize()
        await self.checkpoints.close()
        error_bytes = None
        if self.state == "error" and self.error is not None:
            stage = self.error.stage if isinstance(self.error, TurnFailure) else "turn"
            self.status_error = status_of(_root(self.error), stage)
            error_bytes = self.status_error.SerializeToString()
        record = dataclasses.replace(
            self._record,
            state=self.state,
            end_time=dt.datetime.now(dt.UTC),
            error=error_bytes,
        )
        try:
            # Shielded: a second cancel (client gone, shutdown) must not lose the reply.
            await asyncio.shield(self.store.finish_turn(record, message))
            self.stored_message = message
        except Exception as error:
            log.error("turn %s: storing the assistant message failed: %s", self.request.request_id, error)
            if self.state != "error":
                self.state = "error"
                self.error = TurnFailure("persist", error)
                self.status_error = status_of(error, "persist")

    async def _after_lock(self) -> None:
        """on_chat_error / on_chat_response (lock released), then the TurnEnd event."""
        request = self.request
        if self.state == "error":
            await self._surface_error()
        # on_chat_response: every completed turn, and an errored or aborted one
        # whose partial reply was stored (THINK-SEMANTICS.md section 3).
        outcome = _OUTCOMES.get(self.state)
        if outcome is not None and (outcome == "completed" or self.stored_message is not None):
            await self.chain.on_chat_response(
                ChatResponseResult(
                    conversation_id=request.conversation_id,
                    request_id=request.request_id,
                    message=self.stored_message or self.assistant.message,
                    continuation=request.continuation,
                    status=outcome,
                    error=self.error,
                ),
                self.timeline,
            )
        self._end_event()

    def _end_event(self) -> None:
        event = self.writer.new()
        end = event.turn_end
        end.status = {
            "completed": event_pb2.TURN_STATUS_COMPLETED,
            "error": event_pb2.TURN_STATUS_ERROR,
            "aborted": event_pb2.TURN_STATUS_ABORTED,
            "interrupted": event_pb2.TURN_STATUS_INTERRUPTED,
            "skipped": event_pb2.TURN_STATUS_SKIPPED,
            "running": event_pb2.TURN_STATUS_ERROR,
        }[self.state]
        if self.status_error is not None:
            end.error.CopyFrom(self.status_error)
        if self.stored_message is not None:
            end.message.CopyFrom(self.stored_message)
        usage = end.usage
        usage.input_tokens = self.usage.input_tokens
        usage.output_tokens = self.usage.output_tokens
        usage.total_tokens = self.usage.total_tokens
        usage.reasoning_tokens = self.usage.reasoning_tokens
        usage.cached_input_tokens = self.usage.cached_input_tokens
        usage.cache_write_input_tokens = self.usage.cache_write_input_tokens
        end.step_count = len(self.steps)

    # --- errors ------------------------------------------------------------

    _classification: ChatErrorClassification | None = None

    def _error_context(self, stage: ErrorStage) -> ChatErrorContext:
        return ChatErrorContext(
            conversation_id=self.request.conversation_id,
            request_id=self.request.request_id,
            stage=stage,
            messages_persisted=self.messages_persisted,
            classification=self._classification,
        )

    async def _classify(self, failure: TurnFailure) -> ChatErrorClassification | None:
        return await self.chain.classify_chat_error(
            _root(failure), self._error_context(failure.stage), self.timeline
        )

    def _fail_status(self, failure: TurnFailure) -> None:
        self.state = "error"
        self.error = failure
        self.status_error = status_of(_root(failure), failure.stage)

    async def _surface_error(self) -> None:
        failure = self.error
        if not isinstance(failure, TurnFailure):
            return
        stage = failure.stage
        original = _root(failure)
        if self.status_error is None:
            self.status_error = status_of(original, stage)
        surfaced = await self.chain.on_chat_error(original, self._error_context(stage), self.timeline)
        if surfaced is not original:
            if isinstance(surfaced, TurnwireStatusError):
                self.status_error = surfaced.to_status()
            else:
                replaced = status_pb2.Status()
                replaced.CopyFrom(self.status_error)
                replaced.message = str(surfaced)
                self.status_error = replaced
        # Think's chat:request:failed: one structured record per failed turn.
        fields = {
            "event": "chat:request:failed",
            "request_id": self.request.request_id,
            "conversation_id": self.request.conversation_id,
            "stage": stage,
            "messages_persisted": self.messages_persisted,
            "classification": self._classification,
            "error": str(original),
        }
        log.warning("chat request failed %s", " ".join(f"{k}={v!r}" for k, v in fields.items()), extra=fields)

    # --- the step loop -----------------------------------------------------

    async def _run_steps(self) -> None:
        request = self.request
        history = await self.store.load_messages(request.conversation_id)
        repaired = repair_unresolved_tool_calls(history)
        for message in repaired:
            await self.store.save_message(request.conversation_id, message)
        base_ctx = TurnContext(
            conversation_id=request.conversation_id,
            request_id=request.request_id,
            system=self.settings.system_prompt,
            messages=history,
            tools=self.tools,
            model=request.model,
            continuation=request.continuation,
            body=request.body,
        )
        try:
            ctx, config = await self.chain.before_turn(base_ctx, self.timeline)
        except HookError as error:
            raise TurnFailure("turn", error) from error
        self.tools = dict(ctx.tools)
        self._send_reasoning = config.send_reasoning is not False
        max_steps = config.max_steps or self.settings.max_steps
        base_messages = list(ctx.messages)
        if base_messages and base_messages[-1].role == message_pb2.ROLE_ASSISTANT:
            prompt = message_pb2.Message(id="continuation-prompt", role=message_pb2.ROLE_USER)
            prompt.parts.add().text.text = CONTINUATION_PROMPT
            base_messages.append(prompt)
        settings = _model_settings(config)
        runner = ToolCallRunner(self)
        for step_number in range(max_steps):
            step_ctx = StepContext(
                conversation_id=request.conversation_id,
                request_id=request.request_id,
                step_number=step_number,
                steps=tuple(self.steps),
                model=ctx.model,
                system=ctx.system,
                messages=self._model_messages(base_messages),
            )
            try:
                step_config = await self.chain.before_step(step_ctx, self.timeline)
            except HookError as error:
                raise TurnFailure("step", error) from error
            model_id = step_config.model or ctx.model
            try:
                provider, model_name = self.providers.resolve(model_id)
            except LookupError as error:
                raise TurnFailure("step", error) from error
            active = step_config.active_tools if step_config.active_tools is not None else config.active_tools
            allowed = active_tool_names(self.tools, active)
            step_settings = settings
            if step_config.provider_options:
                step_settings = dataclasses.replace(
                    settings,
                    provider_options={**settings.provider_options, **step_config.provider_options},
                )
            model_request = ModelRequest(
                model=model_name,
                system=step_config.system if step_config.system is not None else ctx.system,
                messages=(step_config.messages if step_config.messages is not None else step_ctx.messages),
                tools=[definition_of(self.tools[name]) for name in allowed],
                tool_choice=step_config.tool_choice or config.tool_choice or "auto",
                settings=step_settings,
                output_schema=config.output,
                step_number=step_number,
            )
            self._step_messages = model_request.messages
            self.assistant.start_step()
            self.writer.new().step_start.step_number = step_number
            finish = await self._stream_step(
                provider.stream(model_request), step_number, set(allowed), runner
            )
            had_tool_results = await runner.run_pending(step_number)
            self.assistant.close_all()
            result = StepResult(
                step_number=step_number,
                text=self.assistant.step_text(),
                reasoning=self.assistant.step_reasoning(),
                reasoning_text="".join(r.text for r in self.assistant.step_reasoning()),
                tool_calls=self.assistant.step_tool_calls(),
                tool_results=[
                    c
                    for c in self.assistant.step_tool_calls()
                    if c.state
                    in (
                        message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
                        message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
                    )
                ],
                finish_reason=finish.finish_reason,
                raw_finish_reason=finish.raw_finish_reason,
                usage=finish.usage,
                response_id=finish.response_id,
                response_model=finish.response_model,
                provider_metadata=finish.provider_metadata,
                conversation_id=request.conversation_id,
                request_id=request.request_id,
            )
            self.steps.append(result)
            self.usage.add(finish.usage)
            self._step_finish_event(result, finish)
            await self.chain.on_step_finish(result, self.timeline)
            self.checkpoints.now()
            if not had_tool_results or _should_stop(config, result, step_number + 1):
                break

    def assistant_history(self) -> Sequence[message_pb2.Message]:
        """The messages sent to the model in the current step (for tool-call contexts)."""
        return self._step_messages

    def _model_messages(self, base: list[message_pb2.Message]) -> list[message_pb2.Message]:
        # A snapshot: the provider must not see the live message change under it.
        if self.assistant.has_parts:
            return [*base, self.assistant.snapshot()]
        return base

    def _step_finish_event(self, result: StepResult, finish: chunks.FinishStep) -> None:
        event = self.writer.new().step_finish
        event.step_number = result.step_number
        event.finish_reason = _FINISH_REASONS.get(finish.finish_reason, event_pb2.FINISH_REASON_OTHER)
        event.raw_finish_reason = finish.raw_finish_reason
        usage = event.usage
        usage.input_tokens = finish.usage.input_tokens
        usage.output_tokens = finish.usage.output_tokens
        usage.total_tokens = finish.usage.total_tokens
        usage.reasoning_tokens = finish.usage.reasoning_tokens
        usage.cached_input_tokens = finish.usage.cached_input_tokens
        usage.cache_write_input_tokens = finish.usage.cache_write_input_tokens
        event.response_id = finish.response_id
        event.response_model = finish.response_model

    async def _stream_step(
        self,
        stream: Any,
        step_number: int,
        allowed: set[str],
        runner: ToolCallRunner,
    ) -> chunks.FinishStep:
        """Consume one model stream: events, message parts, on_chunk. Returns its FinishStep."""
        writer = self.writer
        assistant = self.assistant
        observe = self.chain.observes_chunks
        send_reasoning = self._send_reasoning
        finish: chunks.FinishStep | None = None
        request = self.request
        try:
            async with contextlib.aclosing(stream) as model_stream:
                async for chunk in model_stream:
                    kind = type(chunk)
                    # Ordered by frequency: deltas dominate.
                    if kind is chunks.TextDelta:
                        assistant.append(chunk.id, chunk.delta)
                        writer.text_delta(chunk.id, chunk.delta)
                    elif kind is chunks.ReasoningDelta:
                        if send_reasoning:
                            assistant.append(chunk.id, chunk.delta)
                            writer.reasoning_delta(chunk.id, chunk.delta)
                    elif kind is chunks.ToolInputDelta:
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
                        if send_reasoning:
                            assistant.open_block(chunk.id, "reasoning")
                            writer.new().reasoning_start.id = chunk.id
                    elif kind is chunks.ReasoningEnd:
                        if send_reasoning:
                            assistant.close_block(chunk.id, chunk)
                            writer.new().reasoning_end.id = chunk.id
                    elif kind is chunks.ToolInputStart:
                        assistant.start_tool_call(chunk.tool_call_id, chunk.tool_name)
                        input_start = writer.new().tool_input_start
                        input_start.tool_call_id = chunk.tool_call_id
                        input_start.tool_name = chunk.tool_name
                    elif kind is chunks.ToolCall:
                        runner.accept(chunk, allowed)
                    elif kind is chunks.Source:
                        assistant.add_source(chunk)
                        self.writer.new().source.CopyFrom(assistant.message.parts[-1].source)
                    elif kind is chunks.File:
                        self.writer.new().file.CopyFrom(assistant.add_file(chunk))
                    elif kind is chunks.FinishStep:
                        finish = chunk
                    if observe:
                        await self.chain.on_chunk(
                            ChunkContext(request.conversation_id, request.request_id, step_number, chunk),
                            self.timeline,
                        )
                    self.checkpoints.progress()
        except chunks.ProviderError as error:
            raise TurnFailure("stream", error) from error
        if finish is None:
            raise TurnFailure(
                "stream",
                chunks.ProviderError("the model stream ended without a finish", provider="engine"),
            )
        return finish


def _root(error: BaseException) -> BaseException:
    return error.error if isinstance(error, TurnFailure) else error


def _model_settings(config: TurnConfig) -> ModelSettings:
    return ModelSettings(
        max_output_tokens=config.max_output_tokens,
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        presence_penalty=config.presence_penalty,
        frequency_penalty=config.frequency_penalty,
        stop_sequences=config.stop_sequences,
        seed=config.seed,
        max_retries=config.max_retries,
        timeout=config.timeout,
        headers=dict(config.headers or {}),
        provider_options=dict(config.provider_options or {}),
    )


def _should_stop(config: TurnConfig, result: StepResult, steps_run: int) -> bool:
    for condition in config.stop_when or ():
        if condition.step_count is not None and steps_run >= condition.step_count:
            return True
        if condition.tool_called is not None and any(
            call.tool_name == condition.tool_called for call in result.tool_calls
        ):
            return True
    return False
