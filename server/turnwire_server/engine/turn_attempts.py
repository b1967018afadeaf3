"""A turn's attempts: its steps, run again after a stall (docs/semantics.md §5, stall recovery)
or a context overflow that reactive compaction shortened (§9), each announced by AttemptStart.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from turnwire.error_classes import overflow_remedy
from turnwire.errors import ABORTED_TOOL_ERROR
from turnwire_server.engine.assistant_message import AssistantMessage
from turnwire_server.engine.budgets import settle
from turnwire_server.engine.client_tools import turn_tools
from turnwire_server.engine.errors import (
    StreamStalled,
    TurnFailure,
)
from turnwire_server.engine.ids import attempt_message_id
from turnwire_server.engine.step_loop import StepLoop
from turnwire_server.engine.turn_base import root_error, timestamp_now
from turnwire_server.engine.turn_end import TurnEnding
from turnwire_server.engine.turn_timeline import ATTEMPT, COMPACTION

log = logging.getLogger("turnwire.turn")


class TurnAttempts(TurnEnding):
    """The steps of a turn and its later attempts (the part of :class:`~.turn.TurnRun` that runs
    while it holds the lock)."""

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
        remedy = overflow_remedy(root_error(failure))
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
        assistant = AssistantMessage(self.message_id, timestamp_now())
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
