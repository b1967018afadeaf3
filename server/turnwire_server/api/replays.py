"""Streaming a re-attached turn (ResumeTurn, WatchSubmission) with errors as call statuses."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import grpc
from grpc_status import rpc_status

from turnwire_client.v1 import event_pb2
from turnwire_server.api.progress import Silence, keepalive
from turnwire_server.api.status import status_error_of
from turnwire_server.api.turn_streams import BATCH_MAX_EVENTS, wants_batches
from turnwire_server.engine.errors import TurnNotHere, TurnStreamNotFound
from turnwire_server.store.errors import StoreError

R = TypeVar("R")

Replay = Callable[[int, int], AsyncIterator[list[event_pb2.TurnEvent]]]
"""A re-attached turn's events in lists of those ready at once, given the most events and bytes
a list may hold (:meth:`~turnwire_server.engine.TurnEngine.replay`'s lists)."""


async def replay_stream(
    replay: Replay,
    context: grpc.aio.ServicerContext[Any, Any],
    response_type: Callable[..., R],
    *,
    batch_bytes: int,
    progress_interval: float = 0.0,
    silence: Silence | None = None,
) -> AsyncIterator[R]:
    """Yield ``replay``'s events as ``response_type`` responses: one event a response, or, for
    a caller that asked for event batches (:func:`~turnwire_server.api.turn_streams.wants_batches`),
    the events ready at once in one response (``more_events``; at most
    :data:`~turnwire_server.api.turn_streams.BATCH_MAX_EVENTS` and ``batch_bytes``,
    docs/semantics.md §10). A missing or expired stream (NOT_FOUND), a turn not running here
    (UNAVAILABLE) or a store failure ends the call with its status and google.rpc details,
    also after some events were sent. The client going away stops reading; it never
    affects the turn. With ``progress_interval`` (seconds; 0: off) and ``silence`` (the turn's
    ids) a silent stream gets Progress keepalives, alone in their responses
    (:mod:`turnwire_server.api.progress`)."""
    batches = replay(BATCH_MAX_EVENTS if wants_batches(context) else 1, batch_bytes)
    if progress_interval > 0 and silence is not None:
        batches = keepalive(batches, progress_interval, silence, events_of=_same, wrap=_alone)
    try:
        async for batch in batches:
            yield response_type(event=batch[0], more_events=batch[1:])
    except (TurnStreamNotFound, TurnNotHere, StoreError) as error:
        await context.abort_with_status(rpc_status.to_status(status_error_of(error).to_status()))


def _same(batch: Sequence[event_pb2.TurnEvent]) -> Sequence[event_pb2.TurnEvent]:
    return batch


def _alone(event: event_pb2.TurnEvent) -> list[event_pb2.TurnEvent]:
    return [event]
