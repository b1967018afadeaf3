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
    ErrorStage,
    HookTimeline,
    MiddlewareChain,
    StepResult,
)
from middleware.context import TurnOutcome
from server.engine.assistant_message import AssistantMessage
from server.engine.checkpoints import Checkpointer
from server.engine.events import EventWriter
from server.engine.failures import TurnFailure, status_of
from server.engine.step_loop import StepLoop
from server.errors import TurnwireStatusError
from server.providers import ProviderRegistry
from server.providers.base import Usage
from server.store.base import Store, TurnRecord, TurnState
from server.tools.base import Tool
from turnwire.v1 import event_pb2, message_pb2

log = logging.getLogger("turnwire.turn")


ABORTED_TOOL_ERROR = "The tool call was aborted before it finished."

_OUTCOMES: dict[str, TurnOutcome] = {
    "completed": "completed",
    "error": "error",
    "aborted": "aborted",
    "interrupted": "aborted",  # cut short by the watchdog: on_chat_response sees an abort
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
    """Engine-wide defaults. Times: ``checkpoint_interval_ms``, ``text_coalesce_ms`` and
    ``stream_stall_timeout_ms`` (0: watchdog off) in milliseconds, ``tool_timeout_seconds`` in
    seconds. ``hook_timeline`` puts each turn's hook timeline in ``TurnEnd.metadata``."""

    default_model: str = "scripted:demo"
    system_prompt: str = "You are a helpful assistant."
    max_steps: int = 10
    max_queued_turns_per_conversation: int = 32
    text_coalesce_ms: float = 0.0
    checkpoint_interval_ms: float = 250.0
    tool_timeout_seconds: float = 60.0
    stream_stall_timeout_ms: float = 0.0
    hook_timeline: bool = False


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
        # Recorded only when asked for (events.hook_timeline): it costs clock reads per hook call.
        self.timeline = HookTimeline() if chain.middlewares and settings.hook_timeline else None
        self.message_id = f"msg_{request.request_id}"
        self.assistant = AssistantMessage(self.message_id, _now())
        self.usage = Usage()
        self.steps: list[StepResult] = []
        self.steps_started = 0
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
            self.assistant.snapshot_to_store,
            settings.checkpoint_interval_ms / 1000.0,
            request.request_id,
        )
        #: False when before_turn said send_reasoning=False: reasoning is neither streamed nor stored.
        self.send_reasoning = True
        #: What the model was sent in the current step (ToolCallContext.messages).
        self.step_messages: Sequence[message_pb2.Message] = ()
        self._interrupted: str | None = None
        self._task: asyncio.Task[Any] | None = None

    # --- the whole turn ----------------------------------------------------

    async def run(self) -> None:
        """Run to the end; never raises. The stream always ends with one TurnEnd."""
        self._task = asyncio.current_task()
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
            self.state = "interrupted" if self._interrupted is not None else "aborted"
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
        if self.state in ("aborted", "interrupted", "error"):
            self.assistant.fail_unresolved(ABORTED_TOOL_ERROR)
        # No checkpoint may land after (and overwrite) the final write.
        await self.checkpoints.close()
        message = self.assistant.finalize()
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
        self.usage.copy_to(end.usage)
        end.step_count = self.steps_started  # a step cut short by a cancel or an error counts too
        if self.timeline is not None and self.settings.hook_timeline:
            end.metadata.update({"hook_timeline": self.timeline.as_dicts()})

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
        await StepLoop(self).run()

    def interrupt(self, reason: str) -> None:
        """End the turn INTERRUPTED (stall watchdog): like a cancel, with its own status."""
        log.warning("turn %s interrupted: %s", self.request.request_id, reason)
        self._interrupted = reason
        if self._task is not None and not self.ended:
            self.cancelled.set()
            self._task.cancel()


def _root(error: BaseException) -> BaseException:
    return error.error if isinstance(error, TurnFailure) else error
