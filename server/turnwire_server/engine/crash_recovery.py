"""Recovering one turn a crash interrupted (docs/semantics.md §8): continue it as a detached
run, or end it INTERRUPTED with its TurnEnd stored when it cannot be recovered.

:meth:`TurnEngine.recover <turnwire_server.engine.engine.TurnEngine.recover>` claims the turns
and calls :func:`recover_turn` for each.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
from collections.abc import Awaitable, Callable

from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.budgets import abandoned_charge
from turnwire_server.engine.errors import RequestIdInUse, ServerRestarted, ShuttingDown
from turnwire_server.engine.events import DetachedResponse
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.settings import EngineSettings
from turnwire_server.engine.stream_log import RECOVERY_SEQUENCE_GAP
from turnwire_server.engine.transcript import mark_unknown_starts, repair_unresolved_tool_calls
from turnwire_server.engine.turn_base import ErrorStatus, Recovery
from turnwire_server.engine.turn_spec import parse_spec
from turnwire_server.store.base import EngineStore
from turnwire_server.store.records import TurnRecord

log = logging.getLogger("turnwire.engine")

StartRecovery = Callable[[TurnRequest, Recovery, int], Awaitable[object]]
"""Starts a recovery run: its request, its :class:`Recovery`, its stream's last sequence number
(``TurnEngine.start``, detached; raises what that raises)."""


async def recover_turn(
    turn: TurnRecord,
    resume: bool,
    *,
    store: EngineStore,
    settings: EngineSettings,
    slots: asyncio.Semaphore,
    error_status: ErrorStatus,
    start: StartRecovery,
) -> None:
    """Recover one ``turn`` this replica claimed (see ``TurnEngine.recover``): with ``resume`` and
    budget left, a recovery run ``start`` starts (its count stored first; put back when ``start``
    refuses it), ``slots`` bounding how many run their steps at once; else its end stored
    INTERRUPTED with its TurnEnd (its status by ``error_status``). Raises :class:`StoreError`
    when the store fails before its run started, and what ``start`` raises
    (:class:`RequestIdInUse`, :class:`ShuttingDown`)."""
    messages = await store.load_messages(turn.conversation_id)
    stored = next((m for m in messages if m.id == turn.assistant_message_id), None)
    problem = unrecoverable(turn, resume, settings)
    spec = parse_spec(turn.spec or "") if problem is None else None
    reply = None
    if stored is not None:
        reply = message_pb2.Message()  # the store's messages are shared: repair a copy
        reply.CopyFrom(stored)
        # A recovery decides its calls without a result once it knows their tools
        # (interrupted_calls); a turn left interrupted gives them their interrupted result.
        repair_unresolved_tool_calls([reply], keep_runnable=spec is not None)
        if spec is not None and not spec.tool_starts:
            mark_unknown_starts(reply)
        if not any(p.WhichOneof("kind") != "step_start" for p in reply.parts):
            reply = None
    stream = await store.get_stream(turn.request_id)
    last_sequence = stream.last_sequence_number if stream is not None else 0
    if spec is not None:
        record = dataclasses.replace(turn, recovery_count=turn.recovery_count + 1)
        await store.finish_turn(record, reply)
        request = TurnRequest(
            conversation_id=turn.conversation_id,
            request_id=turn.request_id,
            messages=[],
            body=spec.body,
            model=turn.model,
            continuation=True if reply is not None else spec.continuation,
            response_type=DetachedResponse,
            disconnect="continue",
            client_tools=spec.client_tools,
            entry="recovery",
            trace_context=spec.trace_context,
            principal=spec.principal,
            subagent_path=spec.subagent_path,
            budget=spec.budget,
            legacy_call_keys=spec.call_keys == 1,
        )
        recovery = Recovery(record, reply, attempt=record.recovery_count + 1, slots=slots)
        try:
            await start(request, recovery, last_sequence)
        except (RequestIdInUse, ShuttingDown):
            # Refused for now, nothing run: not counted (docs/semantics.md §8); the turn,
            # not run here, is given up and claimed again (release_orphaned).
            await recovery.uncount(store)
            raise
        log.warning(
            "recovering turn %s of conversation %s (recovery %d of %d, %s)",
            turn.request_id,
            turn.conversation_id,
            record.recovery_count,
            settings.durability.recovery_budget,
            "continuing its reply" if reply is not None else "re-running it",
            extra=_ids(turn),
        )
        return
    assert problem is not None  # no spec: not recoverable
    error = error_status(problem, "turn")
    record = dataclasses.replace(
        turn, state="interrupted", end_time=dt.datetime.now(dt.UTC), error=error.SerializeToString()
    )
    end = event_pb2.TurnEvent(
        conversation_id=turn.conversation_id,
        request_id=turn.request_id,
        sequence_number=last_sequence + RECOVERY_SEQUENCE_GAP,
    )
    end.turn_end.status = event_pb2.TURN_STATUS_INTERRUPTED
    end.turn_end.error.CopyFrom(error)
    if reply is not None:
        end.turn_end.message.CopyFrom(reply)
    # Its TurnEnd with its end state, in one transaction (docs/semantics.md §8), which settles
    # what its lost attempts left reserved too: a crash after this write leaves none held.
    await store.finish_turn(
        record,
        reply,
        events=[(end.sequence_number, end.SerializeToString())],
        stream_ended=True,
        budget=abandoned_charge(record),
    )
    log.warning(
        "turn %s of conversation %s left interrupted: %s",
        turn.request_id,
        turn.conversation_id,
        problem,
        extra=_ids(turn),
    )


def _ids(turn: TurnRecord) -> dict[str, str]:
    """The log fields naming ``turn`` (docs/operate/logs.md): this runs in the replica's claim
    loop, outside any call or turn, so the context ids are not set."""
    return {"conversation_id": turn.conversation_id, "request_id": turn.request_id}


def unrecoverable(turn: TurnRecord, resume: bool, settings: EngineSettings) -> ServerRestarted | None:
    """Why ``turn`` cannot be recovered under ``settings`` (``resume`` False: recovery on start
    is off), or None when it can."""
    if not resume:
        return ServerRestarted("recovery on start is off (durability.recover_on_start)")
    if turn.recovery_count >= settings.durability.recovery_budget:
        return ServerRestarted(
            f"its recovery budget of {settings.durability.recovery_budget} is spent "
            "(durability.recovery_budget)",
            exhausted=True,
        )
    if turn.spec is None:
        return ServerRestarted("it was stored by a version without recovery data")
    try:
        parse_spec(turn.spec)
    except ValueError as error:
        return ServerRestarted(f"its recovery data cannot be read: {error}")
    return None
