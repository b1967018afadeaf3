"""Streaming one turn to a caller: admission errors as call statuses, the turn's responses, and
the disconnect policy. Shared by the turn-running RPCs of
:class:`~turnwire_server.api.chat_service.ChatService` and its mixins."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Literal

import grpc
from grpc_status import rpc_status
from opentelemetry import propagate

from turnwire.hooks import ConcurrentInputStrategy
from turnwire_client.metadata import EVENT_BATCHES_METADATA, PARENT_REQUEST_METADATA
from turnwire_client.v1 import chat_service_pb2, event_pb2
from turnwire_server.api.progress import Heartbeat, Silence
from turnwire_server.api.status import TurnwireStatusError, status_error_of
from turnwire_server.api.tenancy import listing_prefix, scoped_key
from turnwire_server.engine import TurnHandle
from turnwire_server.engine.errors import AdmissionRefused
from turnwire_server.engine.request import TurnEntry
from turnwire_server.engine.stream_log import event_bytes
from turnwire_server.providers.registry import UnknownModel
from turnwire_server.store.errors import StoreError

_ENTRIES: dict[Any, TurnEntry] = {
    chat_service_pb2.ChatResponse: "chat",
    chat_service_pb2.SaveMessagesResponse: "save_messages",
    chat_service_pb2.ContinueLastTurnResponse: "continue",
    chat_service_pb2.SubmitToolResultsResponse: "tool_results",
    chat_service_pb2.SubmitToolApprovalsResponse: "tool_approvals",
}


def entry_of(response_type: Callable[[], Any]) -> TurnEntry:
    """How a turn streamed as ``response_type`` (an RPC's response class) came in."""
    return _ENTRIES[response_type]


BATCH_MAX_EVENTS = 64
"""The most events one message of an event batch holds (docs/semantics.md §10)."""

BATCH_MAX_BYTES = 256 * 1024
"""The most bytes of events one message of an event batch holds (one larger event goes alone):
far under gRPC's default 4 MiB limit on the messages a client receives."""


Started = TurnHandle | Sequence[Any]
"""What a ``start`` function gives :func:`stream_turn`: a started turn, or the complete list of
responses of a call that runs no turn (a SKIPPED answer built by the API)."""


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: TurnwireStatusError) -> None:
    """End the call with ``error``'s status and its google.rpc details."""
    await context.abort_with_status(rpc_status.to_status(error.to_status()))


async def stream_turn(
    context: grpc.aio.ServicerContext[Any, Any],
    start: Callable[[], Awaitable[Started]],
    progress_interval: float = 0.0,
    batch_bytes: int = BATCH_MAX_BYTES,
) -> AsyncIterator[Any]:
    """Admit a turn with ``start`` and yield its responses.

    A refusal before the turn starts ends the call with its status and
    details: at admission (a domain or store error raised by ``start``), or
    when the turn fails before its input is stored (an id conflict, an answered
    message, the store unavailable). The client going away (cancel, deadline)
    cancels the turn, which stores its partial reply on its own task, unless the
    request's disconnect policy is CONTINUE: then the turn finishes without it. The
    channel is iterated directly: one generator less per event. ``progress_interval``
    (seconds, ``limits.progress_interval_seconds``; 0: off) is the silence after which a
    Progress keepalive is sent (:class:`~turnwire_server.api.progress.Heartbeat`). When ``start``
    returns a list of responses instead of a turn, they are sent as they are. A caller that asked
    for event batches (:func:`wants_batches`) gets the events ready at once in one response, at
    most :data:`BATCH_MAX_EVENTS` and ``batch_bytes`` of them (docs/semantics.md §10).
    """
    try:
        started = await start()
    except (TurnwireStatusError, AdmissionRefused, UnknownModel, StoreError) as error:
        await abort(context, status_error_of(error))
        return
    if not isinstance(started, TurnHandle):
        for response in started:
            yield response
        return
    handle = started
    heartbeat = _heartbeat(handle, progress_interval)
    response_type: Any = handle.run.request.response_type
    batched = wants_batches(context)
    try:
        first = True
        last = 0
        batches = handle.channel.batches(BATCH_MAX_EVENTS if batched else 1, batch_bytes, event_bytes)
        async for ready in batches:
            batch = ready
            if heartbeat is not None:
                if not batch[0].event.sequence_number:
                    # A Progress keepalive: not part of the turn's stream; sent alone.
                    if heartbeat.fresh():
                        yield batch[0]
                    batch = batch[1:]
                batch = _turn_events(heartbeat, batch)
                if not batch:
                    continue
            response = batch[0]
            event = response.event
            if first:
                first = False
                if event.HasField("turn_end") and event.turn_end.status == event_pb2.TURN_STATUS_ERROR:
                    # Failed before its input was stored (no TurnStart): the request was refused,
                    # so the call ends with that status, as every refusal does.
                    await context.abort_with_status(rpc_status.to_status(event.turn_end.error))
            if len(batch) > 1:
                response = _joined(response_type, batch)
                event = response.more_events[-1]
            last = event.sequence_number
            yield response
        if handle.channel.detached_by is not None:
            # Too slow a reader of a CONTINUE turn: the turn goes on, this call ends.
            await abort(context, _let_go(handle.request_id, last, handle.channel.detached_by))
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        handle.release()  # cancels the turn, or lets it go on (disconnect policy CONTINUE)


