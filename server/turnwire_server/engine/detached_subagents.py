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
"""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import logging
from typing import TYPE_CHECKING, Any

from turnwire.types import last_step_text
from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.engine.subagents import CHILD_MARK, local_id
from turnwire_server.store.records import SubmissionRecord

if TYPE_CHECKING:
    from turnwire_server.engine.engine import TurnHandle
    from turnwire_server.engine.submissions import Submissions
    from turnwire_server.store.base import EngineStore

log = logging.getLogger("turnwire.subagents")

_PATIENCE_SECONDS = 60.0
"""How long a child's end waits for the submissions to be ready (they start after the
recoveries at start-up) before its answer is given up (logged)."""


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
        try:
            async with asyncio.timeout(_PATIENCE_SECONDS):
                await self._ready.wait()
        except TimeoutError:
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

    @staticmethod
    def _record(handle: TurnHandle, subagent: str) -> SubmissionRecord:
        """The submission of ``handle``'s answer to its parent conversation."""
        run = handle.run
        request = run.request
        call = request.subagent_path[-1]
        parent_key = call.conversation_id.rpartition(CHILD_MARK)[0]
        status = run.outcome
        who = f"Sub-agent {subagent} (call {call.tool_call_id})"
        if status == "completed" and run.stored_message is not None:
            text = f"{who} answered: {last_step_text(run.stored_message)}"
        else:
            why = f": {run.status_error.message}" if run.status_error is not None else ""
            text = f"{who} ended {status}{why}"
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
            principal=request.principal,
        )
