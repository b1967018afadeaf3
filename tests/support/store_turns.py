"""A running turn recorded in a store, for the store tests that end turns (costs, timelines), and
one a crash left running, for the recovery tests."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.engine import TurnRequest
from turnwire_server.engine.turn_spec import spec_json
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


async def crashed_turn(
    store: Store,
    conversation_id: str,
    request_id: str,
    *,
    model: str,
    text: str = "q",
    edit_spec: Callable[[str], str] | None = None,
    principal: str = "",
    owner: str = "",
    recovery_count: int = 0,
) -> TurnRecord:
    """What a process killed mid-turn leaves of turn ``request_id``: running in ``store`` with its
    recovery spec (a plain Chat request's: no body, not a continuation, asked by ``principal``;
    docs/semantics.md §8) and its user message (id ``u-<request_id>``, ``text``) stored; its reply
    id ``tw-a-<request_id>``; held by replica ``owner`` (lease epoch 0), recovered
    ``recovery_count`` times already. ``edit_spec`` changes the spec's JSON text (an older
    sidecar's spec). The caller stores the partial reply it wants the recovery to find."""
    request = TurnRequest(
        conversation_id=conversation_id,
        request_id=request_id,
        messages=[],
        body={},
        model=model,
        continuation=False,
        response_type=chat_service_pb2.ChatResponse,
        principal=principal,
    )
    record = TurnRecord(
        request_id=request_id,
        conversation_id=conversation_id,
        assistant_message_id=f"tw-a-{request_id}",
        continuation=False,
        model=model,
        state="running",
        start_time=dt.datetime.now(dt.UTC),
        spec=(edit_spec or str)(spec_json(request)),
        owner=owner,
        recovery_count=recovery_count,
    )
    user = message_pb2.Message(id=f"u-{request_id}", role=message_pb2.ROLE_USER)
    user.parts.add().text.text = text
    await store.start_turn(record, [user])
    return record
