"""A running turn recorded in a store, for the store tests that end turns (costs, timelines)."""

from __future__ import annotations

import datetime as dt

from turnwire_client.v1 import message_pb2
from turnwire_server.store import Store, TurnRecord

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
"""The first turn's start; turn ``n`` starts ``n`` seconds later."""


async def started_turn(store: Store, conversation_id: str, n: int, *, key_prefix: str = "") -> TurnRecord:
    """Turn ``n`` of ``conversation_id`` started in ``store`` (its user message ``…-u{n}`` stored),
    its request id ``{conversation_id}-r{n}``; ``key_prefix`` (a tenant's ``"t/"``) goes before
    both ids."""
    record = TurnRecord(
        request_id=f"{key_prefix}{conversation_id}-r{n}",
        conversation_id=f"{key_prefix}{conversation_id}",
        assistant_message_id=f"{conversation_id}-a{n}",
        continuation=False,
        model="openai:gpt-4o",
        state="running",
        start_time=T0 + dt.timedelta(seconds=n),
    )
    user = message_pb2.Message(id=f"{conversation_id}-u{n}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = "q"
    await store.start_turn(record, [user])
    return record
