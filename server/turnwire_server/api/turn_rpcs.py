"""``ListTurns``: a conversation's turns with how each ended, its cost and its timeline
(docs/inspector.md). Read-only; a mixin of :class:`~turnwire_server.api.chat_service.ChatService`.

Tenancy needs nothing here: ``conversation_id`` is scoped on the way in and the turns' ids and
statuses unscoped on the way out (:mod:`turnwire_server.api.tenancy`), so another tenant's
conversation lists no turns, as one that does not exist.
"""

from __future__ import annotations

from typing import Any, Final

import grpc
from google.rpc import status_pb2

from turnwire_client.v1 import chat_service_pb2, event_pb2
from turnwire_server.api.resources import timestamp
from turnwire_server.api.status import (
    TurnwireStatusError,
    invalid_page_token,
    status_error_of,
)
from turnwire_server.api.turn_streams import abort
from turnwire_server.api.validation import check_id, raise_if_any
from turnwire_server.store.base import EngineStore
from turnwire_server.store.errors import InvalidPageToken, StoreError
from turnwire_server.store.records import TurnRecord

_DEFAULT_PAGE_SIZE: Final = 100
_MAX_PAGE_SIZE: Final = 1000

_STATUS: Final[dict[str, event_pb2.TurnStatus.ValueType]] = {
    "running": event_pb2.TURN_STATUS_UNSPECIFIED,
    "completed": event_pb2.TURN_STATUS_COMPLETED,
    "error": event_pb2.TURN_STATUS_ERROR,
    "aborted": event_pb2.TURN_STATUS_ABORTED,
    "interrupted": event_pb2.TURN_STATUS_INTERRUPTED,
    "skipped": event_pb2.TURN_STATUS_SKIPPED,
}


def turn_proto(record: TurnRecord) -> chat_service_pb2.Turn:
    """A stored turn (``Store.list_turns``) as the API's ``Turn``; ``step_models`` from its
    timeline's model spans."""
    turn = chat_service_pb2.Turn(
        request_id=record.request_id,
        conversation_id=record.conversation_id,
        status=_STATUS[record.state],
        start_time=timestamp(record.start_time),
        model=record.model,
        assistant_message_id=record.assistant_message_id,
        continuation=record.continuation,
        recovery_count=record.recovery_count,
    )
    if record.end_time is not None:
        turn.end_time.CopyFrom(timestamp(record.end_time))
    if record.error is not None:
        turn.error.CopyFrom(status_pb2.Status.FromString(record.error))
    if record.cost_usd is not None and record.state != "running":
        turn.cost.usd = record.cost_usd
        turn.cost.price_source = record.cost_source or ""
    if record.timeline is not None:
        turn.timeline.MergeFromString(record.timeline)
        # The models that ran its steps: each model stream that did not fail (a fallback's
        # included; a failed one was refused or replaced), as its span names it.
        ran = (
            span.name
            for span in turn.timeline.spans
            if span.kind == chat_service_pb2.TIMELINE_SPAN_KIND_MODEL and span.outcome != "failed"
        )
        turn.step_models.extend(dict.fromkeys(ran))
    return turn


class TurnRpcs:
    """``ListTurns`` on the servicer's ``store``."""

    store: EngineStore

    async def ListTurns(
        self,
        request: chat_service_pb2.ListTurnsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.ListTurnsResponse:
        """One page of the conversation's turns, most recently started first (AIP-158).
        INVALID_ARGUMENT for a bad id, page size or page token."""
        try:
            violations: list[tuple[str, str]] = []
            check_id(request.conversation_id, "conversation_id", violations, required=True)
            if request.page_size < 0:
                violations.append(("page_size", "must not be negative; 0 means the default of 100"))
            raise_if_any(violations)
            page_size = min(request.page_size or _DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE)
            try:
                records, token = await self.store.list_turns(
                    request.conversation_id, page_size, request.page_token, failed_only=request.failed_only
                )
            except InvalidPageToken:
                raise invalid_page_token("for this listing", "with the same request,") from None
            except StoreError as error:
                raise status_error_of(error) from error
        except TurnwireStatusError as error:
            await abort(context, error)
            raise AssertionError("unreachable") from None
        return chat_service_pb2.ListTurnsResponse(
            turns=[turn_proto(record) for record in records], next_page_token=token
        )
