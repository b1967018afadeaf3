"""One turn: persist input, assemble, run the step loop, store the reply, end the stream.

The pipeline and hook order are docs/semantics.md §2 and §3:

    turn lock ─ TurnStart ─ persist input ─ assemble ─ repair ─ before_turn
      step loop: before_step → model stream (on_chunk) → tool calls → on_step_finish
      store assistant message, end state, last events and TurnEnd ─ release lock
        ─ on_chat_response ─ TurnEnd sent

The TurnEnd is durable before it is sent (docs/semantics.md §8): it is stored in the transaction
that records the turn's end, or, when hooks that run after that shape it (on_chat_error, the hook
timeline), in a write of its own after them.

Failures: classify_chat_error → store partial → on_chat_error → TurnEnd(ERROR). A context
overflow with reactive compaction on: compact → AttemptStart → the turn again (a new reply
id), or, when that cannot help, the partial discarded → on_chat_error → TurnEnd(ERROR)
(docs/semantics.md §9).
Cancellation: store partial (unfinished tool calls errored) → on_chat_response
(aborted) → TurnEnd(ABORTED). Stopped by new input (docs/semantics.md §5): an interrupt ends as
a cancel (reason INTERRUPTED); a rollback removes the turn's input and partial reply instead of
storing it (reason ROLLED_BACK); on_chat_response fires for both.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol

from google.protobuf import timestamp_pb2

from turnwire.error_classes import overflow_remedy
from turnwire.errors import ABORTED_TOOL_ERROR
from turnwire.hooks import (
    ChatError,
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseContext,
    ConcurrentInput,
    ErrorStage,
    TurnOutcome,
)
from turnwire.tools import Tool
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.assistant_message import AssistantMessage
from turnwire_server.engine.budget_admission import admission_charge
from turnwire_server.engine.budgets import StepBudgets, settle, step_budgets
from turnwire_server.engine.checkpoints import Checkpointer
from turnwire_server.engine.client_tools import turn_tools
from turnwire_server.engine.compaction import Compactor
from turnwire_server.engine.cost import CostTotal
from turnwire_server.engine.errors import (
    CancelledByShutdown,
    ConversationDeleted,
    InputNotStored,
    NothingToContinue,
    ServerStopping,
    SlowConsumer,
    StoppedByInput,
    StreamStalled,
    TurnFailure,
)
from turnwire_server.engine.events import EventWriter
from turnwire_server.engine.ids import assistant_message_id, attempt_message_id
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.settings import EngineSettings
from turnwire_server.engine.step_loop import StepLoop
from turnwire_server.engine.store_outage import until_stored
from turnwire_server.engine.stream_log import StreamTail
from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.engine.turn_spec import spec_json
from turnwire_server.engine.turn_state import TurnWorkingState
from turnwire_server.engine.turn_timeline import ATTEMPT, COMPACTION, QUEUE, TurnTimeline
from turnwire_server.hooks.chain import HookError, MiddlewareChain
from turnwire_server.hooks.timeline import HookTimeline
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.base import BudgetCharge, TurnAdmission, TurnRecord, TurnRunStore
from turnwire_server.store.base import TurnState as StoredTurnState
from turnwire_server.store.errors import LeaseLost, TurnNotFound

log = logging.getLogger("turnwire.turn")


_OUTCOMES: dict[str, TurnOutcome] = {
    "completed": "completed",
    "error": "error",
    "aborted": "aborted",
    "interrupted": "aborted",  # cut short by the watchdog: on_chat_response sees an abort
}

_Phase = Literal["created", "queued", "storing", "running", "finishing", "after", "ended"]
"""Where a turn is. ``created``: its task has not run yet; ``queued``: waiting for the
conversation's lock; ``storing``: writing its input; ``running``: input stored, steps
running; ``finishing``: storing the reply; ``after``: reply stored, lock released
(on_chat_error / on_chat_response, TurnEnd)."""

_CANCELLABLE: frozenset[_Phase] = frozenset({"created", "queued", "storing", "running"})
_DEFERRED: frozenset[_Phase] = frozenset({"created", "storing"})
"""Phases in which a stop is only recorded and acted on at the next phase: before the task
first runs, and while the input is written (so "stored" and "acknowledged" never disagree)."""


class WireStatus(Protocol):
    """The status a TurnEnd carries: a ``google.rpc.Status`` the API layer builds. The engine
    only serializes it or replaces its message, so it never imports ``google.rpc`` (the import
    contracts in ``pyproject.toml``)."""

    message: str

    def SerializeToString(self, *, deterministic: bool = ...) -> bytes:
        """The status's wire bytes."""
        ...


ErrorStatus = Callable[[BaseException, ErrorStage], WireStatus]
"""Maps a turn's error and stage to the status of its TurnEnd (given by the API layer)."""


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


