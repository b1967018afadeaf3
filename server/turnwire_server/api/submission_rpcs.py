"""The submission RPCs of ``turnwire.v1.ChatService`` (docs/semantics.md §7).

``SubmitMessages`` validates and durably accepts; ``GetSubmission``, ``ListSubmissions`` and
``CancelSubmission`` read and move the record; ``WatchSubmission`` streams its turn like
``ResumeTurn``. The stored request is the client's, without its submission id and
idempotency key, serialized deterministically: so a repeat with the same content is
recognized whichever of the two it names.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc
from google.protobuf import timestamp_pb2
from google.rpc import status_pb2

from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.api.client_tool_input import check_client_tools
from turnwire_server.api.progress import Silence
from turnwire_server.api.replays import replay_stream
from turnwire_server.api.resources import timestamp
from turnwire_server.api.status import (
    TurnwireStatusError,
    invalid_argument,
    invalid_page_token,
    status_error_of,
)
from turnwire_server.api.tenancy import caller_principal, listing_prefix, local_id, scoped_key
from turnwire_server.api.turn_streams import abort, strategy_of, trace_context
from turnwire_server.api.validation import (
    check_budget,
    check_id,
    check_message,
    check_text,
    json_object,
    raise_if_any,
)
from turnwire_server.api.webhook_rpcs import check_webhook_target
from turnwire_server.engine import TurnEngine, TurnRequest
from turnwire_server.engine.errors import AdmissionRefused, SubmissionNotFound, TurnStreamNotFound
from turnwire_server.engine.ids import (
    RESERVED_PREFIX,
    assistant_message_id,
    is_reserved,
    new_request_id,
    submission_message_id,
)
from turnwire_server.engine.submissions import Submissions
from turnwire_server.providers.registry import UnknownModel
from turnwire_server.store.base import EngineStore
from turnwire_server.store.errors import InvalidPageToken, StoreError
from turnwire_server.store.records import SubmissionRecord
from turnwire_server.webhooks.settings import WebhookSettings

_STATES: dict[str, int] = {
    "pending": chat_service_pb2.SUBMISSION_STATE_PENDING,
    "running": chat_service_pb2.SUBMISSION_STATE_RUNNING,
    "completed": chat_service_pb2.SUBMISSION_STATE_COMPLETED,
    "error": chat_service_pb2.SUBMISSION_STATE_ERROR,
    "aborted": chat_service_pb2.SUBMISSION_STATE_ABORTED,
    "skipped": chat_service_pb2.SUBMISSION_STATE_SKIPPED,
}
_STATE_NAMES = {number: name for name, number in _STATES.items()}
_TURN_STATUS = {
    "completed": event_pb2.TURN_STATUS_COMPLETED,
    "error": event_pb2.TURN_STATUS_ERROR,
    "aborted": event_pb2.TURN_STATUS_ABORTED,
    "skipped": event_pb2.TURN_STATUS_SKIPPED,
}
_DEFAULT_PAGE_SIZE = 50
_MAX_PAGE_SIZE = 100
MAX_METADATA_BYTES = 16 << 10
"""A submission's ``metadata`` limit: a full ListSubmissions page (100) stays under gRPC's default
4 MiB message limit (docs/semantics.md §11, readable back)."""


class _Servicer(Protocol):
    engine: TurnEngine
    store: EngineStore
    submissions: Submissions
    default_model: str
    max_message_bytes: int
    progress_interval: float
    webhooks: WebhookSettings


def _timestamp(value: dt.datetime | None) -> timestamp_pb2.Timestamp | None:
    return None if value is None else timestamp(value)


def submission_proto(record: SubmissionRecord) -> chat_service_pb2.Submission:
    """The API's view of a stored submission."""
    request = chat_service_pb2.SubmitMessagesRequest.FromString(record.request)
    proto = chat_service_pb2.Submission(
        submission_id=record.submission_id,
        conversation_id=record.conversation_id,
        idempotency_key=record.idempotency_key or "",
        state=_STATES[record.state],  # type: ignore[arg-type]
        create_time=_timestamp(record.create_time),
        start_time=_timestamp(record.start_time),
        end_time=_timestamp(record.end_time),
        assistant_message_id=assistant_message_id(record.submission_id),
        message_count=len(request.messages),
    )
    if request.HasField("metadata"):
        proto.metadata.CopyFrom(request.metadata)
    if request.HasField("webhook"):
        proto.webhook.CopyFrom(request.webhook)
    if record.error is not None:
        proto.error.CopyFrom(status_pb2.Status.FromString(record.error))
    return proto


