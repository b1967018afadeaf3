"""A request over the sidecar's ``limits.max_receive_message_bytes`` ends at once with
``RESOURCE_EXHAUSTED`` in the Python client, whatever its size, and the channel serves the next
call (issue 32 item 14: the TypeScript client hung on some sizes, ``clients/node/tests/
oversized_requests.test.mjs``; the Go client's case is ``clients/go/turnwire/oversized_test.go``).
The Python client never hung: this pins that it stays so, on the sizes the TypeScript client hung
on and past its 16 MiB default."""

from __future__ import annotations

import grpc
import pytest
from support.sidecar import SidecarFactory

from turnwire_client import SyncTurnwireClient, TurnwireClient, TurnwireError, collect

LIMIT = 1 << 20


async def test_a_request_over_the_sidecar_limit_ends_resource_exhausted(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory(
        {"limits": {"max_receive_message_bytes": LIMIT, "max_message_bytes": LIMIT}}
    ).start()
    async with TurnwireClient(sidecar.target) as client:
        for size in (2_000_000, 15_000_000, 20 << 20):
            with pytest.raises(TurnwireError) as raised:
                await collect(client.chat("oversized", "y" * size, timeout=60))
            assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, raised.value
            assert "larger than max" in raised.value.message
            assert (await collect(client.chat("oversized-after", "hello", timeout=60))).ok
    with SyncTurnwireClient(sidecar.target) as sync_client:
        with pytest.raises(TurnwireError) as raised:
            sync_client.chat("oversized", "y" * 15_000_000, timeout=60).collect()
        assert raised.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED, raised.value


async def test_a_reply_longer_than_the_receive_limit_is_sent_whole(sidecar_factory: SidecarFactory) -> None:
    """The receive limit bounds requests, not what the sidecar sends: a reply of 200 KB under a
    64 KiB limit streams, ends COMPLETED with the whole reply in its TurnEnd, and reads back
    (before: RESOURCE_EXHAUSTED at the TurnEnd, and on GetConversation)."""
    text = " ".join(["word"] * 40_000)
    sidecar = await sidecar_factory(
        {
            "limits": {"max_receive_message_bytes": 64 << 10, "max_message_bytes": 64 << 10},
            "providers": {"scripted": {"scripts": {"long": [{"text": text, "chunk_size": 50_000}]}}},
        }
    ).start()
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("long-reply", "write a lot", model="scripted:long", timeout=60))
        assert result.ok, result.error
        assert result.text == text
        stored = await client.get_conversation("long-reply")
        assert "".join(p.text.text for p in stored.messages[-1].parts) == text
