"""SIGKILL at random points of a turn, many rounds on one database: no acknowledged message is
lost or duplicated, every turn left running is recovered (within its budget) and ends after a
restart (docs/semantics.md §5 and §8).

Each round starts the server (which recovers what the previous round's crash left), sends one
message with a client-chosen id, reads the stream up to a random point (the start event, a text
delta, a tool call starting, a tool result, a step's end, or the terminal event) and SIGKILLs the
server there. A message counts as acknowledged once its turn's start event was received.

Before: the start event was sent before the user message was stored, so a kill right after it
lost the acknowledged message in most trials.

Size: ``TURNWIRE_STRESS_SCALE`` (default 1: 15 rounds).
"""

from __future__ import annotations

import os
import random
import sqlite3
from collections import Counter

import grpc
from support.seeds import stress_seed
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc

SCALE = int(os.environ.get("TURNWIRE_STRESS_SCALE", "1"))
ROUNDS = 15 * SCALE
KILL_POINTS = (
    "turn_start",
    "text_delta",
    "tool_input_start",
    "tool_output_available",
    "step_finish",
    "turn_end",
)
CONFIG = {
    "providers": {
        "scripted": {
            "scripts": {
                "work": [
                    {
                        "text": "Let me compute that for you.",
                        "tool_calls": [{"name": "calculator", "input": {"expression": "6 * 7"}}],
                        "delay_ms": 3,
                    },
                    {"text": "The answer is forty-two, as computed.", "delay_ms": 3},
                ]
            }
        }
    },
}


async def test_sigkill_at_random_points_loses_no_acknowledged_message(
    sidecar_factory: SidecarFactory,
) -> None:
    seed = stress_seed()
    rng = random.Random(seed)
    acknowledged: list[tuple[str, str]] = []  # (conversation, message id)
    sent: list[tuple[str, str]] = []
    db_path = None
    for number in range(ROUNDS):
        sidecar = await sidecar_factory(CONFIG).start()
        db_path = sidecar.db_path
        conversation, message_id = f"c{number % 3}", f"m{number}"
        kill_at = rng.choice(KILL_POINTS)
        request = chat_service_pb2.ChatRequest(conversation_id=conversation, model="scripted:work")
        request.message.id = message_id
        request.message.parts.add().text.text = f"question {number}"
        sent.append((conversation, message_id))
        async with grpc.aio.insecure_channel(sidecar.target) as channel:
            stub = chat_service_pb2_grpc.ChatServiceStub(channel)
            async for response in stub.Chat(request):
                kind = response.event.WhichOneof("event")
                if kind == "turn_start":
                    acknowledged.append((conversation, message_id))
                if kind == kill_at:
                    break
            sidecar.kill()

    final = await sidecar_factory(CONFIG).start()  # recovers the last round's crash
    assert db_path is not None

    def running_turns() -> list[tuple[str, int]]:
        with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
            return db.execute(
                "SELECT request_id, recovery_count FROM turns WHERE state = 'running'"
            ).fetchall()

    # Recoveries run in the background after the start; each finishes its answer.
    await wait_until(lambda: not running_turns(), timeout=30, what="the recovered turns end")
    async with TurnwireClient(final.target) as client:
        stored: dict[str, list[str]] = {}
        for conversation in {c for c, _ in sent}:
            history = await client.get_conversation(conversation)
            stored[conversation] = [m.id for m in history.messages]
    for conversation, message_id in acknowledged:
        assert message_id in stored[conversation], f"seed {seed}: acknowledged {message_id} was lost"
    for conversation, ids in stored.items():
        duplicated = [i for i, n in Counter(ids).items() if n > 1]
        assert not duplicated, f"seed {seed}: {conversation} stores {duplicated} more than once"
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        budget_spent = db.execute("SELECT request_id FROM turns WHERE recovery_count > 2").fetchall()
    assert not budget_spent, f"seed {seed}: turns recovered past the budget: {budget_spent}"
    assert acknowledged, "no round got as far as the start event"
