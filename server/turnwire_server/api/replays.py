"""Streaming a re-attached turn (ResumeTurn, WatchSubmission) with errors as call statuses."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_status import rpc_status

from turnwire_client.v1 import event_pb2
from turnwire_server.api.status import status_error_of
from turnwire_server.engine.errors import TurnNotFound, TurnNotHere
from turnwire_server.store.base import StoreError


async def replay_stream(
    events: AsyncIterator[event_pb2.TurnEvent], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[event_pb2.TurnEvent]:
    """Yield ``events``; a missing or expired stream (NOT_FOUND), a turn not running here
    (UNAVAILABLE) or a store failure ends the call with its status and google.rpc details,
    also after some events were sent. The client going away stops reading; it never
    affects the turn."""
    try:
        async for event in events:
            yield event
    except (TurnNotFound, TurnNotHere, StoreError) as error:
        await context.abort_with_status(rpc_status.to_status(status_error_of(error).to_status()))
