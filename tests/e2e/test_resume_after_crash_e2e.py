"""A completed turn can always be resumed, even when the sidecar dies right after its TurnEnd
was sent (docs/semantics.md §8, resumable streams; issue 32 item 10).

A test middleware (``support.hooks:HoldStoreAfterResponse``) takes the store's write lock in
``on_chat_response``, so nothing the sidecar writes after that hook commits; the TurnEnd is
sent after it, and the test SIGKILLs the sidecar as soon as it has the TurnEnd. The restarted
sidecar's ResumeTurn must give every event the caller saw, the TurnEnd byte for byte the one it
got, for a turn of many checkpoint batches and for one shorter than a single batch interval, on
SQLite and PostgreSQL.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.hooks import pythonpath_env
from support.sidecar import DB_FILE_NAME, SidecarFactory
from support.stores import postgres_database

from turnwire_client import TurnwireClient
from turnwire_client.v1 import event_pb2

WORDS = [f"w{i}" for i in range(120)]
HOLD = "r-hold-"


def config(store_url: str) -> dict[str, object]:
    return {
        "providers": {
            "scripted": {
                "scripts": {
                    # 120 words, 8 ms before each: 126 events over about a second, so many
                    # checkpoint batches (50 ms) are stored before the end.
                    "long": [{"text": " ".join(WORDS), "delay_ms": 8}],
                    # Over long before one checkpoint interval (10 s): nothing batched before the end.
                    "short": [{"text": "Noted."}],
                }
            }
        },
        "middleware": [
            {"path": "support.hooks:HoldStoreAfterResponse", "options": {"url": store_url, "prefix": HOLD}}
        ],
        "durability": {"recover_on_start": False},
    }


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / DB_FILE_NAME}"
        return
    with postgres_database() as url:
        yield url


@pytest.mark.parametrize(("script", "interval_ms"), [("long", 50), ("short", 10_000)])
async def test_a_turn_killed_right_after_its_turn_end_resumes_with_every_event(
    sidecar_factory: SidecarFactory, store_url: str, script: str, interval_ms: int
) -> None:
    settings = config(store_url) | {"checkpoint": {"interval_ms": interval_ms}}
    request_id = f"{HOLD}{script}"
    first = await sidecar_factory(settings, env=pythonpath_env(), store_url=store_url).start()
    async with TurnwireClient(first.target) as client:
        seen = [
            event
            async for event in client.chat(
                "crash", "tell me", request_id=request_id, model=f"scripted:{script}"
            )
        ]
        assert seen[-1].HasField("turn_end"), first.log_text()
        first.kill()  # right after the TurnEnd: nothing written after on_chat_response landed
    assert first.returncode == -signal.SIGKILL
    assert seen[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED
    if script == "long":
        # Every word, in enough events to span several checkpoints; a reader that fell behind (a
        # loaded CI) may get adjacent deltas merged (docs/semantics.md §10), so not one event each.
        assert "".join(e.text_delta.delta for e in seen if e.HasField("text_delta")).split() == WORDS
        assert len(seen) > len(WORDS) // 2, [e.WhichOneof("event") for e in seen]

    second = await sidecar_factory(settings, env=pythonpath_env(), store_url=store_url).start()
    async with TurnwireClient(second.target) as client:
        resumed = [event async for event in client.resume_turn(request_id, timeout=30)]
        assert [e.SerializeToString() for e in resumed] == [e.SerializeToString() for e in seen]
        # From the middle too: the rest, ending with the identical TurnEnd.
        middle = seen[len(seen) // 2].sequence_number
        rest = [event async for event in client.resume_turn(request_id, middle, timeout=30)]
        assert rest == seen[len(seen) // 2 + 1 :]
        stored = await client.get_conversation("crash")
        assert stored.messages[-1] == seen[-1].turn_end.message
    assert await second.terminate() == 0, second.log_text()
