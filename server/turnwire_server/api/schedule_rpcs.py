"""The schedule RPCs of ``turnwire.v1.ChatService`` (docs/schedules.md): ``CreateSchedule``,
``GetSchedule``, ``ListSchedules``, ``PauseSchedule``, ``ResumeSchedule``, ``DeleteSchedule``.

A schedule is stored as its ``turnwire.v1.Schedule`` without the output-only fields (the
store's columns hold those), its input's conversation id as a tenant-scoped key like every
stored id (api/tenancy.py). :func:`schedule_spec_of` reads it back for the engine's
scheduler, with the submission each fire makes: the input as ``SubmitMessages`` stores it,
under the submission id of the fire (``engine/schedules.py``), run under the principal who
created the schedule. Its input's ``webhook`` target, checked as SubmitMessages checks it, goes
with every fire's submission, so each run's end is called as a submission's is
(docs/schedules.md, "Webhooks").
"""

from __future__ import annotations

import datetime as dt
import string
from typing import Any, Final

import grpc

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api.client_tool_input import check_client_tools
from turnwire_server.api.resources import timestamp
from turnwire_server.api.status import (
    TurnwireStatusError,
    invalid_argument,
    invalid_page_token,
    status_error_of,
)
from turnwire_server.api.submission_rpcs import MAX_METADATA_BYTES
from turnwire_server.api.tenancy import caller_principal, listing_prefix, local_id, scoped_key
from turnwire_server.api.turn_streams import abort
from turnwire_server.api.validation import check_budget, check_id, check_message, json_object
from turnwire_server.api.webhook_rpcs import check_webhook_target
from turnwire_server.engine.ids import RESERVED_PREFIX
from turnwire_server.engine.schedule_times import ScheduleTiming, TimingError
from turnwire_server.engine.schedules import MissedRunsPolicy, OverlapPolicy, ScheduleSpec, fire_submission_id
from turnwire_server.providers.registry import UnknownModel
from turnwire_server.store.errors import InvalidPageToken, StoreError
from turnwire_server.store.records import SubmissionRecord
from turnwire_server.store.schedules import ScheduleNotFound, ScheduleRecord, ScheduleState
from turnwire_server.webhooks.settings import WebhookSettings

__all__ = ["ScheduleRpcs", "schedule_proto", "schedule_spec_of"]

_STATES: Final[dict[str, int]] = {
    "active": chat_service_pb2.SCHEDULE_STATE_ACTIVE,
    "paused": chat_service_pb2.SCHEDULE_STATE_PAUSED,
    "completed": chat_service_pb2.SCHEDULE_STATE_COMPLETED,
}
_OVERLAP: Final[dict[int, OverlapPolicy]] = {
    chat_service_pb2.SCHEDULE_OVERLAP_POLICY_UNSPECIFIED: "skip",
    chat_service_pb2.SCHEDULE_OVERLAP_POLICY_SKIP: "skip",
    chat_service_pb2.SCHEDULE_OVERLAP_POLICY_ENQUEUE: "enqueue",
}
_MISSED: Final[dict[int, MissedRunsPolicy]] = {
    chat_service_pb2.MISSED_RUNS_POLICY_UNSPECIFIED: "skip",
    chat_service_pb2.MISSED_RUNS_POLICY_SKIP: "skip",
    chat_service_pb2.MISSED_RUNS_POLICY_RUN_ONCE: "run_once",
}
_TEMPLATE_FIELDS: Final = frozenset({"schedule_id", "fire_number", "fire_time"})
_MAX_SCHEDULE_ID: Final = 100
"""Shorter than other ids (128): a fire's submission id adds ``tw-`` and ``.<fire number>``."""
_DEFAULT_PAGE_SIZE: Final = 50
_MAX_PAGE_SIZE: Final = 100
_OUTPUT_ONLY: Final = (
    "schedule_id",
    "state",
    "next_fire_time",
    "last_fire_time",
    "last_submission_id",
    "fire_count",
    "skipped_count",
    "create_time",
    "update_time",
)


def _tenant_of(key: str) -> str:
    """``"<tenant>/"`` of a store key ("" for the default tenant's)."""
    head, separator, _ = key.rpartition("/")
    return f"{head}{separator}"


def _timing(stored: chat_service_pb2.Schedule) -> ScheduleTiming:
    fire_time = stored.fire_time.ToDatetime(dt.UTC) if stored.HasField("fire_time") else None
    return ScheduleTiming.of(stored.cron, stored.time_zone, fire_time)


def _conversation_of(template: str, schedule_id: str, number: int, fire_at: dt.datetime) -> str:
    """A run's conversation id from the template (the client's id, without tenant prefix)."""
    return template.format(
        schedule_id=schedule_id,
        fire_number=number,
        fire_time=fire_at.astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ"),
    )


