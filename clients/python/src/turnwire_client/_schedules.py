"""The schedule calls of both clients (docs/schedules.md): ``create_schedule``, ``get_schedule``,
``list_schedules``, ``pause_schedule``, ``resume_schedule``, ``delete_schedule``.

:class:`ScheduleCalls` (the async client's) and :class:`SyncScheduleCalls` (the sync client's)
are mixins on the clients' ``_stub`` and ``_unary``; :func:`create_schedule_request` builds the
request both send.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from turnwire_client._requests import ClientToolSpec, MessagesSpec, WebhookSpec, submit_messages_request
from turnwire_client.v1 import chat_service_pb2

__all__ = ["ScheduleCalls", "SyncScheduleCalls", "create_schedule_request"]

OverlapPolicy = Literal["skip", "enqueue"]
MissedRunsPolicy = Literal["skip", "run_once"]

_OVERLAP = {
    "skip": chat_service_pb2.SCHEDULE_OVERLAP_POLICY_SKIP,
    "enqueue": chat_service_pb2.SCHEDULE_OVERLAP_POLICY_ENQUEUE,
}
_MISSED = {
    "skip": chat_service_pb2.MISSED_RUNS_POLICY_SKIP,
    "run_once": chat_service_pb2.MISSED_RUNS_POLICY_RUN_ONCE,
}


def create_schedule_request(
    conversation_id: str,
    messages: MessagesSpec,
    *,
    cron: str = "",
    time_zone: str = "",
    fire_time: dt.datetime | None = None,
    conversation_id_template: str = "",
    overlap: OverlapPolicy = "skip",
    missed_runs: MissedRunsPolicy = "skip",
    schedule_id: str = "",
    metadata: Mapping[str, Any] | None = None,
    body: Mapping[str, Any] | None = None,
    model: str | None = None,
    client_tools: Sequence[ClientToolSpec] = (),
    webhook: WebhookSpec | None = None,
) -> chat_service_pb2.CreateScheduleRequest:
    """The ``CreateScheduleRequest`` of :meth:`ScheduleCalls.create_schedule` (see there)."""
    if overlap not in _OVERLAP:
        raise ValueError(f"overlap must be one of {sorted(_OVERLAP)}, got {overlap!r}")
    if missed_runs not in _MISSED:
        raise ValueError(f"missed_runs must be one of {sorted(_MISSED)}, got {missed_runs!r}")
    schedule = chat_service_pb2.Schedule(
        cron=cron,
        time_zone=time_zone,
        conversation_id_template=conversation_id_template,
        overlap_policy=_OVERLAP[overlap],
        missed_runs_policy=_MISSED[missed_runs],
    )
    schedule.input.CopyFrom(
        submit_messages_request(
            conversation_id,
            messages,
            submission_id=None,
            idempotency_key=None,
            metadata=metadata,
            body=body,
            model=model,
            client_tools=client_tools,
            webhook=webhook,
        )
    )
    if fire_time is not None:
        schedule.fire_time.FromDatetime(fire_time.astimezone(dt.UTC))
    return chat_service_pb2.CreateScheduleRequest(schedule=schedule, schedule_id=schedule_id)


class ScheduleCalls:
    """The async client's schedule calls (a mixin of :class:`~turnwire_client.TurnwireClient`)."""

    _stub: Any

    async def _unary(self, method: Any, request: Any, deadline: float | None) -> Any:
        raise NotImplementedError

    async def create_schedule(
        self,
        conversation_id: str,
        messages: MessagesSpec,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
        **schedule: Any,
    ) -> chat_service_pb2.Schedule:
        """Create a schedule that submits ``messages`` (a plain text is one user message) to
        ``conversation_id`` on ``cron`` (five fields, or six with seconds first) read in
        ``time_zone`` (IANA, "" for UTC), or once at ``fire_time``. Options (keywords):
        ``conversation_id_template`` (a new conversation per run: pass "" as
        ``conversation_id``), ``overlap`` (``"skip"`` or ``"enqueue"``), ``missed_runs``
        (``"skip"`` or ``"run_once"``), ``schedule_id``, and ``metadata``, ``body``, ``model``,
        ``client_tools``, ``webhook`` as :meth:`submit_messages` takes them (``webhook``: each
        fire's submission calls this target when it ends; docs/schedules.md, "Webhooks").

        Returns the stored schedule (its ``next_fire_time`` the first fire). Raises
        :class:`TurnwireError`: ``INVALID_ARGUMENT`` with field violations (a bad cron
        expression or time zone, a webhook endpoint the server does not have,
        ``schedule.input.webhook.endpoint``, among them), ``ALREADY_EXISTS`` for a
        ``schedule_id`` in use.
        """
        request = create_schedule_request(conversation_id, messages, **schedule)
        response: chat_service_pb2.CreateScheduleResponse = await self._unary(
            self._stub.CreateSchedule, request, timeout
        )
        return response.schedule

    async def get_schedule(
        self,
        schedule_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.Schedule:
        """One schedule. Raises :class:`TurnwireError` ``NOT_FOUND`` (``SCHEDULE_NOT_FOUND``)."""
        request = chat_service_pb2.GetScheduleRequest(schedule_id=schedule_id)
        response: chat_service_pb2.GetScheduleResponse = await self._unary(
            self._stub.GetSchedule, request, timeout
        )
        return response.schedule

    async def list_schedules(
        self,
        *,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.ListSchedulesResponse:
        """One page of the caller's schedules, by id."""
        request = chat_service_pb2.ListSchedulesRequest(page_size=page_size, page_token=page_token)
        response: chat_service_pb2.ListSchedulesResponse = await self._unary(
            self._stub.ListSchedules, request, timeout
        )
        return response

    async def pause_schedule(
        self,
        schedule_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.Schedule:
        """Pause a schedule; returns it as stored afterwards. ``NOT_FOUND`` for an unknown id."""
        request = chat_service_pb2.PauseScheduleRequest(schedule_id=schedule_id)
        response: chat_service_pb2.PauseScheduleResponse = await self._unary(
            self._stub.PauseSchedule, request, timeout
        )
        return response.schedule

    async def resume_schedule(
        self,
        schedule_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> chat_service_pb2.Schedule:
        """Resume a paused schedule from its next time after now; returns it as stored."""
        request = chat_service_pb2.ResumeScheduleRequest(schedule_id=schedule_id)
        response: chat_service_pb2.ResumeScheduleResponse = await self._unary(
            self._stub.ResumeSchedule, request, timeout
        )
        return response.schedule

    async def delete_schedule(
        self,
        schedule_id: str,
        *,
        allow_missing: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 - a gRPC deadline, sent to the server
    ) -> bool:
        """Delete a schedule (its submissions stay). True when one was deleted; ``NOT_FOUND``
        unless ``allow_missing``."""
        request = chat_service_pb2.DeleteScheduleRequest(schedule_id=schedule_id, allow_missing=allow_missing)
        response: chat_service_pb2.DeleteScheduleResponse = await self._unary(
            self._stub.DeleteSchedule, request, timeout
        )
        return response.deleted


class SyncScheduleCalls:
    """The sync client's schedule calls (a mixin of :class:`~turnwire_client.SyncTurnwireClient`);
    the same as :class:`ScheduleCalls`'."""

    _stub: Any

    def _unary(self, method: Any, request: Any, deadline: float | None) -> Any:
        raise NotImplementedError

    def create_schedule(
        self, conversation_id: str, messages: MessagesSpec, *, timeout: float | None = None, **schedule: Any
    ) -> chat_service_pb2.Schedule:
        """As :meth:`ScheduleCalls.create_schedule`."""
        request = create_schedule_request(conversation_id, messages, **schedule)
        return self._unary(self._stub.CreateSchedule, request, timeout).schedule  # type: ignore[no-any-return]

    def get_schedule(self, schedule_id: str, *, timeout: float | None = None) -> chat_service_pb2.Schedule:
        """As :meth:`ScheduleCalls.get_schedule`."""
        request = chat_service_pb2.GetScheduleRequest(schedule_id=schedule_id)
        return self._unary(self._stub.GetSchedule, request, timeout).schedule  # type: ignore[no-any-return]

    def list_schedules(
        self, *, page_size: int = 0, page_token: str = "", timeout: float | None = None
    ) -> chat_service_pb2.ListSchedulesResponse:
        """As :meth:`ScheduleCalls.list_schedules`."""
        request = chat_service_pb2.ListSchedulesRequest(page_size=page_size, page_token=page_token)
        return self._unary(self._stub.ListSchedules, request, timeout)  # type: ignore[no-any-return]

    def pause_schedule(self, schedule_id: str, *, timeout: float | None = None) -> chat_service_pb2.Schedule:
        """As :meth:`ScheduleCalls.pause_schedule`."""
        request = chat_service_pb2.PauseScheduleRequest(schedule_id=schedule_id)
        return self._unary(self._stub.PauseSchedule, request, timeout).schedule  # type: ignore[no-any-return]

    def resume_schedule(self, schedule_id: str, *, timeout: float | None = None) -> chat_service_pb2.Schedule:
        """As :meth:`ScheduleCalls.resume_schedule`."""
        request = chat_service_pb2.ResumeScheduleRequest(schedule_id=schedule_id)
        return self._unary(self._stub.ResumeSchedule, request, timeout).schedule  # type: ignore[no-any-return]

    def delete_schedule(
        self, schedule_id: str, *, allow_missing: bool = False, timeout: float | None = None
    ) -> bool:
        """As :meth:`ScheduleCalls.delete_schedule`."""
        request = chat_service_pb2.DeleteScheduleRequest(schedule_id=schedule_id, allow_missing=allow_missing)
        return self._unary(self._stub.DeleteSchedule, request, timeout).deleted  # type: ignore[no-any-return]
