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

This module is the lifecycle (the lock, the input's commit, the start); a turn's state and stop
are :mod:`.turn_base`, its attempts :mod:`.turn_attempts`, its end :mod:`.turn_end`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from contextlib import AbstractAsyncContextManager

from turnwire_client.v1 import message_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.budget_admission import (
    admission_charge,
    budget_refusal,
    count_refusal,
    refusing_budgets,
)
from turnwire_server.engine.budget_scopes import applies
from turnwire_server.engine.budgets import cache_writes, settle, step_budgets
from turnwire_server.engine.errors import (
    BudgetRefused,
    NothingToContinue,
    TurnFailure,
)
from turnwire_server.engine.turn_attempts import TurnAttempts
from turnwire_server.engine.turn_spec import spec_json
from turnwire_server.engine.turn_timeline import QUEUE
from turnwire_server.store.errors import BudgetSpent
from turnwire_server.store.records import BudgetCharge, BudgetLimits, TurnAdmission, TurnRecord

log = logging.getLogger("turnwire.turn")


class TurnRun(TurnAttempts):
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
                        self._checked()
                        self.state.timeline.end(queue)
                        self._on_lock_acquired()
                        await self._locked(admission)
                except asyncio.CancelledError:
                    # Stopped while queued for the lock: nothing was stored.
                    if isinstance(self._stop, BudgetRefused):  # refuse_queued
                        self._refused(self._stop)
                    else:
                        self._checked()
                        self.outcome = "aborted"
                        self._not_stored("it was cancelled while it waited for the turn before it")
                        await self._left_for_recovery()
                except BudgetSpent as spent:  # the check riding the admission: nothing stored
                    now = dt.datetime.now(dt.UTC)
                    self._refused(
                        budget_refusal(
                            spent.budget, spent.spend, self.request.conversation_id, now, spent.ask
                        )
                    )
                except Exception as error:  # the lock or the input's commit failed: nothing stored
                    self._checked()  # start returns: the stream's TurnEnd says why
                    self.outcome = "error"
                    self.error = TurnFailure("persist", error)
                    await self._left_for_recovery()
                    await self._classify_failure()
            self._phase = "after"
            await self._after_lock()
        finally:
            self._checked()  # ended without the check's answer: its stream says how
            self._phase = "ended"
            self.ended = True
            self.writer.close()
            self._count()
            # Links that lead back here and are used only while the turn runs (docs/architecture.md,
            # "A turn's objects"): its task (whose context holds this run), the call ids' view of
            # its transcript, the checkpointer's callbacks (closed already unless no step ran).
            self._task = None
            self.state.call_ids = None
            self.state.checkpoints.detach()

    def _refused(self, refusal: BudgetRefused) -> None:
        """A budget the turn would run under is spent (found by its admission, or by the
        engine's read while it waited in line): the turn is refused (nothing was stored, no hook
        runs, it is not counted as a turn). The engine's ``start`` raises the refusal when it
        still waits for the check; else the stream's TurnEnd carries it, as its first event (the
        call's refusal, as every refusal before TurnStart)."""
        count_refusal(refusal, self.request.conversation_id)
        self.outcome = "refused"
        self.error = refusal
        self.status_error = self._error_status(refusal, "persist")
        self._checked(refusal)

    def _count(self) -> None:
        """The turn's metrics and its debug line, once it ended (a refused turn is no turn)."""
        if self.outcome == "refused":
            return
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
        charge = self._admission_charge(self._record)
        return self.store.admit_turn(
            self._record,
            request.messages,
            lease_seconds=self.settings.durability.lease_seconds,
            read_compaction=self.compactor is not None,
            queued=self._queued,
            first=self.first_in_line,
            budget=charge,
            refuse=self._refusing(charge),
        )

    def _refusing(self, charge: BudgetCharge | None) -> tuple[BudgetLimits, ...]:
        """The budgets whose exhaustion refuses this turn at its admission, when the check rides
        it (:attr:`budget_check`; else none): those of the admission's ``charge``, when it carries
        one (the same budgets at the same time, so the charge's rows answer the check; the turn's
        own too, which a new turn has spent nothing of, so it refuses only a first step it has no
        room for), else :func:`refusing_budgets`."""
        if self.budget_check is None:
            return ()
        if charge is not None:
            return charge.budgets
        request = self.request
        return refusing_budgets(
            self.settings.budgets, request.conversation_id, request.principal, dt.datetime.now(dt.UTC)
        )

    def _admission_charge(self, record: TurnRecord) -> BudgetCharge | None:
        """The first step's reservation for the admission to carry (:mod:`.budget_admission`),
        priced at the turn's model; None when there is none to carry."""
        settings = self.settings
        if not applies(settings.budgets, self.request.budget):
            return None
        try:
            provider, _ = self.providers.resolve(self.request.model)
        except LookupError:
            return None  # the step says why
        # The request is not built yet: the cache writes its provider's own markers make.
        writes = cache_writes(provider, None)
        rates = settings.prices.rates(self.request.model, getattr(provider, "type", None), writes)
        self._charged_at = dt.datetime.now(dt.UTC)
        return admission_charge(
            settings.budgets,
            settings.first_steps,
            self.request,
            record.lease,
            rates=rates,
            now=self._charged_at,
        )

    def _queued(self, waiting: bool) -> None:
        """``Store.admit_turn``'s report: waiting for the turns ahead (a stop cancels the wait;
        one recorded while the input was being written takes effect now) or writing the input (a
        stop waits for the commit)."""
        self._phase = "queued" if waiting else "storing"
        if waiting:
            self._checked("waiting")  # the engine's start reads the budgets meanwhile
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
                self.store, self.settings, self.state, admitted=admission.budget, admitted_at=self._charged_at
            )
        self.messages_persisted = True
        self._phase = "running"
        self._start_event()
        if self.state.cancelled.is_set():  # stopped while the input was written
            raise asyncio.CancelledError
        await self._attempts()
