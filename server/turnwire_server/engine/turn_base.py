"""A turn's state and how it is stopped: what :class:`~.turn.TurnRun` and its parts share.

:class:`TurnRunBase` builds a turn's working state (its reply, checkpoints, hooks, timeline) and
keeps its outcome; :meth:`TurnRunBase.cancel` is the one way a turn is stopped from outside
(docs/semantics.md §5). The parts that run it: :mod:`.turn` (the lifecycle: lock, input,
start), :mod:`.turn_attempts` (the steps and the attempts after a stall or an overflow),
:mod:`.turn_end` (storing its end, the hooks after the lock, the TurnEnd).
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol

from google.protobuf import timestamp_pb2

from turnwire.hooks import (
    ChatErrorClassification,
    ConcurrentInput,
    ErrorStage,
)
from turnwire.tools import Tool
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.assistant_message import AssistantMessage
from turnwire_server.engine.budgets import StepBudgets
from turnwire_server.engine.checkpoints import Checkpointer
from turnwire_server.engine.client_tools import turn_tools
from turnwire_server.engine.compaction import Compactor
from turnwire_server.engine.cost import CostTotal
from turnwire_server.engine.errors import (
    BudgetRefused,
    InputNotStored,
    ServerStopping,
    TurnFailure,
)
from turnwire_server.engine.events import EventWriter
from turnwire_server.engine.ids import assistant_message_id
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.settings import EngineSettings
from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.engine.turn_state import TurnWorkingState
from turnwire_server.engine.turn_timeline import TurnTimeline
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.hooks.timeline import HookTimeline
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.base import TurnRunStore
from turnwire_server.store.errors import LeaseLost
from turnwire_server.store.records import TurnAdmission, TurnRecord
from turnwire_server.store.records import TurnState as StoredTurnState

log = logging.getLogger("turnwire.turn")

CancelCause = Literal["cancel_request", "caller_left"]
"""Who cancelled a turn with a plain cancel: ``cancel_request``, a ``CancelChat`` (or
``CancelSubmission``) on any replica; ``caller_left``, its call ended first (the client cancelled
it, hung up or hit its deadline) under the disconnect policy ``CANCEL``."""

CANCEL_CAUSES: dict[CancelCause, str] = {
    "cancel_request": "CancelChat or CancelSubmission",
    "caller_left": "its caller left (cancelled its call, hung up or hit its deadline; disconnect CANCEL)",
}
"""Who a :data:`CancelCause` names, in words (the log line, the TurnEnd's error message)."""

BudgetCheck = BudgetRefused | Literal["admitted", "waiting"]
"""How a new turn's budget check riding its admission came out (:attr:`TurnRunBase.budget_check`)."""


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


def timestamp_now() -> timestamp_pb2.Timestamp:
    """Now, as a protobuf ``Timestamp``."""
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


class TurnRunBase:
    """A turn's state, its outcome and its stop (the constructor of :class:`~.turn.TurnRun`,
    whose docstring gives its arguments)."""

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
        check_budgets: bool = False,
    ) -> None:
        self.request = request
        #: With ``check_budgets``: the outcome of the new turn's budget check, which rides its
        #: admission (``Store.admit_turn``'s ``refuse``; docs/cost.md, "Budgets"): the refusal;
        #: ``waiting`` once the turn waits in line (the check answers when its turn comes);
        #: ``admitted`` once its input is stored, or when it ended otherwise (its stream tells
        #: then). The engine's ``start`` waits for it.
        self.budget_check: asyncio.Future[BudgetCheck] | None = (
            asyncio.get_running_loop().create_future() if check_budgets else None
        )
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
            self.timeline, timeline.hook_spans(tracing.hook if tracing.enabled else None), settings.redact
        )
        self.message_id = (
            recovery.record.assistant_message_id if recovery else assistant_message_id(request.request_id)
        )
        assistant = AssistantMessage(self.message_id, timestamp_now())
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
        #: When the admission's reservation was sized (its budgets' periods are that day's).
        self._charged_at: dt.datetime | None = None
        #: A stored turn's state, or ``refused``: a budget refused it at its admission (never stored).
        self.outcome: StoredTurnState | Literal["refused"] = "running"
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
        #: Who cancelled it, for a plain cancel (:data:`CancelCause`; "" for none or a stop).
        self.cancel_cause: CancelCause | Literal[""] = ""
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

    def cancel(self, stop: BaseException | None = None, *, cause: CancelCause | None = None) -> bool:
        """Stop the turn: a cancel (``stop`` None), the stall watchdog (:class:`StreamStalled`)
        or a client that stopped reading (:class:`SlowConsumer`). Returns False when it had no
        effect. A plain cancel's ``cause`` says who asked (its turn span's
        ``turnwire.turn.cancel_cause`` and an ``info`` line, docs/operate/logs.md).

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
        elif cause is not None:
            self.cancel_cause = cause
            ids = {"conversation_id": self.request.conversation_id, "request_id": self.request.request_id}
            log.info("turn %s cancelled: %s", self.request.request_id, CANCEL_CAUSES[cause], extra=ids)
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

    def _checked(self, outcome: BudgetCheck = "admitted") -> None:
        """The budget check's outcome is known, or how far the admission got
        (:attr:`budget_check`)."""
        check = self.budget_check
        if check is not None and not check.done():
            check.set_result(outcome)

    def refuse_queued(self, refusal: BudgetRefused) -> bool:
        """Refuse the turn with ``refusal`` while it still waits in line (nothing stored: it is
        cancelled there, and ends refused, with no hook and not counted); False when it no longer
        waits (its input is being stored, under the admission's own check, or it ended)."""
        if self._phase != "queued" or self._task is None or self.state.cancelled.is_set():
            return False
        self._stop = refusal
        self.state.cancelled.set()
        self._task.cancel()
        return True

    def _not_stored(self, why: str) -> None:
        """The turn ends before its input was stored: its TurnEnd says so (no TurnStart was sent).
        A shutdown says so instead: such a turn (a submission) runs when the server starts again."""
        if isinstance(self._stop, ServerStopping):
            self.status_error = self._error_status(self._stop, "persist")
            return
        self.status_error = self._error_status(InputNotStored(why), "persist")


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


def root_error(error: BaseException) -> BaseException:
    """The error a :class:`TurnFailure` wraps (``error`` itself otherwise)."""
    return error.error if isinstance(error, TurnFailure) else error
