"""Re-attaching again and again to running turns: every event exactly once, in order.

Several turns run at once with disconnect policy CONTINUE. Each caller reads a random number
of events, hangs up, re-attaches with ResumeTurn from the last number it saw, and repeats until
the TurnEnd (docs/semantics.md §8). A reader that falls behind the live turn is
tests/test_durable_engine.py's. Checked per turn: sequence numbers 1..n without gap or repeat, the text
rebuilt from the deltas equals the script's, and it equals the stored reply's.

Size: ``TURNWIRE_STRESS_SCALE`` (default 1: 6 turns of 300 deltas).
"""

from __future__ import annotations

import asyncio
import os
import random

from support.seeds import stress_seed
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient
from turnwire_client.v1 import event_pb2

SCALE = int(os.environ.get("TURNWIRE_STRESS_SCALE", "1"))
TURNS = 6 * SCALE
WORDS = [f"t{i}" for i in range(300)]
CONFIG = {
    "providers": {"scripted": {"scripts": {"long": [{"text": " ".join(WORDS), "delay_ms": 1}]}}},
    "limits": {"stream_buffer_events": 16},
    "checkpoint": {"interval_ms": 20},
}


async def _one(client: TurnwireClient, number: int, rng: random.Random) -> list[event_pb2.TurnEvent]:
    request_id = f"r-{number}"
    events: list[event_pb2.TurnEvent] = []
    stream = client.chat(
        f"c-{number}", "go", request_id=request_id, model="scripted:long", disconnect="continue"
    )
    while True:
        budget = rng.randint(1, 60)
        async with stream:
            async for event in stream:
                events.append(event)
                budget -= 1
                if event.HasField("turn_end") or budget == 0:
                    break
        if events and events[-1].HasField("turn_end"):
            return events
        stream = client.resume_turn(request_id, events[-1].sequence_number if events else 0)


async def test_reattaching_repeatedly_yields_every_event_exactly_once(
    sidecar_factory: SidecarFactory,
) -> None:
    seed = stress_seed()
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        results = await asyncio.gather(*(_one(client, n, random.Random(seed + n)) for n in range(TURNS)))
        for number, events in enumerate(results):
            numbers = [e.sequence_number for e in events]
            assert numbers == list(range(1, len(events) + 1)), f"seed {seed}: turn {number}: {numbers}"
            end = events[-1].turn_end
            assert end.status == event_pb2.TURN_STATUS_COMPLETED, f"seed {seed}: {end}"
            text = "".join(e.text_delta.delta for e in events if e.HasField("text_delta"))
            assert text == " ".join(WORDS), f"seed {seed}: turn {number} text differs"
            stored = await client.get_conversation(f"c-{number}")
            assert stored.messages[1] == end.message
    assert await sidecar.terminate() == 0, sidecar.log_text()
