"""Streaming a re-attached turn (ResumeTurn, WatchSubmission) with errors as call statuses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_status import rpc_status

from turnwire_client.v1 import event_pb2
from turnwire_server.api.progress import Silence, keepalive
from turnwire_server.api.status import status_error_of
from turnwire_server.engine.errors import TurnNotHere, TurnStreamNotFound
from turnwire_server.store.errors import StoreError


async def replay_stream(
    events: AsyncIterator[event_pb2.TurnEvent],
    context: grpc.aio.ServicerContext[Any, Any],
    *,
    progress_interval: float = 0.0,
    silence: Silence | None = None,
) -> AsyncIterator[event_pb2.TurnEvent]:
    """Yield ``events``; a missing or expired stream (NOT_FOUND), a turn not running here
    (UNAVAILABLE) or a store failure ends the call with its status and google.rpc details,
    also after some events were sent. The client going away stops reading; it never
    affects the turn. With ``progress_interval`` (seconds; 0: off) and ``silence`` (the turn's
    ids) a silent stream gets Progress keepalives (:mod:`turnwire_server.api.progress`)."""
    if progress_interval > 0 and silence is not None:
        events = keepalive(events, progress_interval, silence, event_of=_same, wrap=_same)
    try:
        async for event in events:
            yield event
    except (TurnStreamNotFound, TurnNotHere, StoreError) as error:
        await context.abort_with_status(rpc_status.to_status(status_error_of(error).to_status()))


def _same(event: event_pb2.TurnEvent) -> event_pb2.TurnEvent:
    return event
