"""Leaving a turn's stream early cancels the turn, through the Python client and a real server.

Before: ``async for event in client.chat(...): break`` left the turn running and the provider
streaming, although the docstring promised that leaving the iteration cancels the call.
"""

from __future__ import annotations

import asyncio

import pytest
from support.endless import endless_step, is_prefix_of_repeats
from support.sidecar import SidecarFactory
from support.waiting import wait_until

from turnwire_client import SyncTurnwireClient, TurnwireClient
from turnwire_client.sync_stream import SyncTurnStream
from turnwire_client.v1 import event_pb2, message_pb2

WORDS = "".join(f"w{i} " for i in range(100))
# The reply streams WORDS again and again until its turn is cancelled: it never ends on its own.
CONFIG = {
    "providers": {
        "scripted": {
            "strict": True,
            "scripts": {"long": [endless_step(WORDS, 50)]},
        }
    }
}


async def _aborted_reply_text(client: TurnwireClient, conversation_id: str) -> str | None:
    """The stored reply's text once its turn ended ABORTED; None before."""
    conversation = await client.get_conversation(conversation_id)
    if [reply.status for reply in conversation.partial_replies] != [event_pb2.TURN_STATUS_ABORTED]:
        return None
    reply = conversation.messages[-1]
    assert reply.role == message_pb2.ROLE_ASSISTANT
    return "".join(p.text.text for p in reply.parts if p.WhichOneof("kind") == "text")


async def _assert_aborted_early(client: TurnwireClient, conversation_id: str) -> None:
    # A cancelled turn stores its partial reply at once; without the cancel it would never end.
    text = await wait_until(
        lambda: _aborted_reply_text(client, conversation_id), timeout=10, what="the turn ended ABORTED"
    )
    assert text is not None and text.startswith("w0 ") and is_prefix_of_repeats(text, WORDS), text


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


async def test_break_cancels_the_turn_of_a_stream_still_referenced(sidecar_factory: SidecarFactory) -> None:
    # The README's guarantee row: `break` cancels, also when the stream is kept in a variable (so
    # it is not dropped). Before, only dropping the stream cancelled: this turn ran on forever.
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        stream = client.chat("kept-break", "go", model="scripted:long")
        async for event in stream:
            if event.WhichOneof("event") == "text_delta":
                break
        await _assert_aborted_early(client, "kept-break")
        assert stream.cancel() is False  # the break ended the call; the stream is still here


async def test_an_exception_out_of_the_loop_cancels_the_turn_of_a_kept_stream(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(CONFIG).start()
    async with TurnwireClient(sidecar.target) as client:
        stream = client.chat("kept-raise", "go", model="scripted:long")
        with pytest.raises(LookupError):
            async for event in stream:
                if event.WhichOneof("event") == "text_delta":
                    raise LookupError("the caller's own error")
        await _assert_aborted_early(client, "kept-raise")
        assert stream.cancel() is False


async def test_break_out_of_the_sync_clients_loop_cancels_the_turn(sidecar_factory: SidecarFactory) -> None:
    sidecar = await sidecar_factory(CONFIG).start()

    def chat_and_break() -> SyncTurnStream:
        with SyncTurnwireClient(sidecar.target) as sync_client:
            stream = sync_client.chat("sync-break", "go", model="scripted:long")
            for event in stream:
                if event.WhichOneof("event") == "text_delta":
                    break
            # Checked before the client closes its channel (which would cancel the call anyway).
            assert stream.cancel() is False, "the break did not end the call"
            return stream

    await asyncio.to_thread(chat_and_break)
    async with TurnwireClient(sidecar.target) as client:
        await _assert_aborted_early(client, "sync-break")