def schedule_spec_of(record: ScheduleRecord) -> ScheduleSpec:
    """The engine's view of a stored schedule: its timing, policies and the submission of each
    fire (its conversation the input's, or the template's for the fire; its request the input
    as SubmitMessages stores it; its principal the schedule creator's; its webhook target the
    input's, so the outbox calls it when the fire's submission ends). Raises
    :class:`ValueError` for a spec that no longer decodes."""
    stored = chat_service_pb2.Schedule.FromString(record.spec)
    tenant = _tenant_of(record.schedule_id)

    def submission(number: int, fire_at: dt.datetime, now: dt.datetime) -> SubmissionRecord:
        request = chat_service_pb2.SubmitMessagesRequest()
        request.CopyFrom(stored.input)
        if stored.conversation_id_template:
            local = record.schedule_id.removeprefix(tenant)
            request.conversation_id = tenant + _conversation_of(
                stored.conversation_id_template, local, number, fire_at
            )
        return SubmissionRecord(
            submission_id=fire_submission_id(record.schedule_id, number),
            conversation_id=request.conversation_id,
            idempotency_key=None,
            state="pending",
            request=request.SerializeToString(deterministic=True),
            create_time=now,
            principal=record.principal,
            # Checked when the schedule was created; an endpoint or URL the server has stopped
            # accepting since fails its delivery at once (docs/webhooks.md, "Delivery").
            webhook_endpoint=request.webhook.endpoint or None,
            webhook_url=request.webhook.url or None,
        )

    return ScheduleSpec(
        timing=_timing(stored),
        overlap=_OVERLAP.get(stored.overlap_policy, "skip"),
        missed=_MISSED.get(stored.missed_runs_policy, "skip"),
        submission=submission,
    )


def _time(value: dt.datetime | None, into: Any) -> None:
    if value is not None:
        into.CopyFrom(timestamp(value))


def schedule_proto(record: ScheduleRecord) -> chat_service_pb2.Schedule:
    """The API's view of a stored schedule (ids as the store keys them: the tenancy layer strips
    the caller's prefix from ``schedule_id`` and the input's ``conversation_id``; this strips it
    from ``last_submission_id``, a field it does not know)."""
    proto = chat_service_pb2.Schedule.FromString(record.spec)
    proto.schedule_id = record.schedule_id
    proto.state = _STATES[record.state]  # type: ignore[assignment]
    _time(record.next_fire_at, proto.next_fire_time)
    _time(record.last_fire_at, proto.last_fire_time)
    _time(record.create_time, proto.create_time)
    _time(record.update_time, proto.update_time)
    proto.last_submission_id = local_id(record.last_submission_id)
    proto.fire_count = record.fire_count
    proto.skipped_count = record.skipped_count
    return proto


def _check_template(template: str, violations: list[tuple[str, str]]) -> None:
    field = "schedule.conversation_id_template"
    try:
        names = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as error:
        violations.append(
            (field, f"is not a template ({error}); write {{fire_number}}, and {{{{ for a brace")
        )
        return
    if unknown := names - _TEMPLATE_FIELDS:
        violations.append(
            (field, f"names {sorted(unknown)}; use only {{schedule_id}}, {{fire_number}} and {{fire_time}}")
        )
        return
    if "fire_number" not in names and "fire_time" not in names:
        violations.append(
            (field, "must hold {fire_number} or {fire_time}, so each run gets a conversation of its own")
        )
        return
    sample = _conversation_of(
        template, "x" * _MAX_SCHEDULE_ID, 10**12, dt.datetime(2099, 12, 31, tzinfo=dt.UTC)
    )
    check_id(sample, field, violations, required=True)


