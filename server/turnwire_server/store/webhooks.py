"""The webhook outbox's records and store role (docs/webhooks.md): a delivery row is written in
the transaction that records a submission's end (:meth:`SubmissionStore.end_submission`,
:meth:`TurnStore.finish_turn`, :meth:`TurnStore.roll_back_turn`,
:meth:`SubmissionStore.expire_submissions`) when the submission named a target; the sender
claims due rows under a lease, records each attempt, and the API lists them."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

__all__ = [
    "AttemptResult",
    "WebhookAttemptRecord",
    "WebhookDeliveryRecord",
    "WebhookDeliveryState",
    "WebhookStore",
]

WebhookDeliveryState = Literal["pending", "delivered", "failed"]
"""``pending`` until an attempt got a 2xx answer (``delivered``) or the sender gave up (``failed``)."""


@dataclass(frozen=True, slots=True)
class WebhookAttemptRecord:
    """One HTTP call of a delivery. ``attempt`` counts from 1; ``duration_us`` (microseconds) is
    None while it runs or when its replica stopped during it (no result was recorded);
    ``http_status`` None without an answer; ``error`` why it failed, else None."""

    attempt: int
    start_time: dt.datetime
    duration_us: int | None = None
    http_status: int | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class WebhookDeliveryRecord:
    """One reported submission end for one target (times tz-aware UTC).

    ``delivery_id`` is the ``webhook-id`` of every attempt; ``endpoint`` (a configured name) or
    ``url`` (a per-request URL) is the target; ``submission_state`` and ``error`` (a serialized
    ``google.rpc.Status``) are the submission's end, copied in the ending transaction, so every
    attempt sends the same payload; ``create_time`` is when it ended. ``attempt_count`` counts
    the attempts started; ``attempts`` is filled by the listing only (oldest first).
    """

    delivery_id: str
    submission_id: str
    conversation_id: str
    endpoint: str | None
    url: str | None
    event_type: str
    submission_state: str
    error: bytes | None
    create_time: dt.datetime
    state: WebhookDeliveryState = "pending"
    attempt_count: int = 0
    next_attempt_time: dt.datetime | None = None
    end_time: dt.datetime | None = None
    attempts: Sequence[WebhookAttemptRecord] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """How one attempt ended, for :meth:`WebhookStore.finish_webhook_attempt`: ``state`` after
    it (``pending`` with ``next_attempt_time`` to retry), its duration (µs), the answer's HTTP
    status (None without one) and the error text (None after a 2xx)."""

    state: WebhookDeliveryState
    duration_us: int
    http_status: int | None = None
    error: str | None = None
    next_attempt_time: dt.datetime | None = None


@runtime_checkable
class WebhookStore(Protocol):
    """The webhook outbox (docs/webhooks.md)."""

    async def claim_webhook_deliveries(
        self, owner: str, now: dt.datetime, lease_until: dt.datetime, limit: int
    ) -> list[WebhookDeliveryRecord]:
        """Take up to ``limit`` (>= 1) pending deliveries due at ``now`` whose lease lapsed (or
        that none holds), oldest due first, for ``owner`` until ``lease_until``; each one's next
        attempt is started (``attempt_count`` + 1, its attempt row stored with ``now`` as start).
        Replicas claiming at once take disjoint rows (``FOR UPDATE SKIP LOCKED``); a store served
        by one process ignores leases of other owners (they are dead). Raises
        :class:`StoreError`."""
        ...

    async def finish_webhook_attempt(
        self, delivery_id: str, owner: str, attempt: int, result: AttemptResult, now: dt.datetime
    ) -> bool:
        """Record how attempt ``attempt`` of ``delivery_id`` ended and move the delivery as
        ``result`` says, releasing the lease. False (the attempt row still completed) when
        ``owner`` no longer holds the delivery at that attempt: another replica took it over after
        the lease lapsed, and its own attempt decides. Raises :class:`StoreError`."""
        ...

    async def list_webhook_deliveries(
        self,
        page_size: int,
        page_token: str,
        *,
        submission_id: str = "",
        conversation_id: str = "",
        state: str = "",
        id_prefix: str = "",
    ) -> tuple[list[WebhookDeliveryRecord], str]:
        """One page of deliveries (with their attempts) oldest first, filtered by submission,
        conversation and state, of submissions whose key starts with ``id_prefix`` (the caller's
        tenant); the next page token ("" on the last). Raises :class:`InvalidPageToken` for a
        token not issued for these filters, :class:`ValueError` for ``page_size`` < 1."""
        ...

    async def delete_webhook_deliveries(self, ended_before: dt.datetime, limit: int) -> int:
        """Delete up to ``limit`` (>= 1) delivered or failed deliveries (with their attempts)
        that ended before ``ended_before``: the retention sweep. Returns how many went."""
        ...
