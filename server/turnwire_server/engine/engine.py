"""The turn engine: admission, the running-turn registry, cancellation, drain, recovery.

A conversation's line and its concurrent-input strategies are
:mod:`~turnwire_server.engine.conversation_line`'s; stopping the turns at shutdown is
:mod:`~turnwire_server.engine.shutdown`'s.

It knows only interfaces: a :class:`~turnwire_server.store.base.EngineStore`, a
:class:`~turnwire_server.providers.registry.ProviderRegistry`,
:class:`~turnwire.tools.Tool`s and a
:class:`~turnwire_server.hooks.chain.MiddlewareChain`. It raises domain errors
(:mod:`turnwire_server.engine.errors`); the API layer maps them to statuses.
"""

from __future__ import annotations

import asyncio
import contextvars
import datetime as dt
import logging
from collections import Counter
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from typing import Any, Protocol

from turnwire.hooks import ConcurrentInput
from turnwire.tools import Tool
from turnwire_client.v1 import event_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.budget_gate import BudgetGate
from turnwire_server.engine.channel import EventChannel
from turnwire_server.engine.conversation_line import ConversationLine, stop_of
from turnwire_server.engine.crash_recovery import recover_turn
from turnwire_server.engine.errors import (
    ConversationDeleted,
    NestedTurn,
    QueueFull,
    RequestIdInUse,
    ShuttingDown,
    TurnInProgress,
    drop_tracebacks,
)
from turnwire_server.engine.events import EventWriter
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.resume import replay
from turnwire_server.engine.settings import EngineSettings
from turnwire_server.engine.shutdown import stop_turns
from turnwire_server.engine.stream_log import RECOVERY_SEQUENCE_GAP, StreamLog, Subscription
from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.engine.turn import TurnRun
from turnwire_server.engine.turn_base import ErrorStatus, Recovery
from turnwire_server.engine.turn_handle import TurnHandle
from turnwire_server.engine.turn_slots import UNCOUNTED, TurnSlots
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.log_context import bind as bind_log_context
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.base import EngineStore
from turnwire_server.store.errors import StoreError
from turnwire_server.store.records import HeldTurn, TurnRecord

log = logging.getLogger("turnwire.engine")

_REFUSED_OVER_BUDGET = frozenset({"chat", "save_messages", "continue"})
"""The entries whose turns an exhausted budget refuses before they store anything; the others
carry input stored already (a submission, tool results) and end at their first step instead."""

_current_turn: contextvars.ContextVar[TurnRun | None] = contextvars.ContextVar(
    "turnwire_current_turn", default=None
)


class SubagentHomes(Protocol):
    """Where a sub-agent's turn runs (:class:`~turnwire_server.engine.subagents.Subagents`)."""

    def home(self, name: str) -> tuple[MiddlewareChain, Mapping[str, Tool]]:
        """The middleware chain and tools of sub-agent ``name`` (docs/subagents.md)."""
        ...

    def started(self, handle: TurnHandle) -> None:
        """A sub-agent's turn started (a call, or the recovery of one)."""
        ...