def _check_input(
    request: chat_service_pb2.SubmitMessagesRequest,
    templated: bool,
    violations: list[tuple[str, str]],
    max_bytes: int,
    webhooks: WebhookSettings,
) -> None:
    """SubmitMessages' checks of the schedule's input, its field paths under ``schedule.input``
    (its webhook target against this server's ``webhooks:`` section, as SubmitMessages')."""
    field = "schedule.input"
    if templated:
        if request.conversation_id:
            violations.append(
                (
                    f"{field}.conversation_id",
                    "leave it empty with conversation_id_template: each run gets its own",
                )
            )
    else:
        check_id(request.conversation_id, f"{field}.conversation_id", violations, required=True)
    if request.submission_id or request.idempotency_key:
        violations.append(
            (
                f"{field}.submission_id",
                "leave submission_id and idempotency_key empty: each fire's submission id is the schedule's",
            )
        )
    if request.concurrent_input_strategy not in (
        chat_service_pb2.CONCURRENT_INPUT_STRATEGY_UNSPECIFIED,
        chat_service_pb2.CONCURRENT_INPUT_STRATEGY_ENQUEUE,
    ):
        violations.append(
            (
                f"{field}.concurrent_input_strategy",
                "a fire waits in its conversation's queue: use ENQUEUE or leave it unset "
                "(the overlap policy decides about a run still open)",
            )
        )
    if request.metadata.ByteSize() > MAX_METADATA_BYTES:
        violations.append(
            (
                f"{field}.metadata",
                f"is {request.metadata.ByteSize():,} bytes; the limit is {MAX_METADATA_BYTES:,} bytes",
            )
        )
    if not request.messages:
        violations.append((f"{field}.messages", "must contain at least one message"))
    for index, message in enumerate(request.messages):
        if message.id:
            violations.append(
                (
                    f"{field}.messages[{index}].id",
                    "leave it empty: each fire's messages get ids from its submission",
                )
            )
        probe = message_pb2.Message()
        probe.CopyFrom(message)
        check_message(
            probe,
            f"{field}.messages[{index}]",
            violations,
            max_bytes=max_bytes,
            default_role=message_pb2.ROLE_USER,
        )
    check_client_tools(request.client_tools, f"{field}.client_tools", violations)
    own: list[tuple[str, str]] = []  # SubmitMessages' checks name its top-level fields
    check_budget(request, own)
    check_webhook_target(request, "webhook", webhooks, own)
    violations.extend((f"{field}.{name}", description) for name, description in own)


