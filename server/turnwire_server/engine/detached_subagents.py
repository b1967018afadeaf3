"""Detached sub-agents: the call returns a handle at once; the answer comes as a submission.

docs/subagents.md, "Detached sub-agents". A sub-agent configured ``detached: true`` starts its
child turn as any sub-agent does, waits only until the child's input is stored (its
``TurnStart``: from there a crash recovers it, docs/semantics.md §8), and returns the handle
``{"subagent", "conversation_id", "request_id", "status": "running"}``. The child's events reach
the calling turn's stream, nested, while that turn runs; the child goes on after it. When the
child's turn ends (here, or in the recovery that a crash left to a restart: the engine hands
every sub-agent turn it starts to :meth:`DetachedResults.watch`), its answer is submitted to the
parent conversation (docs/semantics.md §7) as a user message, with ``body.subagent_result``
saying which call it answers; the submission id is derived from the child's request id, so a
repeated delivery is the same submission.

A crash after the child's end is stored and before its submission is leaves no turn to
recover: :meth:`DetachedResults.reconcile` (run at start-up, after the recoveries) finds the
ended detached children whose submission does not exist and submits it, from what the store
holds of the child (its state, stored reply and error); the derived id makes a delivery that
did happen, or happens meanwhile, the same submission, so the answer arrives once.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from turnwire.subagents import SubagentCall
from turnwire.types import last_step_text
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.engine.subagents import CHILD_MARK, local_id
from turnwire_server.engine.turn_spec import parse_spec
from turnwire_server.event_waits import set_within
from turnwire_server.store.records import SubmissionRecord, TurnRecord

if TYPE_CHECKING:
    from collections.abc import Collection

    from turnwire_server.engine.submissions import Submissions
    from turnwire_server.engine.turn_handle import TurnHandle
    from turnwire_server.store.base import EngineStore

log = logging.getLogger("turnwire.subagents")

_PATIENCE_SECONDS = 60.0
"""How long a child's end waits for the submissions to be ready (they start after the
recoveries at start-up) before its answer is given up (logged)."""

_RECONCILE_PAGE = 500
"""Ended sub-agent turns read per store read by :meth:`DetachedResults.reconcile`."""


def result_submission_id(child_key: str, child_request_id: str) -> str:
    """The submission that delivers a detached child's answer: the child's tenant prefix, then
    ``tw-r-`` and 32 hex digits of the SHA-256 of its request id (one per child turn)."""
    prefix = child_key[: len(child_key) - len(local_id(child_key))]
    return f"{prefix}tw-r-{hashlib.sha256(child_request_id.encode()).hexdigest()[:32]}"


class DetachedResults:
    """Delivers the answers of detached sub-agents' turns to their parent conversations.
    :meth:`bind` gives it the engine's :class:`Submissions` (made after the recoveries that may
    already have started children)."""

    def __init__(self) -> None:
        self._submissions: Submissions | None = None
        self._store: EngineStore | None = None
        self._ready = asyncio.Event()
        self._watching: set[asyncio.Task[None]] = set()

    def bind(self, submissions: Submissions, store: EngineStore) -> None:
        """Deliver through ``submissions`` from now on; ``store`` tells whether the parent
        conversation still exists."""
        self._submissions = submissions
        self._store = store
        self._ready.set()

    def watch(self, handle: TurnHandle, subagent: str) -> None:
        """Deliver the answer of ``handle``'s turn (a detached sub-agent's) once it ends."""
        task = asyncio.create_task(
            self._deliver(handle, subagent), name=f"subagent result {handle.request_id}"
        )
        self._watching.add(task)
        task.add_done_callback(self._watching.discard)

    async def _deliver(self, handle: TurnHandle, subagent: str) -> None:
        await asyncio.wait({handle.task})  # neither raises its error nor cancels it
        run = handle.run
        if run.left_running or run.lease_lost is not None or not run.messages_persisted:
            return  # not over here: its recovery (here or elsewhere) delivers, or it never started
        if not await set_within(self._ready, _PATIENCE_SECONDS):
            log.error("sub-agent turn %s: its answer was not delivered (no submissions)", handle.request_id)
            return
        submissions, store = self._submissions, self._store
        assert submissions is not None and store is not None
        record = self._record(handle, subagent)
        try:
            # A parent deleted meanwhile (its deletion cancels the child after it) stays deleted:
            # a submission would bring it back (docs/semantics.md §12, deleting).
            if await store.get_conversation(record.conversation_id) is None:
                return
            await submissions.submit(record)
        except Exception as error:
            log.error("sub-agent turn %s: delivering its answer failed: %s", handle.request_id, error)

    async def reconcile(self, detached: Collection[str], since: dt.datetime) -> int:
        """Submit the answers of detached children whose turn ended (its stream ended at or
        after ``since``, and kept) without their submission: a crash between the child's end
        and its submission being stored, or a delivery the store refused (docs/subagents.md,
        "Detached sub-agents"). ``detached``: the names of the sub-agents configured
        ``detached: true`` (the configuration decides, as for a recovered child). A child whose
        parent conversation was deleted, or whose stored spec cannot be read, is skipped; an
        answer delivered meanwhile (here, by its own turn, or by another replica) is the same
        submission, so it arrives once. Call after :meth:`bind`; returns how many answers it
        submitted. Raises the store's :class:`~turnwire_server.store.errors.StoreError`."""
        submissions, store = self._submissions, self._store
        assert submissions is not None and store is not None, "bind() first"
        submitted = 0
        after: tuple[dt.datetime, str] | None = None
        while turns := await store.ended_turns_marked(CHILD_MARK, since, _RECONCILE_PAGE, after):
            last = turns[-1]
            assert last.end_time is not None
            after = (last.end_time, last.request_id)
            for turn in turns:
                found = _detached_call(turn, detached)
                if found is None:
                    continue
                call, principal = found
                # The common case, delivered: one read, and the child's messages are not loaded.
                if await store.get_submission(result_submission_id(call.conversation_id, call.request_id)):
                    continue
                record = await self._stored_record(turn, call, principal)
                if await store.get_conversation(record.conversation_id) is None:
                    continue  # deleted: stays deleted (see _deliver)
                try:
                    _, created = await submissions.submit(record)
                except Exception as error:  # one answer's problem (too many open) is not the others'
                    log.error("sub-agent turn %s: delivering its answer failed: %s", turn.request_id, error)
                    continue
                if created:
                    submitted += 1
                    log.warning(
                        "sub-agent turn %s: its answer is delivered late (not when its turn ended)",
                        turn.request_id,
                    )
            if len(turns) < _RECONCILE_PAGE:
                break
        return submitted

    async def _stored_record(self, turn: TurnRecord, call: SubagentCall, principal: str) -> SubmissionRecord:
        """The answer submission of the stored ended ``turn``, ``call``'s child turn, from what
        the store holds: its state, its reply, its error's message."""
        assert self._store is not None
        reply = None
        if turn.state == "completed":
            messages = await self._store.load_messages(turn.conversation_id)
            reply = next((m for m in messages if m.id == turn.assistant_message_id), None)
        why = ""
        if turn.error:
            end = event_pb2.TurnEnd()  # its error is the stored google.rpc.Status
            end.error.ParseFromString(turn.error)
            why = end.error.message
        return _result_record(
            call, subagent=call.subagent, principal=principal, status=turn.state, reply=reply, why=why
        )

    @staticmethod
    def _record(handle: TurnHandle, subagent: str) -> SubmissionRecord:
        """The submission of ``handle``'s answer to its parent conversation."""
        run = handle.run
        call = run.request.subagent_path[-1]
        why = run.status_error.message if run.status_error is not None else ""
        return _result_record(
            call,
            subagent=subagent,
            principal=run.request.principal,
            status=run.outcome,
            reply=run.stored_message,
            why=why,
        )