class TurnRun:
    """Runs one turn in its own task: the lifecycle around the step loop; events go to ``writer``.

    The working state the step loop and tool runner share is :attr:`state`
    (:class:`~turnwire_server.engine.turn_state.TurnWorkingState`); this object keeps
    only the turn's outcome: ``outcome`` (running, completed, error, aborted,
    interrupted, skipped), the error and its status, the stored reply.
    ``error_status`` maps an error to the status of the TurnEnd event. ``recovery`` (when
    given) makes this run a recovery of a turn a crash interrupted: it continues the stored
    turn and stream instead of starting them (docs/semantics.md §8). ``tracing`` records the
    spans of its steps, tool calls and hooks. ``first_in_line`` puts the turn at the head of the
    conversation's queue, right after the turn holding the lock and the earlier ones put there
    (new input that interrupted or rolled back the running turn runs next, docs/semantics.md §5).
    ``concurrent_input`` is what ``before_turn`` is told about the request's strategy.
    """

    def __init__(
        self,
        request: TurnRequest,
        *,
        store: TurnRunStore,
        providers: ProviderRegistry,
        tools: Mapping[str, Tool],
        chain: MiddlewareChain,
        settings: EngineSettings,
        writer: EventWriter,
        error_status: ErrorStatus,
        on_lock_acquired: Callable[[], None],
        recovery: Recovery | None = None,
        tracing: Tracing = TRACING_OFF,
        first_in_line: bool = False,
        concurrent_input: ConcurrentInput | None = None,
    ) -> None:
        self.request = request
        self.first_in_line = first_in_line
        #: When the turn was admitted (``time.perf_counter``): the start of its duration metrics.
        self.admitted = time.perf_counter()
        self.recovery = recovery
        self.store = store
        self.providers = providers
        self.settings = settings
        self.writer = writer
        self._error_status = error_status
        self._on_lock_acquired = on_lock_acquired
        #: Set when the store refused a write because another replica took the turn over.
        self.lease_lost: LeaseLost | None = None
        self._turn_record: TurnRecord | None = None
        # Recorded only when asked for (events.hook_timeline): it costs clock reads per hook call.
        self.timeline = HookTimeline() if chain.middlewares and settings.events.hook_timeline else None
        # What took its time, stored with its end (docs/inspector.md); hooks included.
        timeline = TurnTimeline(self.admitted)
        self.hooks = chain.for_turn(
            self.timeline, timeline.hook_spans(tracing.hook if tracing.enabled else None)
        )
        self.message_id = (
            recovery.record.assistant_message_id if recovery else assistant_message_id(request.request_id)
        )
        assistant = AssistantMessage(self.message_id, _now())
        if recovery is not None and recovery.reply is not None:
            assistant.continue_from(recovery.reply)
        self.state = TurnWorkingState(
            request=request,
            hooks=self.hooks,
            writer=writer,
            assistant=assistant,
            checkpoints=self._checkpointer(assistant),
            tools=turn_tools(tools, request.client_tools),
            attempt=recovery.attempt if recovery else 1,
            continue_reply=recovery is not None and recovery.reply is not None,
            # A recovered turn's cost is unknown: what the lost attempt spent died with its process.
            cost=CostTotal(unknown=recovery is not None),
            admitted=self.admitted,
            tracing=tracing,
            concurrent_input=concurrent_input,
            timeline=timeline,
        )
        timeline.attempt = self.state.attempt
        self._tools = tools
        self.compactor = (
            Compactor(
                settings.compaction,
                store=store,
                providers=providers,
                conversation_id=request.conversation_id,
                request_id=request.request_id,
                model=request.model,
                metric_models=settings.metric_models,
                redact=settings.redact,
                prices=settings.prices,
            )
            if settings.compaction is not None
            else None
        )
        #: Re-runs after a context overflow so far (docs/semantics.md §9: at most overflow_retries).
        self.overflow_retries = 0
        #: What the input's commit read (history, compaction), for the first attempt's steps.
        self._admission: TurnAdmission | None = None
        #: The budget charges holding the reservation that commit stored, for the first attempt.
        self._admitted: StepBudgets | None = None
        self.outcome: StoredTurnState = "running"
        self.status_error: WireStatus | None = None
        self.error: BaseException | None = None
        self.stored_message: message_pb2.Message | None = None
        self.messages_persisted = False
        #: Set once the TurnEnd event is queued; cancelling after that is a no-op.
        self.ended = False
        #: The TurnEnd response, built (and stored) with the turn's end state when nothing that
        #: runs later can change it; None: built after the hooks (:meth:`_after_lock`).
        self._end: Any = None
        #: Left ``running`` in the store, not over: stopped by a shutdown, or a recovery that
        #: stopped before it ran; the engine gives its lease up (``release_orphaned``), so a claim
        #: recovers it (the next start's, with one process).
        self.left_running = False
        if writer.log is not None:
            writer.log.fence(lambda: self.state.lease, self._lease_lost)
        self._classification: ChatErrorClassification | None = None
        self._phase: _Phase = "created"
        #: Why the turn was stopped from outside (set once; see :meth:`cancel`).
        self._stop: BaseException | None = None
        self._task: asyncio.Task[Any] | None = None

    def _checkpointer(self, assistant: AssistantMessage) -> Checkpointer:
        request = self.request
        return Checkpointer(
            lambda message: self.store.save_message(request.conversation_id, message, lease=self.state.lease),
            assistant.snapshot_to_store,
            self.settings.checkpoint.interval_ms / 1000.0,
            request.request_id,
            lost=self._lease_lost,
        )

    @property
    def _record(self) -> TurnRecord | None:
        """The turn as stored (None until its input is); its lease is what its writes carry."""
        return self._turn_record

    @_record.setter
    def _record(self, record: TurnRecord | None) -> None:
        self._turn_record = record
        self.state.lease = None if record is None else record.lease

    def _lease_lost(self, error: LeaseLost) -> None:
        """A write was refused: another replica took the turn over (this one was paused or cut
        off from the store past its lease). The turn stops here and stores nothing more; its
        caller is told to follow it there (docs/semantics.md §5, "Fencing")."""
        if self.lease_lost is None:
            self.lease_lost = error
            self.cancel(error)

    def _fenced_out(self, error: LeaseLost) -> None:
        """The outcome of a turn another replica took over: INTERRUPTED here (it goes on there),
        its TurnEnd carrying ``LEASE_LOST`` (``ABORTED``, retryable: ResumeTurn)."""
        self.lease_lost = self.lease_lost or error
        if self.writer.log is not None:
            self.writer.log.abandon()
        self.outcome = "interrupted"
        self.error = None
        self.status_error = self._error_status(error, "persist")

    @property
    def cancelled(self) -> asyncio.Event:
        """Set when the turn is cancelled or interrupted."""
        return self.state.cancelled

    # --- the whole turn ----------------------------------------------------

    @property
    def lock_released(self) -> bool:
        """True once the turn lock is released: on_chat_response may start the next turn."""
        return self._phase in ("after", "ended")

    @property
    def takes_events(self) -> bool:
        """True until the turn starts finishing: from then on its end, and the tail of its stream
        stored with it, are being decided, so nothing else may add to its stream (a detached
        sub-agent's events nested in it stop there; docs/subagents.md)."""
        return self._phase in ("created", "queued", "storing", "running")

    @property
    def holds_lock(self) -> bool:
        """True while the turn holds the conversation's lock and has not begun storing its reply
        (its input is being written or its steps run): the turn new input may stop."""
        return self._phase in ("storing", "running")

    def cancel(self, stop: BaseException | None = None) -> bool:
        """Stop the turn: a cancel (``stop`` None), the stall watchdog (:class:`StreamStalled`)
        or a client that stopped reading (:class:`SlowConsumer`). Returns False when it had no
        effect.

        docs/semantics.md §5 (Decision: exactly one terminal event, whatever the timing): only
        the first stop counts (save a shutdown's after a cancel a recovery waits in line to
        end: :meth:`_ends_in_line`) and the task is cancelled at most once, so a second cancel
        can never interrupt the clean-up; a turn whose task has not run yet is stopped when it
        starts (a task cancelled before it first runs would skip every ``finally``); once the
        reply is being stored, stopping changes nothing.
        """
        # A recovery cancelled to end in line (_ends_in_line) is stopped again by a shutdown,
        # which does not wait for the line: left for recovery, as a shutdown leaves it.
        overrides = isinstance(stop, ServerStopping) and self._ends_in_line()
        if self._phase not in _CANCELLABLE or (self.state.cancelled.is_set() and not overrides):
            return False
        if stop is not None:
            log.warning("turn %s stopped: %s", self.request.request_id, stop)
        self._stop = stop
        self.state.cancelled.set()
        if self._phase not in _DEFERRED and not self._ends_in_line() and self._task is not None:
            self._task.cancel()
        return True

    def _ends_in_line(self) -> bool:
        """A recovery cancelled (``CancelChat``) before it ran: unlike a new turn's, its input and
        reply are stored, so it keeps its place in line and ends ``ABORTED`` under the lock when
        its turn comes (its end written as any cancelled turn's; docs/semantics.md §5,
        Cancellation). Other stops (a shutdown, a lost lease) leave it for recovery."""
        return (
            self.recovery is not None
            and self._phase in ("created", "queued")
            and self.state.cancelled.is_set()
            and self._stop is None
        )

    async def run(self) -> None:
        """Run to the end; never raises. The stream always ends with exactly one TurnEnd."""
        self._task = asyncio.current_task()
        try:
            if self.state.cancelled.is_set() and not self._ends_in_line():  # stopped before it first ran
                self.outcome = "aborted"
                self._not_stored("it was cancelled before it ran")
                await self._left_for_recovery()
            else:
                self._phase = "queued"
                try:
                    queue = self.state.timeline.begin(QUEUE, "queue", at=self.admitted)
                    async with self._turn_lock() as admission:
                        self.state.timeline.end(queue)
                        self._on_lock_acquired()
                        await self._locked(admission)
                except asyncio.CancelledError:
                    # Stopped while queued for the lock: nothing was stored.
                    self.outcome = "aborted"
                    self._not_stored("it was cancelled while it waited for the turn before it")
                    await self._left_for_recovery()
                except Exception as error:  # the lock or the input's commit failed: nothing stored
                    self.outcome = "error"
                    self.error = TurnFailure("persist", error)
                    await self._left_for_recovery()
                    await self._classify_failure()
            self._phase = "after"
            await self._after_lock()
        finally:
            self._phase = "ended"
            self.ended = True
            self.writer.close()
            self._count()

    def _count(self) -> None:
        """The turn's metrics and its debug line, once it ended."""
        status = "error" if self.outcome == "running" else self.outcome
        seconds = time.perf_counter() - self.admitted
        metrics.TURNS.labels(self.request.entry, status).inc()
        metrics.TURN_DURATION.labels(status).observe(seconds)
        log.debug("turn ended: %s after %.3f s (%s)", status, seconds, self.request.entry)

    def _turn_lock(self) -> AbstractAsyncContextManager[TurnAdmission | None]:
        """The conversation's turn lock. A new turn's input is committed as the lock is taken
        (``Store.admit_turn``: with PostgreSQL one database flight on an idle conversation), and
        what that commit read comes with it; a recovery (its input is stored) and a conditional
        continuation (it reads the history under the lock first) take the lock alone (None)."""
        request = self.request
        if self.recovery is not None or request.skip_unless:
            return self.store.turn_lock(
                request.conversation_id,
                request_id=request.request_id,
                owner=self.settings.replica_id,
                lease_seconds=self.settings.durability.lease_seconds,
                first=self.first_in_line,
            )
        self._record = self._new_record()
        self._phase = "storing"
        return self.store.admit_turn(
            self._record,
            request.messages,
            lease_seconds=self.settings.durability.lease_seconds,
            read_compaction=self.compactor is not None,
            queued=self._queued,
            first=self.first_in_line,
            budget=self._admission_charge(self._record),
        )

    def _admission_charge(self, record: TurnRecord) -> BudgetCharge | None:
        """The first step's reservation for the admission to carry (:mod:`.budget_admission`),
        priced at the turn's model; None when there is none to carry."""
        settings = self.settings
        if not settings.budgets.enabled:
            return None
        try:
            provider, _ = self.providers.resolve(self.request.model)
        except LookupError:
            return None  # the step says why
        rates = settings.prices.rates(self.request.model, getattr(provider, "type", None))
        return admission_charge(
            settings.budgets,
            settings.first_steps,
            self.request,
            record.lease,
            rates=rates,
            now=dt.datetime.now(dt.UTC),
        )

    def _queued(self, waiting: bool) -> None:
        """``Store.admit_turn``'s report: waiting for the turns ahead (a stop cancels the wait;
        one recorded while the input was being written takes effect now) or writing the input (a
        stop waits for the commit)."""
        self._phase = "queued" if waiting else "storing"
        if waiting and self.state.cancelled.is_set():
            raise asyncio.CancelledError

    def _new_record(self) -> TurnRecord:
        """The running turn's record; the request's messages get the turn's create time."""
        request = self.request
        for message in request.messages:
            message.create_time.CopyFrom(self.state.assistant.message.create_time)
        return TurnRecord(
            request_id=request.request_id,
            conversation_id=request.conversation_id,
            assistant_message_id=self.message_id,
            continuation=request.continuation,
            model=request.model,
            state="running",
            start_time=self.state.assistant.message.create_time.ToDatetime(dt.UTC),
            spec=spec_json(request),
            owner=self.settings.replica_id,
            lease_until=dt.datetime.now(dt.UTC)
            + dt.timedelta(seconds=self.settings.durability.lease_seconds),
        )

    def _not_stored(self, why: str) -> None:
        """The turn ends before its input was stored: its TurnEnd says so (no TurnStart was sent).
        A shutdown says so instead: such a turn (a submission) runs when the server starts again."""
        if isinstance(self._stop, ServerStopping):
            self.status_error = self._error_status(self._stop, "persist")
            return
        self.status_error = self._error_status(InputNotStored(why), "persist")

    def _start_event(self) -> None:
        """TurnStart: sent once the turn's input is durable, so it acknowledges that input."""
        event = self.writer.new()
        start = event.turn_start
        start.message_id = self.message_id
        start.continuation = self.request.continuation
        start.model = self.request.model

    async def _locked(self, admission: TurnAdmission | None) -> None:
        request = self.request
        try:
            if self.recovery is not None:
                await self._recovered()
            else:
                await self._started(admission)
            if self.outcome == "running":  # not skipped
                self.outcome = "completed"
        except asyncio.CancelledError:
            self._cancelled_outcome()
        except TurnFailure as failure:
            self.outcome = "error"
            self.error = failure
        except Exception as error:  # a bug: still end the turn cleanly
            log.exception("turn %s failed unexpectedly", request.request_id)
            self.outcome = "error"
            self.error = TurnFailure("turn", error)
        self._phase = "finishing"
        await self._classify_failure()
        await self._store_result()
        await settle(self.state)  # when the final write did not (none, or it failed)

    async def _classify_failure(self) -> None:
        """classify_chat_error for a turn that failed (once), counted by class."""
        if self.outcome == "error" and isinstance(self.error, TurnFailure):
            if self._classification is None:
                self._classification = await self._classify(self.error)
            metrics.CHAT_ERROR_CLASSIFICATIONS.labels(self._classification or "none").inc()

    async def _recovered(self) -> None:
        """A recovery: the turn and its input are stored already; its stream goes on."""
        recovery = self.recovery
        assert recovery is not None
        self._record = recovery.record
        self.messages_persisted = True
        self._phase = "running"
        self._attempt_event(recovery.reason, appends=recovery.reply is not None)
        if self.state.cancelled.is_set():
            raise asyncio.CancelledError
        # Bounded: a start that finds many interrupted turns does not call the model for all at once.
        async with recovery.slots:
            await self._attempts()

    async def _started(self, admission: TurnAdmission | None) -> None:
        """A new turn: its input is stored (by ``admission``, else here under the lock, once a
        conditional continuation found something to continue), then its attempts run."""
        request = self.request
        if admission is None:
            history = await self.store.load_messages(request.conversation_id)
            if not history or (
                request.skip_unless == "assistant_last" and history[-1].role != message_pb2.ROLE_ASSISTANT
            ):
                self.outcome = "skipped"
                last_role = (
                    message_pb2.Role.Name(history[-1].role).removeprefix("ROLE_").lower() if history else ""
                )
                self.status_error = self._error_status(NothingToContinue(last_role), "turn")
                return
            self._record = self._new_record()
            self._phase = "storing"
            try:
                admission = TurnAdmission(history=await self.store.start_turn(self._record, request.messages))
            except Exception as error:
                raise TurnFailure("persist", error) from error
        self._admission = admission
        if admission.budget is not None:
            # Its steps take it; until they do, the turn's end settles it (at zero).
            self._admitted = self.state.unsettled = step_budgets(
                self.store, self.settings, self.state, admitted=admission.budget
            )
        self.messages_persisted = True
        self._phase = "running"
        self._start_event()
        if self.state.cancelled.is_set():  # stopped while the input was written
            raise asyncio.CancelledError
        await self._attempts()

    async def _attempts(self) -> None:
        """Run the steps; after a stall, recover in the same stream while the budget allows;
        after a context overflow, compact and run the turn again (docs/semantics.md §9)."""
        while True:
            try:
                await self._run_steps()
                return
            except asyncio.CancelledError:
                if not await self._recover_stall():
                    raise
            except TurnFailure as failure:
                if not await self._recover_overflow(failure):
                    raise

    async def _recover_overflow(self, failure: TurnFailure) -> bool:
        """Reactive compaction (docs/semantics.md §9): when the turn failed with
        ``context_overflow`` and reactive compaction is on, not cancelled, within
        ``overflow_retries`` and compaction can help (the remedy is not only a smaller output
        reservation), compact; when that shortened the history, discard the partial reply and
        start the turn again (a new reply id, the same request id; AttemptStart). False: the
        turn ends in error as it would have."""
        config = self.settings.compaction
        compactor = self.compactor
        if config is None or compactor is None or not config.reactive or self.state.cancelled.is_set():
            return False
        self._classification = await self._classify(failure)
        if self._classification != "context_overflow":
            return False
        remedy = overflow_remedy(_root(failure))
        if remedy == "reduce_max_tokens":
            log.warning(
                "turn %s: context overflow that only a smaller max_output_tokens can fix; not compacting",
                self.request.request_id,
            )
            return False
        if self.overflow_retries >= config.overflow_retries:
            return False
        state = self.state
        with state.timeline.span(COMPACTION, "compaction", detail="reactive"):
            compacted = await compactor.compact(
                "reactive",
                system=self.settings.system_prompt,
                view=state.view,
                keep_from=state.keep_from,
                current=None,
                elided_current=frozenset(),
                attempt=state.attempt,
                writer=self.writer,
            )
        state.usage.add(compacted.usage)
        state.cost.merge(compacted.cost)
        if not compacted.shortened or state.cancelled.is_set():
            return False
        self.overflow_retries += 1
        await self._new_attempt_reply()
        self._classification = None
        self._attempt_event("CONTEXT_OVERFLOW", appends=False)
        return True

    async def _new_attempt_reply(self) -> None:
        """Discard this attempt's partial reply (stored by checkpoints) and give the next attempt
        a fresh one under a new id. Raises :class:`TurnFailure` (stage ``persist``)."""
        state = self.state
        await state.checkpoints.close()  # no checkpoint of the old reply may land after this
        record = self._record
        assert record is not None
        discarded = self.message_id
        state.attempt += 1
        self.message_id = attempt_message_id(self.request.request_id, state.attempt)
        self._record = record = dataclasses.replace(record, assistant_message_id=self.message_id)
        try:
            await self.store.discard_reply(record, discarded)
        except Exception as error:
            raise TurnFailure("persist", error) from error
        assistant = AssistantMessage(self.message_id, _now())
        state.assistant = assistant
        state.checkpoints = self._checkpointer(assistant)
        state.steps = []
        state.compactions = 0
        state.elided_current = frozenset()
        state.continue_reply = False
        state.tools = turn_tools(self._tools, self.request.client_tools)

    async def _recover_stall(self) -> bool:
        """After the stall watchdog stopped the steps: start another attempt when stall recovery
        is on and the turn's recovery budget (counted in the store) allows. docs/semantics.md
        §5 (Decision): with nothing of the reply produced it re-runs the turn, otherwise it
        continues the same message; the stream gets an AttemptStart (§12). False: end the
        turn INTERRUPTED as before."""
        record = self._record
        if (
            not isinstance(self._stop, StreamStalled)
            or not self.settings.durability.stall_recovery
            or record is None
            or record.recovery_count >= self.settings.durability.recovery_budget
        ):
            return False
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        # A new stop may land from here on (CancelChat): it ends the turn ABORTED.
        self._stop = None
        self.state.cancelled = asyncio.Event()
        assistant = self.state.assistant
        assistant.close_all()
        assistant.fail_unresolved(ABORTED_TOOL_ERROR)
        appends = assistant.has_parts
        self._record = record = dataclasses.replace(record, recovery_count=record.recovery_count + 1)
        try:
            # Counted before the attempt runs, so a crash during it cannot recover it again.
            await self.store.finish_turn(record, assistant.snapshot_to_store())
        except Exception as error:
            raise TurnFailure("persist", error) from error
        log.warning(
            "turn %s stalled; recovery %d of %d (%s)",
            self.request.request_id,
            record.recovery_count,
            self.settings.durability.recovery_budget,
            "continuing the reply" if appends else "re-running",
        )
        self.state.attempt += 1
        self.state.continue_reply = appends
        self._attempt_event("STREAM_STALLED", appends=appends)
        return True

    def _attempt_event(self, reason: str, *, appends: bool) -> None:
        """AttemptStart: a new attempt of the turn; the client drops what the previous one showed
        after its TurnStart, except the stored reply it continues (``appends``)."""
        event = self.writer.new().attempt_start
        event.attempt = self.state.attempt
        event.message_id = self.message_id
        event.appends = appends
        event.reason = reason
        if appends:
            snapshot = self.state.assistant.snapshot_to_store()
            if snapshot is not None:
                event.message.CopyFrom(snapshot)

    def _cancelled_outcome(self) -> None:
        stop = self._stop
        self.state.cancelled.set()
        if not self.messages_persisted:
            self.outcome = "aborted"
            self._not_stored("it was cancelled before its input was stored")
        elif isinstance(stop, StreamStalled):
            self.outcome = "interrupted"
            self.status_error = self._error_status(stop, "stream")
        elif isinstance(stop, ServerStopping):
            # Left running in the store, as a crash would: the next start recovers it (§8).
            self.outcome = "interrupted"
            self.left_running = True
            self.status_error = self._error_status(stop, "stream")
        elif isinstance(stop, LeaseLost):
            self._fenced_out(stop)
        elif isinstance(stop, SlowConsumer | ConversationDeleted | StoppedByInput | CancelledByShutdown):
            self.outcome = "aborted"
            self.status_error = self._error_status(stop, "stream")
        else:
            self.outcome = "aborted"

    async def _left_for_recovery(self) -> None:
        """A recovery that stopped before it ran (its turn lock failed or was cancelled): its turn
        is stored ``running`` under this replica's lease, and stays so, as a crash would leave it
        (no end stored, none in its stream), for the engine to give its lease up and a claim to
        recover it again (docs/operate/outages.md); having run nothing, its recovery is not
        counted (:meth:`Recovery.uncount`; counted when the store refuses that write, as a crash
        would leave it). A new turn's input whose commit was cut off may have landed too: that
        turn, if stored, is given up the same way (the engine finds it running and not run:
        ``TurnEngine.release_orphaned``)."""
        recovery = self.recovery
        if recovery is not None:
            self._record = self._record or recovery.record
            self.left_running = True
            try:
                await asyncio.shield(recovery.uncount(self.store))
            except Exception as error:
                log.warning("turn %s: its recovery stays counted: %s", self.request.request_id, error)

    async def _store_result(self) -> None:
        if self._record is None or not self.messages_persisted:
            return
        state = self.state
        lost = self.lease_lost
        if lost is None and self.error is not None and isinstance(root := _root(self.error), LeaseLost):
            lost = root
        if lost is not None:
            # Another replica runs the turn: every write would be refused (and must be).
            await state.checkpoints.close()
            self._fenced_out(lost)
            return
        if self.left_running:
            await state.checkpoints.close()
            snapshot = state.assistant.snapshot_to_store()
            if snapshot is not None:
                try:
                    await asyncio.shield(self.store.save_message(self.request.conversation_id, snapshot))
                except Exception as error:
                    log.error("turn %s: storing the partial reply failed: %s", self.request.request_id, error)
            return
        if self.outcome in ("aborted", "interrupted", "error"):
            state.assistant.fail_unresolved(ABORTED_TOOL_ERROR)
        # No checkpoint may land after (and overwrite) the final write.
        await state.checkpoints.close()
        if isinstance(self._stop, StoppedByInput) and self._stop.rollback and self.outcome == "aborted":
            await self._roll_back(self._stop)
            return
        message: message_pb2.Message | None = state.assistant.finalize()
        if self._overflowed():
            # An overflow reactive compaction could not recover: its partial reply is never
            # kept (docs/semantics.md §9); checkpoints may have stored some of it.
            message = None
            try:
                await asyncio.shield(self.store.discard_reply(self._record, self.message_id))
            except Exception as error:
                log.error("turn %s: discarding the partial reply failed: %s", self.request.request_id, error)
        if self.outcome == "error" and self.error is not None:
            stage = self.error.stage if isinstance(self.error, TurnFailure) else "turn"
            self.status_error = self._error_status(_root(self.error), stage)
        # Why it ended is kept with the turn, aborted ones too (SHUTTING_DOWN, SLOW_CONSUMER …):
        # GetConversation names it after a restart, when no TurnEnd is around to say it.
        error_bytes = None if self.status_error is None else self.status_error.SerializeToString()
        cost_usd, cost_source = self.state.cost.stored()
        record = dataclasses.replace(
            self._record,
            state=self.outcome,
            end_time=dt.datetime.now(dt.UTC),
            error=error_bytes,
            cost_usd=cost_usd,
            cost_source=cost_source,
            timeline=self.state.timeline.serialize(),
        )
        end = self._end_response(message) if self._end_is_final() else None
        tail = await self._stream_tail(end)
        budgets = state.unsettled
        charge = budgets.final_charge() if budgets is not None else None  # its settlement rides along
        try:
            # Shielded: a second cancel (client gone, shutdown) must not lose the reply.
            # Retried through a store outage (the database restarting): the turn ends once its
            # end is stored, never left running in the store behind an error (issue 34).
            grant = await asyncio.shield(
                until_stored(
                    lambda: self.store.finish_turn(
                        record,
                        message,
                        events=tail.events if tail else (),
                        stream_ended=tail is not None and tail.ended,
                        budget=charge,
                    ),
                    patience_seconds=self.settings.durability.store_outage_seconds,
                    what=f"turn {self.request.request_id}: storing its end",
                )
            )
            if budgets is not None:
                budgets.settled_by(grant)
                state.unsettled, state.budget_states = None, budgets.states()
            self.stored_message = message
            self._stream_stored(tail)
            self._end = end
        except LeaseLost as error:  # taken over while it finished: nothing was written
            self._fenced_out(error)
        except TurnNotFound:
            # Its conversation was deleted under it: the store wrote nothing, and must not bring
            # the conversation back (docs/semantics.md §12, deleting). Not a failure of the turn.
            log.info("turn %s: conversation deleted; the reply is not stored", self.request.request_id)
            if self.outcome != "error":
                self.outcome = "aborted"
                self.status_error = self._error_status(
                    ConversationDeleted(self.request.conversation_id), "persist"
                )
        except Exception as error:
            log.error("turn %s: storing the assistant message failed: %s", self.request.request_id, error)
            if self.outcome != "error":
                self.outcome = "error"
                self.error = TurnFailure("persist", error)
                self.status_error = self._error_status(error, "persist")

    async def _roll_back(self, stop: StoppedByInput) -> None:
        """ROLLBACK (docs/semantics.md §5, §12: the one sanctioned removal of acknowledged input):
        remove the turn's input messages and its partial reply and record it ended ``aborted``
        with reason ROLLED_BACK, in one transaction. Nothing of it stays in the transcript."""
        assert self._record is not None
        if self.status_error is None:
            self.status_error = self._error_status(stop, "stream")
        record = dataclasses.replace(
            self._record,
            state="aborted",
            end_time=dt.datetime.now(dt.UTC),
            error=self.status_error.SerializeToString(),
            timeline=self.state.timeline.serialize(),
        )
        removed = [message.id for message in self.request.messages] + [self.message_id]
        end = self._end_response(None) if self._end_is_final() else None
        tail = await self._stream_tail(end)
        try:
            await asyncio.shield(
                self.store.roll_back_turn(
                    record,
                    removed,
                    events=tail.events if tail else (),
                    stream_ended=tail is not None and tail.ended,
                )
            )
            self._stream_stored(tail)
            self._end = end
        except LeaseLost as error:
            self._fenced_out(error)
        except TurnNotFound:
            log.info("turn %s: conversation deleted; nothing to roll back", self.request.request_id)
        except Exception as error:
            log.error("turn %s: rolling back failed: %s", self.request.request_id, error)
            self.outcome = "error"
            self.error = TurnFailure("persist", error)
            self.status_error = self._error_status(error, "persist")

    async def _after_lock(self) -> None:
        """on_chat_error / on_chat_response (lock released), then the TurnEnd event."""
        request = self.request
        if self.outcome == "error":
            await self._surface_error()
        # on_chat_response: every completed turn, and an errored or aborted one
        # whose partial reply was stored (docs/semantics.md §3).
        outcome = _OUTCOMES.get(self.outcome)
        if self.left_running:
            outcome = None  # not over: its recovery will end it
        stop = self._stop
        stopped_by = (
            ConcurrentInput("rollback" if stop.rollback else "interrupt", stop.interrupting_request_id)
            if isinstance(stop, StoppedByInput) and self.messages_persisted and self.outcome == "aborted"
            else None
        )
        # A turn stopped by new input always gets its on_chat_response (the issue 18 contract),
        # even with nothing stored (rolled back, or stopped before its first part).
        if outcome is not None and (
            outcome == "completed" or self.stored_message is not None or stopped_by is not None
        ):
            await self.hooks.on_chat_response(
                ChatResponseContext(
                    conversation_id=request.conversation_id,
                    request_id=request.request_id,
                    message=self.stored_message or self.state.assistant.message,
                    continuation=request.continuation,
                    status=outcome,
                    error=self.error,
                    concurrent_input=stopped_by,
                    cost=self.state.cost.total(),
                    budgets=self.state.budget_states,
                )
            )
        end = self._end
        if end is None:
            end = self._end_response(self.stored_message)
            stream = self.writer.log
            if stream is not None and not self.left_running:  # left running: it has no end yet
                await stream.store_end(end)
        self.writer.send(end)

    def _end_is_final(self) -> bool:
        """True when nothing after the turn's final write changes its TurnEnd: no
        ``on_chat_error`` will replace its error, and no hook timeline records the hooks still
        to run. Its TurnEnd is then built and stored in that write."""
        if self.timeline is not None or self.left_running:
            return False
        return self.outcome != "error" or not self.hooks.runs("on_chat_error")

    async def _stream_tail(self, end: Any) -> StreamTail | None:
        """The stream events the turn's final write stores (:meth:`StreamLog.tail`)."""
        stream = self.writer.log
        return None if stream is None else await stream.tail(end)

    def _stream_stored(self, tail: StreamTail | None) -> None:
        stream = self.writer.log
        if stream is not None and tail is not None:
            stream.stored(tail)

    def _end_response(self, message: message_pb2.Message | None) -> Any:
        """The TurnEnd response (prepared, not sent): the outcome, its error, the stored reply
        ``message``, usage, cost and step count, the hook timeline when kept."""
        response = self.writer.prepare()
        end = response.event.turn_end
        end.status = {
            "completed": event_pb2.TURN_STATUS_COMPLETED,
            "error": event_pb2.TURN_STATUS_ERROR,
            "aborted": event_pb2.TURN_STATUS_ABORTED,
            "interrupted": event_pb2.TURN_STATUS_INTERRUPTED,
            "skipped": event_pb2.TURN_STATUS_SKIPPED,
            "running": event_pb2.TURN_STATUS_ERROR,
        }[self.outcome]
        if self.status_error is not None:
            end.error.CopyFrom(self.status_error)
        if message is not None:
            end.message.CopyFrom(message)
        self.state.usage.copy_to(end.usage)
        cost = self.state.cost.total()
        if cost is not None:
            cost.copy_to(end.cost)
        end.step_count = self.state.steps_started  # a step cut short by a cancel or an error counts too
        if self.timeline is not None and self.settings.events.hook_timeline:
            end.metadata.update({"hook_timeline": self.timeline.as_dicts()})
        return response

    # --- errors ------------------------------------------------------------

    def _overflowed(self) -> bool:
        """True for a turn that ends in a context overflow with reactive compaction on."""
        config = self.settings.compaction
        return (
            self.outcome == "error"
            and self._classification == "context_overflow"
            and config is not None
            and config.reactive
        )

    def _error_context(self, error: BaseException, stage: ErrorStage) -> ChatErrorContext:
        """The hooks' view of ``error``: a hook's own exception rather than the chain's wrapper,
        with the hook named."""
        middleware = hook = ""
        if isinstance(error, HookError):
            middleware, hook = error.middleware, error.hook
            error = error.__cause__ or error
        return ChatErrorContext(
            conversation_id=self.request.conversation_id,
            request_id=self.request.request_id,
            error=error,
            stage=stage,
            messages_persisted=self.messages_persisted,
            classification=self._classification,
            middleware=middleware,
            hook=hook,
        )

    async def _classify(self, failure: TurnFailure) -> ChatErrorClassification | None:
        return await self.hooks.classify_chat_error(self._error_context(_root(failure), failure.stage))

    async def _surface_error(self) -> None:
        failure = self.error
        if not isinstance(failure, TurnFailure):
            return
        stage = failure.stage
        original = _root(failure)
        if self.status_error is None:
            self.status_error = self._error_status(original, stage)
        context = self._error_context(original, stage)
        surfaced = await self.hooks.on_chat_error(context)
        if surfaced is not context.error:
            if isinstance(surfaced, ChatError):
                self.status_error = self._error_status(surfaced, stage)
            else:
                replaced = copy.deepcopy(self.status_error)
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
        admission, self._admission = self._admission, None  # a later attempt reads the store again
        admitted, self._admitted = self._admitted, None  # the first attempt's, reserved at admission
        if admitted is None:
            await settle(self.state)  # what an earlier attempt of this run left reserved
        # Else it stays the turn's to settle until the steps' own end does (before_turn may fail).
        timeline = self.state.timeline
        timeline.attempt = self.state.attempt
        loop = StepLoop(
            self.state,
            store=self.store,
            providers=self.providers,
            settings=self.settings,
            stop=self.cancel,
            compactor=self.compactor,
            budgets=admitted,
        )
        with timeline.span(ATTEMPT, f"attempt {self.state.attempt}"):
            await loop.run(admission)