class ScheduleRpcs:
    """The schedule RPCs: a mixin of the ChatService servicer (it supplies ``engine``, ``store``,
    ``default_model``, ``max_message_bytes``, ``webhooks`` (the ``webhooks:`` section an input's
    target is checked against) and ``scheduler``, the replica's schedule loop, woken when a
    schedule is created or resumed)."""

    async def CreateSchedule(
        self: Any,
        request: chat_service_pb2.CreateScheduleRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.CreateScheduleResponse:
        """Validate and store a schedule; its first fire time is the first after now (a single
        time already past fires at once)."""
        violations: list[tuple[str, str]] = []
        check_id(request.schedule_id, "schedule_id", violations, required=False, client_chosen=True)
        if len(local_id(request.schedule_id)) > _MAX_SCHEDULE_ID:
            violations.append(
                (
                    "schedule_id",
                    f"must be at most {_MAX_SCHEDULE_ID} characters (a fire's submission id adds to it)",
                )
            )
        schedule = request.schedule
        timing = None
        try:
            timing = _timing(schedule)
        except TimingError as error:
            violations.append((f"schedule.{error.field}", str(error)))
        templated = bool(schedule.conversation_id_template)
        if templated:
            _check_template(schedule.conversation_id_template, violations)
        if schedule.overlap_policy not in _OVERLAP:
            violations.append(("schedule.overlap_policy", f"unknown policy {schedule.overlap_policy}"))
        if schedule.missed_runs_policy not in _MISSED:
            violations.append(
                ("schedule.missed_runs_policy", f"unknown policy {schedule.missed_runs_policy}")
            )
        _check_input(schedule.input, templated, violations, self.max_message_bytes, self.webhooks)
        now = dt.datetime.now(dt.UTC)
        first = None
        if timing is not None:
            first = max(timing.fire_time, now) if timing.fire_time is not None else timing.first_after(now)
            if first is None:
                violations.append(("schedule.cron", "matches no time in the next 50 years"))
        try:
            if violations:
                raise invalid_argument(violations)
            json_object(schedule.input.body, "schedule.input.body")
            json_object(schedule.input.metadata, "schedule.input.metadata")
            try:
                self.engine.providers.resolve(schedule.input.model or self.default_model)
            except UnknownModel as error:  # SubmitMessages' `model`, under the schedule's input
                violation = ("schedule.input.model", str(error))
                raise invalid_argument([violation], reason="UNKNOWN_MODEL") from None
            stored = chat_service_pb2.Schedule()
            stored.CopyFrom(schedule)
            for name in _OUTPUT_ONLY:
                stored.ClearField(name)
            if stored.input.conversation_id:
                stored.input.conversation_id = scoped_key(stored.input.conversation_id)
            for message in stored.input.messages:
                message.ClearField("create_time")  # output only
            record = await self.store.create_schedule(
                ScheduleRecord(
                    schedule_id=request.schedule_id or scoped_key(f"{RESERVED_PREFIX}s-{_random_hex()}"),
                    state="active",
                    spec=stored.SerializeToString(deterministic=True),
                    next_fire_at=first,
                    create_time=now,
                    update_time=now,
                    principal=caller_principal(),
                )
            )
        except (TurnwireStatusError, StoreError) as error:
            await abort(context, status_error_of(error))
            raise AssertionError("unreachable") from None
        if self.scheduler is not None:
            self.scheduler.wake()
        return chat_service_pb2.CreateScheduleResponse(schedule=schedule_proto(record))

    async def GetSchedule(
        self: Any, request: chat_service_pb2.GetScheduleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> chat_service_pb2.GetScheduleResponse:
        """One schedule; NOT_FOUND when the caller has none of this id."""
        await _check_schedule_id(request.schedule_id, context)
        try:
            record = await self.store.get_schedule(request.schedule_id)
            if record is None:
                raise ScheduleNotFound(request.schedule_id)
        except StoreError as error:
            await abort(context, status_error_of(error))
            raise AssertionError("unreachable") from None
        return chat_service_pb2.GetScheduleResponse(schedule=schedule_proto(record))

    async def ListSchedules(
        self: Any, request: chat_service_pb2.ListSchedulesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> chat_service_pb2.ListSchedulesResponse:
        """The caller's schedules by id (AIP-158)."""
        if request.page_size < 0:
            await abort(
                context, invalid_argument([("page_size", "must not be negative; 0 means the default of 50")])
            )
        try:
            records, token = await self.store.list_schedules(
                min(request.page_size or _DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE),
                request.page_token,
                id_prefix=listing_prefix(),
            )
        except InvalidPageToken:
            await abort(context, invalid_page_token("for this listing", ""))
            raise AssertionError("unreachable") from None
        except StoreError as error:
            await abort(context, status_error_of(error))
            raise AssertionError("unreachable") from None
        return chat_service_pb2.ListSchedulesResponse(
            schedules=[schedule_proto(r) for r in records], next_page_token=token
        )

    async def PauseSchedule(
        self: Any, request: chat_service_pb2.PauseScheduleRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> chat_service_pb2.PauseScheduleResponse:
        """Pause an active schedule (no next fire time until resumed); others are returned as they are."""
        record = await _move(self, request.schedule_id, "paused", "active", context)
        return chat_service_pb2.PauseScheduleResponse(schedule=schedule_proto(record))

    async def ResumeSchedule(
        self: Any,
        request: chat_service_pb2.ResumeScheduleRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.ResumeScheduleResponse:
        """Resume a paused schedule from its first time after now (a single time that passed while
        it was paused completes it); others are returned as they are."""
        record = await _move(self, request.schedule_id, "active", "paused", context)
        if self.scheduler is not None:
            self.scheduler.wake()
        return chat_service_pb2.ResumeScheduleResponse(schedule=schedule_proto(record))

    async def DeleteSchedule(
        self: Any,
        request: chat_service_pb2.DeleteScheduleRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> chat_service_pb2.DeleteScheduleResponse:
        """Delete a schedule (its submissions stay); NOT_FOUND unless ``allow_missing``."""
        await _check_schedule_id(request.schedule_id, context)
        try:
            deleted = await self.store.delete_schedule(request.schedule_id)
            if not deleted and not request.allow_missing:
                raise ScheduleNotFound(request.schedule_id)
        except StoreError as error:
            await abort(context, status_error_of(error))
            raise AssertionError("unreachable") from None
        return chat_service_pb2.DeleteScheduleResponse(deleted=deleted)


def _random_hex() -> str:
    import uuid

    return uuid.uuid4().hex


async def _check_schedule_id(schedule_id: str, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    violations: list[tuple[str, str]] = []
    check_id(schedule_id, "schedule_id", violations, required=True)
    if violations:
        await abort(context, invalid_argument(violations))


async def _move(
    servicer: Any,
    schedule_id: str,
    state: ScheduleState,
    only_from: ScheduleState,
    context: grpc.aio.ServicerContext[Any, Any],
) -> ScheduleRecord:
    """Pause (``paused`` from ``active``) or resume (``active`` from ``paused``, from the first
    fire time after now; ``completed`` when there is none)."""
    await _check_schedule_id(schedule_id, context)
    try:
        record = await servicer.store.get_schedule(schedule_id)
        if record is None:
            raise ScheduleNotFound(schedule_id)
        next_fire_at = None
        if state == "active" and record.state == "paused":
            next_fire_at = schedule_spec_of(record).timing.first_after(dt.datetime.now(dt.UTC))
            if next_fire_at is None:
                state = "completed"
        moved: ScheduleRecord | None = await servicer.store.set_schedule_state(
            schedule_id, state, next_fire_at, only_from=only_from
        )
        if moved is None:
            raise ScheduleNotFound(schedule_id)
    except StoreError as error:
        await abort(context, status_error_of(error))
        raise AssertionError("unreachable") from None
    return moved