def turn_request_of(record: SubmissionRecord, default_model: str) -> TurnRequest:
    """The turn of a stored submission: its messages (an unset role is the user's, a missing id
    derived from the submission id, see ``submission_message_id``), body, model, own budget and
    the principal who submitted it."""
    request = chat_service_pb2.SubmitMessagesRequest.FromString(record.request)
    messages = []
    for index, message in enumerate(request.messages):
        if message.role == message_pb2.ROLE_UNSPECIFIED:
            message.role = message_pb2.ROLE_USER
        if not message.id:
            message.id = submission_message_id(record.submission_id, index)
        messages.append(message)
    return TurnRequest(
        conversation_id=record.conversation_id,
        request_id=record.submission_id,
        messages=messages,
        body=json_object(request.body, "body"),
        model=request.model or default_model,
        continuation=False,
        response_type=chat_service_pb2.WatchSubmissionResponse,
        disconnect="continue",
        client_tools=check_client_tools(request.client_tools, "client_tools", []),
        entry="submission",
        budget=check_budget(request, []),
        principal=record.principal,
    )


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: BaseException) -> None:
    await abort(context, status_error_of(error))


class SubmissionRpcs:
    """``SubmitMessages``, ``GetSubmission``, ``ListSubmissions``, ``CancelSubmission``,
    ``WatchSubmission``: a mixin of the ChatService servicer (it supplies ``engine``, ``store``,
    ``submissions``, ``default_model``, ``max_message_bytes`` and ``webhooks``)."""

    async def SubmitMessages(
        self: Any,
        request: chat_service_pb2.SubmitMessagesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.SubmitMessagesResponse:
        """Durably accept messages for a later turn; a repeat returns the first (``accepted`` false)."""
        try:
            violations: list[tuple[str, str]] = []
            check_id(request.conversation_id, "conversation_id", violations, required=True)
            # A server-assigned id may be sent back (a retry by id), never used for a new submission.
            check_id(request.submission_id, "submission_id", violations, required=False)
            if (
                is_reserved(local_id(request.submission_id))
                and await self.store.get_submission(request.submission_id) is None
            ):
                violations.append(
                    (
                        "submission_id",
                        f"ids starting with {RESERVED_PREFIX!r} are the server's and this one names no "
                        "submission; choose another id or leave it empty",
                    )
                )
            if len(request.idempotency_key) > 256:
                violations.append(("idempotency_key", "must be at most 256 characters"))
            check_text(request.idempotency_key, "idempotency_key", violations)
            if request.metadata.ByteSize() > MAX_METADATA_BYTES:
                violations.append(
                    (
                        "metadata",
                        f"is {request.metadata.ByteSize():,} bytes; the limit is "
                        f"{MAX_METADATA_BYTES:,} bytes (keep large data in the messages or your own store)",
                    )
                )
            if not request.messages:
                violations.append(("messages", "must contain at least one message"))
            stored = chat_service_pb2.SubmitMessagesRequest()
            stored.CopyFrom(request)
            stored.ClearField("submission_id")
            stored.ClearField("idempotency_key")
            seen: set[str] = set()
            for index, message in enumerate(stored.messages):
                message.ClearField("create_time")  # output only
                probe = message_pb2.Message()
                probe.CopyFrom(message)
                check_message(
                    probe,
                    f"messages[{index}]",
                    violations,
                    max_bytes=self.max_message_bytes,
                    default_role=message_pb2.ROLE_USER,
                )
                if message.id and message.id in seen:
                    violations.append(
                        (f"messages[{index}].id", f"duplicates an earlier message id {message.id!r}")
                    )
                seen.add(message.id)
            check_client_tools(request.client_tools, "client_tools", violations)
            check_budget(request, violations)
            endpoint, url = check_webhook_target(request, "webhook", self.webhooks, violations)
            raise_if_any(violations)
            json_object(request.body, "body")
            json_object(request.metadata, "metadata")
            self.engine.providers.resolve(request.model or self.default_model)
            record = SubmissionRecord(
                submission_id=request.submission_id or scoped_key(new_request_id()),
                conversation_id=request.conversation_id,
                idempotency_key=request.idempotency_key or None,
                state="pending",
                request=stored.SerializeToString(deterministic=True),
                create_time=dt.datetime.now(dt.UTC),
                principal=caller_principal(),
                webhook_endpoint=endpoint,
                webhook_url=url,
            )
            strategy = (
                strategy_of(request.concurrent_input_strategy) or self.engine.settings.limits.concurrent_input
            )
            reserved = strategy == "reject" and (
                not request.submission_id or await self.store.get_submission(request.submission_id) is None
            )
            place = record.submission_id
            if reserved:  # refused unless idle, atomically with taking its place; nothing stored
                await self.engine.line.reserve_if_idle(request.conversation_id, place)
            try:
                record, created = await self.submissions.submit(
                    record,
                    trace_context=trace_context(context),
                    concurrent_input=strategy if strategy in ("interrupt", "rollback") else None,
                )
            except BaseException:
                if reserved:
                    await self.engine.line.release_place(request.conversation_id, place)
                raise
            if reserved and not created:  # a repeat (same idempotency key): its own place stands
                await self.engine.line.release_place(request.conversation_id, place)
        except (TurnwireStatusError, UnknownModel, StoreError, AdmissionRefused) as error:
            await _abort(context, error)
            raise AssertionError("unreachable") from None
        return chat_service_pb2.SubmitMessagesResponse(submission=submission_proto(record), accepted=created)

    async def GetSubmission(
        self: Any,
        request: chat_service_pb2.GetSubmissionRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.GetSubmissionResponse:
        """One submission; NOT_FOUND when there is none."""
        record = await _found(self, request.submission_id, context)
        return chat_service_pb2.GetSubmissionResponse(submission=submission_proto(record))

    async def ListSubmissions(
        self: Any,
        request: chat_service_pb2.ListSubmissionsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.ListSubmissionsResponse:
        """Submissions in acceptance order, filtered by conversation and state (AIP-158)."""
        violations: list[tuple[str, str]] = []
        if request.page_size < 0:
            violations.append(("page_size", "must not be negative; 0 means the default of 50"))
        if request.conversation_id:
            check_id(request.conversation_id, "conversation_id", violations, required=False)
        if request.state and request.state not in _STATE_NAMES:
            violations.append(("state", f"unknown state {request.state}"))
        if violations:
            await _abort(context, invalid_argument(violations))
        state = _STATE_NAMES.get(request.state, "")
        try:
            records, token = await self.store.list_submissions(
                min(request.page_size or _DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE),
                request.page_token,
                conversation_id=request.conversation_id,
                state=state,
                id_prefix=listing_prefix(),
            )
        except InvalidPageToken:
            await _abort(
                context,
                invalid_page_token("for these filters", "with the same conversation_id and state,"),
            )
            raise AssertionError("unreachable") from None
        except StoreError as error:
            await _abort(context, error)
            raise AssertionError("unreachable") from None
        return chat_service_pb2.ListSubmissionsResponse(
            submissions=[submission_proto(r) for r in records], next_page_token=token
        )

    async def CancelSubmission(
        self: Any,
        request: chat_service_pb2.CancelSubmissionRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.CancelSubmissionResponse:
        """Cancel a pending or running submission; a finished one is returned unchanged."""
        await _check_submission_id(request.submission_id, context)
        try:
            record = await self.submissions.cancel(request.submission_id)
        except (SubmissionNotFound, StoreError) as error:
            await _abort(context, error)
            raise AssertionError("unreachable") from None
        return chat_service_pb2.CancelSubmissionResponse(submission=submission_proto(record))

    async def WatchSubmission(
        self: Any,
        request: chat_service_pb2.WatchSubmissionRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[chat_service_pb2.WatchSubmissionResponse]:
        """The submission's turn events from ``after_sequence_number``, then its TurnEnd."""
        if request.after_sequence_number < 0:
            await _abort(
                context,
                invalid_argument(
                    [("after_sequence_number", "must not be negative; 0 streams from the start")]
                ),
            )
        record = await _found(self, request.submission_id, context)

        def watch(batch_events: int, batch_bytes: int) -> AsyncIterator[list[event_pb2.TurnEvent]]:
            return _watch(self, record, request.after_sequence_number, batch_events, batch_bytes)

        silence = Silence(
            record.conversation_id, record.submission_id, started=request.after_sequence_number > 0
        )
        async for response in replay_stream(
            watch,
            context,
            chat_service_pb2.WatchSubmissionResponse,
            batch_bytes=self.batch_bytes,
            progress_interval=self.progress_interval,
            silence=silence,
        ):
            yield response


async def _watch(
    servicer: _Servicer, record: SubmissionRecord, after: int, batch_events: int, batch_bytes: int
) -> AsyncIterator[list[event_pb2.TurnEvent]]:
    """The turn's stream in lists of events ready at once (``TurnEngine.replay``); for a
    submission that ended without running (cancelled while pending, refused when it started) a
    single TurnEnd made from its record."""
    ended = False  # the record said it ended, after a look that found no stream
    looked_again = False  # running and not here: looked once more before saying so
    while True:
        try:
            replay = servicer.engine.replay(
                record.submission_id, after, batch_events=batch_events, batch_bytes=batch_bytes
            )
            async for batch in replay:
                after = batch[-1].sequence_number
                yield batch
            return
        except TurnStreamNotFound as missing:
            if missing.expired:
                raise
            if ended:
                break  # ended without running: no stream
        current = await servicer.store.get_submission(record.submission_id) or record
        if current.state not in ("pending", "running"):
            # A turn that ran stored its stream with its end: look once more, since the turn
            # may have started and ended between that look and this read (CI: a scheduled
            # fire's watch got a TurnEnd alone).
            ended = True
            continue
        # Being started here (stored or claimed, not yet known to the engine): look again once it
        # is. Else waiting on another replica (or for a takeover): follow it until its turn starts.
        follow = servicer.engine.settings.durability.lease_seconds
        if await servicer.submissions.started_here(record.submission_id, follow):
            continue
        if await servicer.store.wait_for_events(record.submission_id, after, follow):
            continue
        # One process per store: no other replica runs it. A pending one waits for this
        # replica's claim (a free slot; the scheduler's claim after a fire's commit), however long.
        if current.state == "pending":
            await servicer.submissions.moved_here(record.submission_id, follow)
        elif not looked_again:
            # Its start here may have finished between the replay's look and the start's (no
            # longer "starting"): the engine, or the store once it ended, has it on a second look
            # (CI: conformance schedule-fires, "is running and not running on this server").
            looked_again = True
        else:
            raise TurnStreamNotFound(
                f"submission {record.submission_id!r} is {current.state} and not running on this server",
                request_id=record.submission_id,
            )
    status = _TURN_STATUS[current.state]  # a final state: the loop leaves only for one
    if after >= 1:
        return
    end = event_pb2.TurnEvent(
        conversation_id=current.conversation_id, request_id=current.submission_id, sequence_number=1
    )
    end.turn_end.status = status
    if current.error is not None:
        end.turn_end.error.CopyFrom(status_pb2.Status.FromString(current.error))
    yield [end]


async def _check_submission_id(submission_id: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    violations: list[tuple[str, str]] = []
    check_id(submission_id, "submission_id", violations, required=True)
    if violations:
        await _abort(context, invalid_argument(violations))


async def _found(
    servicer: _Servicer, submission_id: str, context: grpc.aio.ServicerContext[Any, Any]
) -> SubmissionRecord:
    await _check_submission_id(submission_id, context)
    try:
        record = await servicer.store.get_submission(submission_id)
    except StoreError as error:
        await _abort(context, error)
        raise AssertionError("unreachable") from None
    if record is None:
        await _abort(context, SubmissionNotFound(submission_id))
        raise AssertionError("unreachable")
    return record