@dataclasses.dataclass(frozen=True, slots=True)
class Recovery:
    """How to recover a turn a crash interrupted (docs/semantics.md §8).

    ``record`` is the stored turn, still ``running``, its ``recovery_count`` already counting
    this recovery; ``reply`` the stored partial reply to continue (None: nothing was committed,
    the turn re-runs); ``attempt`` the attempt this run is (from 2); ``slots`` bounds how many
    recoveries run their steps at once (``durability.max_concurrent_recoveries``); ``reason``
    goes in the AttemptStart event.
    """

    record: TurnRecord
    reply: message_pb2.Message | None
    attempt: int
    slots: asyncio.Semaphore
    reason: str = "SERVER_RESTARTED"

    async def uncount(self, store: TurnRunStore) -> None:
        """Put back this recovery's count: it ran nothing (refused or stopped before its turn
        came; docs/semantics.md §8). ``record`` as claimed, with ``reply``, in one write under
        the claim's lease. Raises what ``Store.finish_turn`` raises (``LeaseLost`` once the
        turn was given up or taken over: nothing written)."""
        claimed = dataclasses.replace(self.record, recovery_count=self.record.recovery_count - 1)
        await store.finish_turn(claimed, self.reply)


def _root(error: BaseException) -> BaseException:
    return error.error if isinstance(error, TurnFailure) else error