def _detached_call(turn: TurnRecord, detached: Collection[str]) -> tuple[SubagentCall, str] | None:
    """The sub-agent call whose own turn ``turn`` is, and the principal it runs under, when that
    sub-agent is among ``detached``; else None (not a sub-agent's, another turn on the child
    conversation, a spec this version cannot read)."""
    try:
        spec = parse_spec(turn.spec or "")
    except ValueError:
        return None
    if not spec.subagent_path:
        return None
    call = spec.subagent_path[-1]
    if call.subagent not in detached or call.request_id != turn.request_id:
        return None
    return call, spec.principal


def _result_record(
    call: SubagentCall,
    *,
    subagent: str,
    principal: str,
    status: str,
    reply: message_pb2.Message | None,
    why: str,
) -> SubmissionRecord:
    """The submission of a detached child's answer to its parent conversation: ``call`` the
    sub-agent call it answers, ``status`` the child turn's end state, ``reply`` its stored
    reply (used when completed), ``why`` its error's message ("" for none). The same inputs
    give the same request bytes (a repeated delivery is the same submission)."""
    parent_key = call.conversation_id.rpartition(CHILD_MARK)[0]
    who = f"Sub-agent {subagent} (call {call.tool_call_id})"
    if status == "completed" and reply is not None:
        text = f"{who} answered: {last_step_text(reply)}"
    else:
        text = f"{who} ended {status}{f': {why}' if why else ''}"
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = text
    submission = chat_service_pb2.SubmitMessagesRequest(conversation_id=parent_key, messages=[message])
    result: dict[str, Any] = {
        "subagent": subagent,
        "tool_call_id": call.tool_call_id,
        "conversation_id": local_id(call.conversation_id),
        "request_id": local_id(call.request_id),
        "status": status,
    }
    submission.body.update({"subagent_result": result})
    submission_id = result_submission_id(call.conversation_id, call.request_id)
    submission.submission_id = submission_id
    return SubmissionRecord(
        submission_id=submission_id,
        conversation_id=parent_key,
        idempotency_key=None,
        state="pending",
        request=submission.SerializeToString(deterministic=True),
        create_time=dt.datetime.now(dt.UTC),
        principal=principal,
    )