def wants_batches(context: grpc.aio.ServicerContext[Any, Any]) -> bool:
    """Whether the caller asked for event batches (``turnwire-event-batches: 1`` metadata)."""
    for key, value in context.invocation_metadata() or ():
        if key == EVENT_BATCHES_METADATA:
            return value in ("1", b"1")
    return False


def _turn_events(heartbeat: Heartbeat[Any], batch: Sequence[Any]) -> list[Any]:
    """``batch``'s turn events, each one told to ``heartbeat`` (the phase of the next keepalive
    follows all of them, docs/semantics.md §8); a Progress keepalive among them is dropped (queued
    behind turn events: the turn is not silent) and told too, so that a later one is queued."""
    events: list[Any] = []
    for response in batch:
        if response.event.sequence_number:
            heartbeat.took(response.event)
            events.append(response)
        else:
            heartbeat.fresh()
    return events


def _joined(response_type: Callable[[], Any], batch: Sequence[Any]) -> Any:
    """One response of ``batch``'s turn events, the first as its ``event``, the rest as
    ``more_events``. Copies: the stream log and live ResumeTurn readers share the responses."""
    joined = response_type()
    joined.event.CopyFrom(batch[0].event)
    more = joined.more_events
    for response in batch[1:]:
        more.add().CopyFrom(response.event)
    return joined


def _heartbeat(handle: TurnHandle, interval: float) -> Heartbeat[Any] | None:
    if interval <= 0:
        return None
    response_type: Any = handle.run.request.response_type
    return Heartbeat(
        handle.channel,
        interval,
        Silence(handle.conversation_id, handle.request_id),
        lambda event: response_type(event=event),
    )


def _let_go(request_id: str, last: int, why: BaseException) -> TurnwireStatusError:
    return TurnwireStatusError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"{why}; the turn goes on without this call (disconnect policy CONTINUE): re-attach with "
        f"ResumeTurn(request_id={request_id!r}, after_sequence_number={last})",
        reason="SLOW_CONSUMER",
        metadata={"request_id": request_id, "after_sequence_number": str(last)},
    )


def disconnect_of(policy: int) -> Literal["cancel", "continue"]:
    """The engine's disconnect policy for a request's ``DisconnectPolicy`` (unset: cancel)."""
    return "continue" if policy == chat_service_pb2.DISCONNECT_POLICY_CONTINUE else "cancel"


_STRATEGIES: dict[int, ConcurrentInputStrategy] = {
    chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ENQUEUE: "enqueue",
    chat_service_pb2.CONCURRENT_INPUT_STRATEGY_REJECT: "reject",
    chat_service_pb2.CONCURRENT_INPUT_STRATEGY_INTERRUPT: "interrupt",
    chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ROLLBACK: "rollback",
}


def strategy_of(strategy: int) -> ConcurrentInputStrategy | None:
    """The engine's concurrent-input strategy for a request's ``ConcurrentInputStrategy`` (unset or
    unknown: None, the configured default)."""
    return _STRATEGIES.get(strategy)


def parent_request_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The request id in the call's ``turnwire-parent-request-id`` metadata ("" when absent):
    the turn a nested call comes from (docs/semantics.md §5), as the caller's store key (the
    sidecar sends tools and hooks the key, api/tenancy.py; a client's own id is scoped)."""
    parent = ""
    for key, value in context.invocation_metadata() or ():
        if key == PARENT_REQUEST_METADATA:
            parent = value if isinstance(value, str) else value.decode()
    # A tool or hook forwards the id the sidecar sent it, which is already the store key.
    return parent if parent.startswith(listing_prefix()) else scoped_key(parent)


def trace_context(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
    """The call's trace context: the metadata the configured propagators read (W3C ``traceparent``
    and ``tracestate``, and ``baggage``, by default; ``OTEL_PROPAGATORS`` changes them), for the
    turn's span to continue the caller's trace. Empty when the caller sent none."""
    fields = propagate.get_global_textmap().fields
    carrier: dict[str, str] = {}
    for key, value in context.invocation_metadata() or ():
        if key in fields:
            carrier[key] = value if isinstance(value, str) else value.decode()
    return carrier
