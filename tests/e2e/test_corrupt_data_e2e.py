"""A stored message that cannot be decoded is a server-side fault, never a retryable UNAVAILABLE.

Before: a message that could not be decoded made GetConversation and every later turn answer
UNAVAILABLE STORE_UNAVAILABLE with a retry hint, so clients retried forever
(docs/semantics.md §11: readable back, always).
"""

from __future__ import annotations

import sqlite3

import grpc
from google.rpc import error_details_pb2
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, TurnwireError, collect


async def test_an_undecodable_stored_message_is_internal_data_corrupted(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory().start()
    async with TurnwireClient(sidecar.target) as client:
        assert (await collect(client.chat("c1", "hello"))).status_name == "COMPLETED"
    await sidecar.terminate()
    with sqlite3.connect(sidecar.db_path) as db:
        db.execute("UPDATE parts SET data = x'ffffffff' WHERE message_id LIKE 'tw-a-%'")
    restarted = await sidecar_factory().start()
    async with TurnwireClient(restarted.target) as client:
        try:
            await client.get_conversation("c1")
        except TurnwireError as error:
            assert error.code == grpc.StatusCode.INTERNAL
            assert error.reason == "DATA_CORRUPTED"
            assert error.status is not None
            assert not any(d.Is(error_details_pb2.RetryInfo.DESCRIPTOR) for d in error.status.details)
        else:
            raise AssertionError("a corrupt message was read back without an error")
