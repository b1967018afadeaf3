"""Many conversations through a real ``turnwire serve`` on a small ``memory.cache_bytes`` (issue 32,
item 11: memory bounded in bytes).

The reduced form of ``bench/memory_soak.py``: conversations one after another, each a few turns,
the user messages mixed 150-byte and 4 KiB, on a budget far smaller than what they would hold.
What the caches counted (``turnwire_cache_bytes`` on ``/metrics``) stays within the budget once it
has filled, and the first conversation, long evicted, still has its whole history, in the store and
in its next turn. An RSS figure is the benchmark's (``bench/memory_soak.md``), not a test's.

Sized for CI: 120 conversations of 2 turns on 256 KiB. ``TURNWIRE_STRESS_SCALE=10``: 1,200
conversations.
"""

from __future__ import annotations

import asyncio
import os
import re
import urllib.request

from support.sidecar import SidecarFactory, free_port
from support.waiting import wait_until

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2

SCALE = max(1, int(os.environ.get("TURNWIRE_STRESS_SCALE", "1")))
CONVERSATIONS = 120 * SCALE
TURNS = 2
CLIENTS = 6
BUDGET_BYTES = 256 << 10
_SAMPLE = re.compile(r"^(turnwire_cache_bytes|turnwire_cache_limit_bytes) (\S+)$", re.MULTILINE)


def _text(conversation: int, turn: int) -> str:
    size = 4096 if (conversation + turn) % 3 == 0 else 150
    return (f"[{conversation}:{turn}] " + "w" * size)[:size]


def _scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {name: float(value) for name, value in _SAMPLE.findall(text)}


async def test_the_caches_stay_within_their_byte_budget_over_many_conversations(
    sidecar_factory: SidecarFactory,
) -> None:
    metrics_port = free_port()
    config = {
        "default_model": "scripted:reply",
        "providers": {"scripted": {"scripts": {"reply": [{"text": "noted, thanks", "repeat": True}]}}},
        "memory": {"cache_bytes": BUDGET_BYTES},
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
        "tools": {"demo": False},
    }
    sidecar = await sidecar_factory(config=config).start()
    numbers = iter(range(CONVERSATIONS))
    peak = 0.0

    async def client_loop(client: TurnwireClient) -> None:
        nonlocal peak
        for number in numbers:
            for turn in range(TURNS):
                end = await collect(client.chat(f"soak-{number}", _text(number, turn)))
                assert end.status == event_pb2.TURN_STATUS_COMPLETED, end
            if number % 20 == 19:
                figures = await asyncio.to_thread(_scrape, metrics_port)
                peak = max(peak, figures["turnwire_cache_bytes"])

    async with TurnwireClient(sidecar.target) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(CLIENTS)))
        figures = await asyncio.to_thread(_scrape, metrics_port)
        assert figures["turnwire_cache_limit_bytes"] == BUDGET_BYTES
        # The budget filled (what the conversations hold is many times it), and never overflowed.
        assert BUDGET_BYTES // 2 <= figures["turnwire_cache_bytes"] <= BUDGET_BYTES
        assert peak <= BUDGET_BYTES

        # The first conversation left the caches long ago: its history is whole all the same.
        first = await client.get_conversation("soak-0")
        assert [m.role for m in first.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT] * TURNS
        assert [m.parts[0].text.text for m in first.messages[::2]] == [_text(0, t) for t in range(TURNS)]
        end = await collect(client.chat("soak-0", "and once more"))
        assert end.status == event_pb2.TURN_STATUS_COMPLETED
        again = await client.get_conversation("soak-0")
        assert len(again.messages) == 2 * TURNS + 2
        await wait_until(
            lambda: _scrape(metrics_port)["turnwire_cache_bytes"] <= BUDGET_BYTES,
            what="the budget to hold after the evicted conversation came back",
        )
