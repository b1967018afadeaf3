"""Call / cancel races through a real server: exactly one terminal event, no leaked slot, no turn
left running, and every middleware's ``on_chat_response`` runs (docs/semantics.md §5, Decision:
exactly one terminal event, whatever the timing).

Before: ``Chat`` followed at once by ``CancelChat`` hung about one time in three (a task
cancelled before it first ran skipped every clean-up, leaking the request id and the queue
slot); ``CancelChat`` together with a client cancel left turns ``running`` with their partial
never written; a cancel during ``on_chat_response`` ended the stream without ``TurnEnd`` and
skipped the outer middleware's hook.

Size: ``TURNWIRE_STRESS_SCALE`` (default 1: 120 rounds; ``make stress`` runs more).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import sqlite3
from pathlib import Path

import grpc
from support.hooks import pythonpath_env
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2

SCALE = int(os.environ.get("TURNWIRE_STRESS_SCALE", "1"))
ROUNDS = 120 * SCALE
CONVERSATIONS = 6
MAX_QUEUED = 4
MODES = ("cancel_chat", "client_cancel", "both", "during_response")


def _config(records: Path) -> dict[str, object]:
    return {
        "providers": {"scripted": {"scripts": {"quick": [{"text": "a b c d", "delay_ms": 2}]}}},
        "middleware": [
            {"path": "support.hooks:RecordResponses", "options": {"label": "outer", "path": str(records)}},
            {"path": "support.hooks:SlowResponse", "options": {"seconds": 0.03}},
        ],
        "limits": {"max_queued_turns_per_conversation": MAX_QUEUED},
    }


async def _round(
    stub: chat_service_pb2_grpc.ChatServiceStub, number: int, mode: str
) -> tuple[str, list[event_pb2.TurnEvent] | None]:
    """One call and its cancels; the events it received, or None when the client cancelled."""
    request_id = f"r{number}"
    request = chat_service_pb2.ChatRequest(
        conversation_id=f"c{number % CONVERSATIONS}", request_id=request_id, model="scripted:quick"
    )
    request.message.parts.add().text.text = "go"
    call = stub.Chat(request)
    cancel = chat_service_pb2.CancelChatRequest(request_id=request_id)
    if mode in ("cancel_chat", "both"):
        await stub.CancelChat(cancel)
    if mode in ("client_cancel", "both"):
        call.cancel()
        return request_id, None
    events: list[event_pb2.TurnEvent] = []
    async with asyncio.timeout(20):  # a hang fails here
        async for response in call:
            events.append(response.event)
            if mode == "during_response" and response.event.WhichOneof("event") == "step_finish":
                await stub.CancelChat(cancel)  # lands while on_chat_response runs
    return request_id, events


async def test_call_and_cancel_in_every_order_end_cleanly(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    records = tmp_path / "responses.txt"
    records.touch()
    sidecar = await sidecar_factory(_config(records), env=pythonpath_env()).start()
    async with grpc.aio.insecure_channel(sidecar.target) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        modes = itertools.cycle(MODES)
        results: list[tuple[str, list[event_pb2.TurnEvent] | None]] = []
        for start in range(0, ROUNDS, 12):
            batch = [_round(stub, n, next(modes)) for n in range(start, min(start + 12, ROUNDS))]
            results.extend(await asyncio.gather(*batch))

    for request_id, events in results:
        if events is None:
            continue
        ends = [e for e in events if e.WhichOneof("event") == "turn_end"]
        assert len(ends) == 1 and events[-1] is ends[0], (
            f"{request_id}: {[e.WhichOneof('event') for e in events]}"
        )
        starts = [e for e in events if e.WhichOneof("event") == "turn_start"]
        # TurnStart acknowledges stored input; a turn that never stored it says why at its end.
        assert starts or ends[0].turn_end.error.message.startswith("the turn did not run")

    def still_running() -> list[str]:
        with sqlite3.connect(f"file:{sidecar.db_path}?mode=ro", uri=True) as db:
            return [row[0] for row in db.execute("SELECT request_id FROM turns WHERE state = 'running'")]

    await wait_until(lambda: not still_running(), timeout=10, what="no turn is left running")

    # No queue slot leaked: every conversation still takes MAX_QUEUED turns at once.
    async with TurnwireClient(sidecar.target) as client:
        for conversation in range(CONVERSATIONS):
            finals = await asyncio.gather(
                *(collect(client.chat(f"c{conversation}", "again")) for _ in range(MAX_QUEUED))
            )
            assert all(r.status == event_pb2.TURN_STATUS_COMPLETED for r in finals)

    # Every turn whose reply was stored ran the outer middleware's on_chat_response.
    recorded = {line.split()[1] for line in records.read_text().splitlines()}
    stored_replies = []
    with sqlite3.connect(f"file:{sidecar.db_path}?mode=ro", uri=True) as db:
        for request_id, message_id in db.execute("SELECT request_id, assistant_message_id FROM turns"):
            has_message = db.execute("SELECT 1 FROM messages WHERE id = ?", (message_id,)).fetchone()
            if has_message and request_id.startswith("r"):
                stored_replies.append(request_id)
    missing = sorted(set(stored_replies) - recorded)
    assert not missing, f"on_chat_response of the outer middleware never ran for {missing[:10]}"
    assert "Traceback" not in sidecar.log_text()
