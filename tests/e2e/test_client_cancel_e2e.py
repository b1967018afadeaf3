"""Leaving a turn's stream early cancels the turn, through the Python client and a real server.

Before: ``async for event in client.chat(...): break`` left the turn running and the provider
streaming, although the docstring promised that leaving the iteration cancels the call.
"""

from __future__ import annotations

from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import TurnwireClient
from turnwire_client.v1 import message_pb2

WORDS = [f"w{i}" for i in range(100)]
CONFIG = {"providers": {"scripted": {"scripts": {"long": [{"text": " ".join(WORDS), "delay_ms": 50}]}}}}


async def _stored_reply_words(client: TurnwireClient, conversation_id: str) -> list[str] | None:
    conversation = await client.get_conversation(conversation_id)
    replies = [m for m in conversation.messages if m.role == message_pb2.ROLE_ASSISTANT]
    if not replies:
        return None
    return "".join(p.text.text for p in replies[-1].parts if p.WhichOneof("kind") == "text").split()


async def _assert_aborted_early(client: TurnwireClient, conversation_id: str) -> None:
    # The 100-word reply takes about 5 s; a cancelled turn stores its partial at once.
    words = await wait_until(
        lambda: _stored_reply_words(client, conversation_id), timeout=3, what="the partial reply is stored"
    )
    assert 0 < len(words) < len(WORDS)


async def test_break_out_of_the_iteration_cancels_the_turn(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        async for event in client.chat("by-break", "go", model="scripted:long"):
            if event.WhichOneof("event") == "text_delta":
                break
        await _assert_aborted_early(client, "by-break")


async def test_leaving_an_async_with_block_cancels_the_turn(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        async with client.chat("by-with", "go", model="scripted:long") as stream:
            async for event in stream:
                if event.WhichOneof("event") == "text_delta":
                    break
        await _assert_aborted_early(client, "by-with")


async def test_an_explicit_cancel_ends_the_stream_and_the_turn(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        stream = client.chat("by-cancel", "go", model="scripted:long")
        async for event in stream:
            if event.WhichOneof("event") == "text_delta":
                assert stream.cancel() is True
                break
        await _assert_aborted_early(client, "by-cancel")
        assert stream.cancel() is False  # already ended