class TurnEngine:
    """Starts, tracks and cancels turns.

    :meth:`start` raises a domain error when a turn cannot be admitted:
    :class:`~turnwire_server.engine.errors.ShuttingDown`,
    :class:`~turnwire_server.engine.errors.RequestIdInUse`,
    :class:`~turnwire_server.engine.errors.QueueFull`,
    :class:`~turnwire_server.engine.errors.NestedTurn` (a blocking turn inside
    an active turn of the same conversation), or
    :class:`~turnwire_server.providers.registry.UnknownModel`.
    ``error_status`` maps a turn's error to the status in its TurnEnd event. ``tracing``
    records each turn's spans (:mod:`turnwire_server.engine.tracing`; off by default).
    ``turn_slots`` counts the turns running without a caller against their tenant's share
    (:mod:`turnwire_server.engine.turn_slots`; nothing counted by default).
    """

    def __init__(
        self,
        *,
        store: EngineStore,
        providers: ProviderRegistry,
        tools: Mapping[str, Tool],
        chain: MiddlewareChain,
        settings: EngineSettings,
        error_status: ErrorStatus,
        tracing: Tracing = TRACING_OFF,
        turn_slots: TurnSlots = UNCOUNTED,
    ) -> None:
        self.store = store
        self.turn_slots = turn_slots
        self.tracing = tracing
        self.error_status = error_status
        self.providers = providers
        # Kept as given, not copied: a live tool set (remote sources re-list) is read per turn.
        self.tools = tools
        self.chain = chain
        self.settings = settings
        self._turns: dict[str, TurnHandle] = {}
        self._recovering: set[str] = set()  # claimed here, their recovery not started yet
        self._queued: Counter[str] = Counter()
        self._accepting = True
        self._recovery_slots = asyncio.Semaphore(settings.durability.max_concurrent_recoveries)
        #: The configured sub-agents (docs/subagents.md), set once they are built; a sub-agent's
        #: turn runs with its own middleware chain and tools.
        self.subagents: SubagentHomes | None = None
        #: The conversations' lines: busy turns, places taken, concurrent-input strategies.
        self.line = ConversationLine(
            store,
            settings,
            self._turns,
            lambda conversation_id, own_id: self._local_busy(conversation_id, own_id=own_id),
        )
        self.budget_gate = BudgetGate(
            store,
            settings,
            providers,
            tracing,
            lambda conversation_id: self._local_busy(conversation_id, own_id="") is not None,
        )

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` began: no turn is admitted any more."""
        return not self._accepting

    @property
    def running(self) -> int:
        """Turns started and not yet ended (queued ones included)."""
        return len(self._turns)

    async def release_orphaned(self, held: Sequence[HeldTurn]) -> int:
        """Give up the leases of the turns among ``held`` (what this replica's lease renewal found
        it holds: ``Store.renew_leases``) that nothing here runs, so that the next claim of a
        replica, this one's included, recovers them (docs/operate/outages.md); returns how many.
        Such a turn is ``running`` in the store under this replica's lease, which would otherwise
        be renewed for as long as the replica lives: its end could not be stored (the store
        unavailable past ``durability.store_outage_seconds``), its input's commit or its claim
        was cut off after it landed, its recovery did not start (a store error, a refusal) or
        was stopped while it waited for its turn lock. The replica's lease loop calls this right
        after a renewal, between its claims; a turn claimed here whose recovery is still starting
        (:meth:`recover_turns`, on a task of its own) is not given up. Each release is fenced by
        the token and start the renewal found, so a turn that ended or was taken over meanwhile
        is left as it is. Raises :class:`StoreError` (the next renewal finds them again)."""
        recovering = self._recovering
        orphaned = [
            turn
            for turn in held
            if turn.lease.request_id not in self._turns and turn.lease.request_id not in recovering
        ]
        if not orphaned:
            return 0
        await self.store.release_leases(orphaned)
        log.warning(
            "gave up the leases of %d turn(s) running in the store under this replica that it does"
            " not run: %s",
            len(orphaned),
            ", ".join(turn.lease.request_id for turn in orphaned[:10]),
        )
        return len(orphaned)

    async def start(
        self,
        request: TurnRequest,
        *,
        parent_request_id: str = "",
        detached: bool = False,
        queue_limit: bool = True,
        recovery: Recovery | None = None,
        last_sequence_number: int = 0,
        reserved: bool = False,
    ) -> TurnHandle:
        """Admit ``request`` and start its turn in a new task (it queues for the conversation's lock).

        ``detached``: no caller reads the stream (a submission, a recovery); its events go only
        to the stream log and to ResumeTurn readers. ``queue_limit`` False admits past
        ``max_queued_turns_per_conversation`` (durably accepted work). ``recovery`` runs a
        recovery of a crashed turn whose stored stream ends at ``last_sequence_number``.
        ``reserved``: a REJECT request whose place ``line.reserve_if_idle`` took already (the
        caller checked before storing input of its own, such as tool results); the turn takes
        that place over, or gives it up when it is refused or never takes the lock.

        A turn with the same request id whose TurnEnd was already sent is only storing its last
        events: its caller may already be retrying (after an abort) or reusing the id, so this
        waits for it to finish and lets the store decide (``TurnAlreadyExists`` or a retry).
        The request's concurrent-input strategy applies when the conversation has a turn running
        or queued (:meth:`.ConversationLine.apply_strategy`): ``reject`` raises
        :class:`~turnwire_server.engine.errors.TurnInProgress`; ``interrupt`` and ``rollback``
        stop the running turn and put this one first in line.
        A new turn on a conversation whose budget or tenant's budget is exhausted is refused
        (:class:`~turnwire_server.engine.errors.BudgetRefused`) before anything is stored; turns
        that carry stored input (a submission, a continuation after tool results) run and meet
        the budget at their first step (docs/cost.md, "Budgets"). On a conversation idle here
        the check rides the turn's admission, and this returns once the input is stored (or the
        turn waits in line behind another replica's: a refusal then comes as the stream's
        TurnEnd, before any TurnStart); else it is a read before the turn queues.
        Raises :class:`~turnwire_server.engine.errors.AdmissionRefused` subclasses.
        """
        previous = self._turns.get(request.request_id)
        if previous is not None and previous.run.ended:
            await asyncio.wait({previous.task})  # neither raises its error nor cancels it
        concurrent_input = ConcurrentInput("reject") if reserved else None
        check_budgets = (
            recovery is None and request.entry in _REFUSED_OVER_BUDGET and self.settings.budgets.enabled
        )
        in_admission = check_budgets and self.budget_gate.rides_admission(request)
        try:
            if check_budgets and not in_admission:
                await self.budget_gate.refuse_if_spent(request)
            self._admit(request, parent_request_id, queue_limit=queue_limit)
            # A submission's strategy applies only when started at acceptance (Submissions.submit).
            if recovery is None and (request.entry != "submission" or request.concurrent_input is not None):
                if not reserved:  # else its place was taken before its lock (ConversationLine.apply_strategy)
                    try:
                        concurrent_input, reserved = await self.line.apply_strategy(request)
                    except TurnInProgress:
                        if in_admission:  # a spent budget refuses first, as when checked before
                            await self.budget_gate.refuse_if_spent(request)
                        raise
                if concurrent_input is not None and concurrent_input.strategy != "enqueue":
                    # It awaited the store: checked again, so nothing admitted meanwhile slips past.
                    self._admit(request, parent_request_id, queue_limit=queue_limit)
        except BaseException:
            if reserved:  # refused after all: the place it took goes
                await self.line.release_place(request.conversation_id, request.request_id)
            raise
        channel: EventChannel[Any] = EventChannel(self.settings.limits.stream_buffer_events)
        if detached:
            channel.detach()
        log = StreamLog(
            self.store,
            request.conversation_id,
            request.request_id,
            interval=self.settings.checkpoint.interval_ms / 1000.0,
            subscriber_limit=self.settings.limits.stream_buffer_events,
        )
        writer = EventWriter(
            request.conversation_id,
            request.request_id,
            request.response_type,
            channel,
            self.settings.events.text_coalesce_ms,
            log=log,
        )
        if recovery is not None:
            writer.sequence_number = last_sequence_number + RECOVERY_SEQUENCE_GAP
        conversation_id = request.conversation_id
        self._queued[conversation_id] += 1
        metrics.QUEUED_TURNS.inc()
        acquired = False

        def on_lock_acquired() -> None:
            nonlocal acquired
            acquired = True
            self._dequeue(conversation_id)

        chain, tools = self.chain, self.tools
        if request.subagent_path and self.subagents is not None:
            chain, tools = self.subagents.home(request.subagent_path[-1].subagent)
        run = TurnRun(
            request,
            store=self.store,
            providers=self.providers,
            tools=tools,
            chain=chain,
            settings=self.settings,
            writer=writer,
            error_status=self.error_status,
            on_lock_acquired=on_lock_acquired,
            recovery=recovery,
            tracing=self.tracing,
            first_in_line=concurrent_input is not None
            and concurrent_input.strategy in ("interrupt", "rollback"),
            concurrent_input=concurrent_input,
            check_budgets=in_admission,
        )
        tracing = self.tracing

        async def main() -> None:
            _current_turn.set(run)
            bind_log_context(request.conversation_id, request.request_id)
            try:
                provider = self.providers.resolve(request.model)[0] if tracing.enabled else None
                with tracing.turn(request, provider, attempt=run.state.attempt) as span:
                    await run.run()
                    state = run.state
                    tracing.end_turn(
                        span,
                        outcome=run.outcome,
                        usage=state.usage,
                        error=run.error,
                        cost=state.cost.total(),
                        cancel_cause=run.cancel_cause,
                    )
                # Logged and recorded: the kept error's frames would hold the run (a cycle).
                drop_tracebacks(run.error)
            finally:
                if not acquired:
                    self._dequeue(conversation_id)
                    if reserved:  # the lock never took the place over: give it up
                        await self.line.release_place(conversation_id, request.request_id)
                try:
                    # Resume readers find the turn here until its last events are stored.
                    await asyncio.shield(log.finish(ended=not run.left_running))
                finally:
                    self._turns.pop(request.request_id, None)
                    handle.free_slot()

        task = asyncio.create_task(main(), name=f"turn {request.request_id}")
        handle = TurnHandle(run, channel, task, log, detached=detached, slots=self.turn_slots)
        self._turns[request.request_id] = handle
        if request.subagent_path and self.subagents is not None:
            self.subagents.started(handle)
        if run.budget_check is not None:
            await self.budget_gate.checked(handle, run.budget_check)
        return handle

    def _local_busy(self, conversation_id: str, *, own_id: str) -> str | None:
        """The request id of a turn admitted here on ``conversation_id`` and not ended (the one
        holding the lock first), other than ``own_id``; None when there is none."""
        local = [
            h
            for h in self._turns.values()
            if h.conversation_id == conversation_id and not h.run.ended and h.request_id != own_id
        ]
        for handle in local:
            if handle.run.holds_lock:
                return handle.request_id
        return local[0].request_id if local else None

    def _dequeue(self, conversation_id: str) -> None:
        metrics.QUEUED_TURNS.dec()
        self._queued[conversation_id] -= 1
        if self._queued[conversation_id] <= 0:
            del self._queued[conversation_id]

    def _admit(self, request: TurnRequest, parent_request_id: str, *, queue_limit: bool = True) -> None:
        if not self._accepting:
            raise ShuttingDown()
        if request.request_id in self._turns:
            raise RequestIdInUse(request.request_id)
        current = _current_turn.get()
        parent = self._turns.get(parent_request_id) if parent_request_id else None
        for active in (current, parent.run if parent is not None else None):
            if (
                active is not None
                and not active.lock_released
                and active.request.conversation_id == request.conversation_id
            ):
                raise NestedTurn(active.request.request_id)
        limit = self.settings.limits.max_queued_turns_per_conversation
        if queue_limit and self._queued[request.conversation_id] >= limit:
            raise QueueFull(request.conversation_id, limit)
        self.providers.resolve(request.model)  # UnknownModel before anything is stored

    def cancel(self, request_id: str) -> bool:
        """Cancel a running or queued turn; False when none has that id (a no-op)."""
        handle = self._turns.get(request_id)
        return handle is not None and handle.cancel(cause="cancel_request")

    async def cancel_anywhere(self, request_id: str) -> bool:
        """Cancel turn ``request_id`` here, or ask the replica running it to (``CancelChat``).
        True when a running or queued turn was found (here, or elsewhere through the store)."""
        if self.cancel(request_id):
            return True
        return await self.store.request_cancel(request_id)

    async def serve_cancel_requests(self) -> None:
        """Cancel the turns other replicas were asked to cancel, as the requests come (runs until
        cancelled; a store served by one process sends none)."""
        async for request_id, reason in self.store.cancel_requests():
            handle = self._turns.get(request_id)
            stop = stop_of(reason)
            if handle is not None and handle.run.cancel(stop, cause=None if stop else "cancel_request"):
                log.info("turn %s cancelled at another replica's request", request_id)

    def handle(self, request_id: str) -> TurnHandle | None:
        """The running or queued turn with that request id, if this process has it."""
        return self._turns.get(request_id)

    def replay(
        self, request_id: str, after_sequence_number: int, *, batch_events: int = 1, batch_bytes: int = 0
    ) -> AsyncIterator[list[event_pb2.TurnEvent]]:
        """Re-attach to turn ``request_id``: its events after ``after_sequence_number``, then the
        live ones until its TurnEnd, in lists of the events ready at once, at most
        ``batch_events`` and ``batch_bytes`` a list (see :func:`turnwire_server.engine.resume.replay`
        for the lists and the errors)."""
        return replay(
            request_id,
            after_sequence_number,
            store=self.store,
            subscribe=self.subscribe,
            retention_seconds=self.settings.durability.event_retention_seconds,
            follow_seconds=self.settings.durability.lease_seconds,
            batch_events=batch_events,
            batch_bytes=batch_bytes,
        )

    def subscribe(self, request_id: str) -> Subscription | None:
        """Attach a live reader to the turn ``request_id`` when it runs (or waits) here."""
        handle = self._turns.get(request_id)
        return None if handle is None else handle.log.subscribe()

    def active_turns(self, conversation_id: str) -> int:
        """How many turns of ``conversation_id`` are started and not yet ended (queued included)."""
        return sum(1 for handle in self._turns.values() if handle.conversation_id == conversation_id)

    async def cancel_conversation(self, conversation_id: str) -> int:
        """Stop every running or queued turn of ``conversation_id`` and wait until each has ended.

        For deleting the conversation (docs/semantics.md §12, deleting): each turn ends
        ``ABORTED`` with reason ``CONVERSATION_DELETED`` (or ``INPUT_NOT_STORED`` when its input
        was not stored yet), after its final write, so nothing of it is written once this
        returns. Turns admitted while it waits are stopped too. Returns how many turns it waited
        for (0: none was active).
        """
        ended = 0
        while handles := [h for h in self._turns.values() if h.conversation_id == conversation_id]:
            for handle in handles:
                handle.run.cancel(ConversationDeleted(conversation_id))
            await asyncio.wait([handle.task for handle in handles])
            ended += len(handles)
        return ended

    async def drain(self, grace_seconds: float, cut_short: asyncio.Event | None = None) -> None:
        """Stop admitting, then stop the turns running (:func:`~.shutdown.stop_turns`: they get
        ``grace_seconds``, or until ``cut_short`` is set, to finish)."""
        self._accepting = False
        await stop_turns(list(self._turns.values()), grace_seconds, cut_short)

    async def recover(self, *, resume: bool = True) -> int:
        """After a crash: claim and recover the turns whose process died (docs/semantics.md §8).

        The store decides which running turns are interrupted (``Store.claim_interrupted_turns``:
        with SQLite every turn another process ran; with a shared store those whose lease
        lapsed) and gives them to this replica atomically, so each is recovered once.
        Each one's checkpointed reply is kept, its tool calls without a result given an
        errored one. With ``resume`` and budget left (``recovery_budget``, counted in the
        store before the recovery runs, so a crash during it cannot recover it twice), it is
        recovered: a detached run that continues the stored reply, or re-runs the turn when
        nothing was committed, its stream opening with an AttemptStart. Otherwise it ends
        INTERRUPTED with a ServerRestarted error, and its stream gets that TurnEnd. Returns
        how many turns were found.
        """
        now = dt.datetime.now(dt.UTC)
        lease = now + dt.timedelta(seconds=self.settings.durability.lease_seconds)
        turns: list[TurnRecord] = []
        while batch := await self.store.claim_interrupted_turns(self.settings.replica_id, now, lease, 500):
            turns.extend(batch)
            if len(batch) < 500:
                break
        await self.recover_turns(turns, resume=resume)
        return len(turns)

    def recover_turns(self, turns: Sequence[TurnRecord], *, resume: bool = True) -> Coroutine[Any, Any, None]:
        """Recover ``turns``, claimed by this replica (see :meth:`recover`): await what this returns.
        From this call until each one's recovery started, ended or was refused, the turn is not
        given up as running nowhere (:meth:`release_orphaned`; the lease loop runs recoveries on
        a task of their own). A turn whose recovery does not start is running under this
        replica's lease with nothing running it: the next lease renewal gives it up, so a claim
        recovers it (its recovery counted: ``durability.recovery_budget`` bounds the attempts;
        not when it ran nothing, docs/semantics.md §8). Raises :class:`StoreError` at the first
        store failure (the others wait for the next claim); any other failure is logged and the
        next turn recovered."""
        ids = {turn.request_id for turn in turns} - self._recovering
        self._recovering |= ids  # claimed here, not running yet: not orphans (release_orphaned)
        return self._recover_turns(turns, resume, ids)

    async def _recover_turns(self, turns: Sequence[TurnRecord], resume: bool, ids: set[str]) -> None:
        try:
            for turn in turns:
                try:
                    await recover_turn(
                        turn,
                        resume,
                        store=self.store,
                        settings=self.settings,
                        slots=self._recovery_slots,
                        error_status=self.error_status,
                        start=self._start_recovery,
                    )
                except StoreError:
                    raise
                except Exception:  # a refusal (RequestIdInUse, ShuttingDown) or a bug: not the others' fault
                    log.exception(
                        "turn %s: its recovery did not start; its lease is given up", turn.request_id
                    )
                finally:
                    if turn.request_id in ids:  # started, ended or refused: an orphan again if not running
                        self._recovering.discard(turn.request_id)
        finally:
            self._recovering -= ids

    async def _start_recovery(self, request: TurnRequest, recovery: Recovery, last_sequence: int) -> None:
        """A recovery run of a claimed turn (:func:`~.crash_recovery.recover_turn`): detached, never
        refused for a full queue, its stream going on after ``last_sequence``."""
        await self.start(
            request, detached=True, queue_limit=False, recovery=recovery, last_sequence_number=last_sequence
        )
