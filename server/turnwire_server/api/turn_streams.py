"""Streaming one turn to a caller: admission errors as call statuses, the turn's responses, and
the request's ``body`` as JSON. Shared by the turn-running RPCs of
:class:`~turnwire_server.api.chat_service.ChatService` and its mixins."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import grpc
from google.protobuf import struct_pb2
from grpc_status import rpc_status

from turnwire.values import NotJsonError, from_struct, normalize
from turnwire_client.v1 import event_pb2
from turnwire_server.api.status import TurnwireStatusError, invalid_argument, status_error_of
from turnwire_server.engine import TurnHandle
from turnwire_server.engine.errors import AdmissionRefused
from turnwire_server.providers.registry import UnknownModel
from turnwire_server.store.base import StoreError

PARENT_REQUEST_METADATA = "turnwire-parent-request-id"
"""Metadata a hook or tool server sets when it calls back from inside a turn."""

Started = TurnHandle | Sequence[Any]
"""What a ``start`` function gives :func:`stream_turn`: a started turn, or the complete list of
responses of a call that runs no turn (a SKIPPED answer built by the API)."""


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: TurnwireStatusError) -> None:
    """End the call with ``error``'s status and its google.rpc details."""
    await context.abort_with_status(rpc_status.to_status(error.to_status()))


async def stream_turn(
    context: grpc.aio.ServicerContext[Any, Any], start: Callable[[], Awaitable[Started]]
) -> AsyncIterator[Any]:
    """Admit a turn with ``start`` and yield its responses.

    A refusal before the turn starts ends the call with its status and
    details: at admission (a domain or store error raised by ``start``), or
    when the turn fails before its input is stored (an id conflict, an answered
    message, the store unavailable). The client going away (cancel, deadline)
    cancels the turn, which stores its partial reply on its own task. The
    channel is iterated directly: one generator less per event. When ``start``
    returns a list of responses instead of a turn, they are sent as they are.
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
    try:
        first = True
        async for response in handle.channel:
            if first:
                first = False
                event = response.event
                if event.HasField("turn_end") and event.turn_end.status == event_pb2.TURN_STATUS_ERROR:
                    # Failed before its input was stored (no TurnStart): the request was refused,
                    # so the call ends with that status, as every refusal does.
                    await context.abort_with_status(rpc_status.to_status(event.turn_end.error))
            yield response
    finally:
        handle.cancel()


def parent_request_id(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The request id in the call's ``turnwire-parent-request-id`` metadata ("" when absent):
    the turn a nested call comes from (docs/semantics.md §5)."""
    parent = ""
    for key, value in context.invocation_metadata() or ():
        if key == PARENT_REQUEST_METADATA:
            parent = value if isinstance(value, str) else value.decode()
    return parent


def request_body(body: struct_pb2.Struct) -> dict[str, Any]:
    """The request's ``body`` as plain JSON for the hooks. Raises INVALID_ARGUMENT (naming the
    path) for a number JSON has no form for (NaN, Infinity): hooks and the store get JSON only."""
    if not body.ByteSize():
        return {}
    value = from_struct(body)
    try:
        return normalize(value)  # type: ignore[no-any-return]
    except NotJsonError as error:
        path = "body" + error.path.removeprefix("$")
        raise invalid_argument([(path, "NaN and Infinity have no JSON form; send a finite number")]) from None
