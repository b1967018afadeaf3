"""A turn's end: its outcome stored with its reply, the hooks after the lock, the TurnEnd.

The order is docs/semantics.md §2 and §3: store the reply and the turn's end state (with the
stream's last events and, when nothing later can change it, the TurnEnd: durable before it is
sent, §8), release the lock, then ``on_chat_error`` / ``on_chat_response`` and the TurnEnd.
A rollback (§5) removes the turn's input and partial reply instead; a turn another replica took
over stores nothing more (fencing, §5).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import datetime as dt
import logging
from typing import Any

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
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.errors import (
    Cancelled,
    CancelledByShutdown,
    ConversationDeleted,
    ServerStopping,
    SlowConsumer,
    StoppedByInput,
    StreamStalled,
    TurnFailure,
)
from turnwire_server.engine.store_outage import until_stored
from turnwire_server.engine.stream_log import StreamTail
from turnwire_server.engine.turn_base import CANCEL_CAUSES, TurnRunBase, root_error
from turnwire_server.hooks.chain import HookError
from turnwire_server.store.errors import LeaseLost, TurnNotFound

log = logging.getLogger("turnwire.turn")


_OUTCOMES: dict[str, TurnOutcome] = {
    "completed": "completed",
    "error": "error",
    "aborted": "aborted",
    "interrupted": "aborted",  # cut short by the watchdog: on_chat_response sees an abort
}


class TurnEnding(TurnRunBase):
    """How a turn ends (the part of :class:`~.turn.TurnRun` that runs once its steps stopped)."""

    async def _classify_failure(self) -> None:
        """classify_chat_error for a turn that failed (once), counted by class."""
        if self.outcome == "error" and isinstance(self.error, TurnFailure):
            if self._classification is None:
                self._classification = await self._classify(self.error)
            metrics.CHAT_ERROR_CLASSIFICATIONS.labels(self._classification or "none").inc()

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
            if self.cancel_cause:  # who asked, for ListTurns and the TurnEnd (stop is None here)
                cancelled = Cancelled(self.cancel_cause, CANCEL_CAUSES[self.cancel_cause])
                self.status_error = self._error_status(cancelled, "stream")

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
        if lost is None and self.error is not None and isinstance(root := root_error(self.error), LeaseLost):
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
            self.status_error = self._error_status(root_error(self.error), stage)
        # Why it ended is kept with the turn, aborted ones too (SHUTTING_DOWN, SLOW_CONSUMER …):
        # GetConversation names it after a restart, when no TurnEnd is around to say it.
        error_bytes = None if self.status_error is None else self.status_error.SerializeToString()
        cost_usd, cost_source = self.state.cost.stored()
        outcome = self.outcome
        assert outcome != "refused"  # refused at its admission: nothing of it was stored
        record = dataclasses.replace(
            self._record,
            state=outcome,
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
        outcome, stopped_by = self._response_outcome()
        if self.outcome == "error":
            await self._surface_error(response_follows=outcome is not None)
        if outcome is not None:
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

    def _response_outcome(self) -> tuple[TurnOutcome | None, ConcurrentInput | None]:
        """The turn's ``on_chat_response`` status, None when it gets none, and the input that
        stopped it: every completed turn gets one, and an errored or aborted turn whose partial
        reply was stored (docs/semantics.md §3); a turn stopped by new input always does (the
        issue 18 contract), even with nothing stored (rolled back, or stopped before its first
        part); a turn left running does not (its recovery will end it)."""
        outcome = _OUTCOMES.get(self.outcome)
        stop = self._stop
        stopped_by = (
            ConcurrentInput("rollback" if stop.rollback else "interrupt", stop.interrupting_request_id)
            if isinstance(stop, StoppedByInput) and self.messages_persisted and self.outcome == "aborted"
            else None
        )
        if self.left_running or not (
            outcome == "completed" or self.stored_message is not None or stopped_by is not None
        ):
            return None, stopped_by
        return outcome, stopped_by

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
            "refused": event_pb2.TURN_STATUS_ERROR,
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

    def _error_context(
        self, error: BaseException, stage: ErrorStage, *, response_follows: bool = False
    ) -> ChatErrorContext:
        """The hooks' view of ``error``: a hook's own exception rather than the chain's wrapper,
        with the hook named; ``response_follows``: ``on_chat_response`` runs after
        ``on_chat_error``."""
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
            response_follows=response_follows,
        )

    async def _classify(self, failure: TurnFailure) -> ChatErrorClassification | None:
        return await self.hooks.classify_chat_error(self._error_context(root_error(failure), failure.stage))

    async def _surface_error(self, *, response_follows: bool) -> None:
        failure = self.error
        if not isinstance(failure, TurnFailure):
            return
        stage = failure.stage
        original = root_error(failure)
        if self.status_error is None:
            self.status_error = self._error_status(original, stage)
        context = self._error_context(original, stage, response_follows=response_follows)
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
