"""The webhook sender: claims due deliveries from the store's outbox and makes their calls
(docs/webhooks.md, "Delivery").

Every replica runs one. Each poll (``poll_interval_seconds``) claims due deliveries up to its
free slots (``max_in_flight``) under a lease (``WebhookSettings.lease_seconds``: one attempt's
bound and a margin), so replicas never make the same attempt at once; a replica that died
mid-attempt leaves a lease that lapses, and whichever replica polls next makes the attempt again
under the same ``webhook-id`` (delivery is at least once; receivers drop repeats by that id).
A non-2xx answer, a timeout or a connection error is retried after an exponential backoff
(``initial_backoff_seconds`` doubling, at most ``max_backoff_seconds``) while the delivery is
younger than ``retry_period_seconds``; a refused target (a non-public address not allowed, an
endpoint no longer configured, a per-request URL without the server's secret) fails at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time

from standardwebhooks import Webhook

from turnwire_server.event_waits import cancelled
from turnwire_server.store.webhooks import AttemptResult, WebhookDeliveryRecord, WebhookStore
from turnwire_server.webhooks.settings import WebhookSettings
from turnwire_server.webhooks.signing import Signers, signed_headers, webhook_body
from turnwire_server.webhooks.targets import CallOutcome, WebhookCaller

__all__ = ["WebhookOutbox", "backoff_seconds"]

log = logging.getLogger("turnwire.webhooks")

_SWEEP_BATCH = 500


def backoff_seconds(attempt: int, settings: WebhookSettings) -> float:
    """The wait after failed attempt ``attempt`` (from 1): ``initial_backoff_seconds`` doubling
    per attempt, at most ``max_backoff_seconds``."""
    doubled: float = settings.initial_backoff_seconds * 2.0 ** min(attempt - 1, 40)
    return min(doubled, settings.max_backoff_seconds)


class WebhookOutbox:
    """Makes the calls of the deliveries in ``store`` (see the module docstring) as replica
    ``owner``. :meth:`start` in the event loop, :meth:`stop` before the store closes."""

    def __init__(
        self, store: WebhookStore, settings: WebhookSettings, signers: Signers, *, owner: str
    ) -> None:
        self._store = store
        self._settings = settings
        self._signers = signers
        self._owner = owner
        self._caller = WebhookCaller(
            allowed=settings.allowed_networks,
            timeout_seconds=settings.timeout_seconds,
            max_response_bytes=settings.max_response_bytes,
            max_in_flight=settings.max_in_flight,
        )
        self._loop_task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()

    def start(self) -> None:
        """Open the HTTP session and start polling."""
        self._caller.open()
        self._loop_task = asyncio.create_task(self._run(), name="webhook outbox")

    def wake(self) -> None:
        """Poll now (a delivery may have become due)."""
        self._wake.set()

    async def stop(self) -> None:
        """Stop polling and cut open calls short: their leases lapse and another replica (or this
        one after its restart) makes those attempts again."""
        if self._loop_task is not None:
            await cancelled(self._loop_task)
        for call in list(self._calls):
            call.cancel()
        if self._calls:
            await asyncio.gather(*self._calls, return_exceptions=True)
        await self._caller.close()

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except Exception as error:  # the store is away: the next poll retries
                log.error("claiming webhook deliveries failed: %s", error)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.poll_interval_seconds):
                    await self._wake.wait()
            self._wake.clear()

    async def poll(self) -> int:
        """Claim due deliveries up to the free slots and start their attempts; how many started.
        Raises :class:`~turnwire_server.store.errors.StoreError`."""
        free = self._settings.max_in_flight - len(self._calls)
        if free < 1:
            return 0
        now = dt.datetime.now(dt.UTC)
        until = now + dt.timedelta(seconds=self._settings.lease_seconds)
        claimed = await self._store.claim_webhook_deliveries(self._owner, now, until, free)
        for delivery in claimed:
            task = asyncio.create_task(self._attempt(delivery), name=f"webhook {delivery.delivery_id}")
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        return len(claimed)

    async def _attempt(self, delivery: WebhookDeliveryRecord) -> None:
        started = time.monotonic()
        try:
            outcome = await self._call(delivery)
        except Exception as error:  # a row this build cannot make a call of: retrying cannot help
            log.exception("webhook %s: making the call failed", delivery.delivery_id)
            outcome = CallOutcome(None, f"internal error: {type(error).__name__}", refused=True)
        duration_us = int((time.monotonic() - started) * 1_000_000)
        now = dt.datetime.now(dt.UTC)
        result = self._result(delivery, outcome, duration_us, now)
        try:
            moved = await self._store.finish_webhook_attempt(
                delivery.delivery_id, self._owner, delivery.attempt_count, result, now
            )
        except Exception as error:  # the lease lapses and the attempt is made again
            log.error(
                "webhook %s: recording attempt %d failed: %s",
                delivery.delivery_id,
                delivery.attempt_count,
                error,
            )
            return
        level = logging.INFO if result.state != "failed" else logging.WARNING
        log.log(
            level,
            "webhook %s (%s, %s) attempt %d: %s%s",
            delivery.delivery_id,
            delivery.event_type,
            delivery.endpoint or "per-request URL",
            delivery.attempt_count,
            "delivered" if outcome.delivered else outcome.error,
            "" if moved else " (another replica took the delivery over meanwhile)",
        )
        if result.state == "pending" and result.next_attempt_time is not None:
            self._wake_at(result.next_attempt_time)

    async def sweep(self, now: dt.datetime) -> int:
        """Delete the deliveries that ended more than ``retention_seconds`` before ``now`` (a
        maintenance sweep hook); how many went. Raises
        :class:`~turnwire_server.store.errors.StoreError`."""
        before = now - dt.timedelta(seconds=self._settings.retention_seconds)
        deleted = 0
        while (batch := await self._store.delete_webhook_deliveries(before, _SWEEP_BATCH)) > 0:
            deleted += batch
            if batch < _SWEEP_BATCH:
                break
        return deleted

    def _wake_at(self, when: dt.datetime) -> None:
        """Poll again when a retry falls due before the next regular poll would notice."""
        delay = (when - dt.datetime.now(dt.UTC)).total_seconds()
        if delay < self._settings.poll_interval_seconds:
            asyncio.get_running_loop().call_later(max(delay, 0.0), self._wake.set)

    async def _call(self, delivery: WebhookDeliveryRecord) -> CallOutcome:
        target = self._target(delivery)
        if isinstance(target, CallOutcome):
            return target
        url, signer = target
        body = webhook_body(delivery)
        headers = signed_headers(signer, delivery.delivery_id, body, dt.datetime.now(dt.UTC))
        return await self._caller.post(url, body, headers)

    def _target(self, delivery: WebhookDeliveryRecord) -> tuple[str, Webhook] | CallOutcome:
        """The URL and signer of ``delivery``, or the refusal when it has none."""
        if delivery.endpoint is not None:
            found = self._signers.endpoint(delivery.endpoint)
            if found is None:
                return CallOutcome(None, f"endpoint {delivery.endpoint!r} is not configured", refused=True)
            return found
        if delivery.url is None:
            return CallOutcome(None, "the delivery names no target", refused=True)
        if not self._settings.allow_request_urls or self._signers.own is None:
            return CallOutcome(None, "per-request URLs are not allowed by this server", refused=True)
        return delivery.url, self._signers.own

    def _result(
        self, delivery: WebhookDeliveryRecord, outcome: CallOutcome, duration_us: int, now: dt.datetime
    ) -> AttemptResult:
        if outcome.delivered:
            return AttemptResult("delivered", duration_us, outcome.http_status)
        retry_at = now + dt.timedelta(seconds=backoff_seconds(delivery.attempt_count, self._settings))
        deadline = delivery.create_time + dt.timedelta(seconds=self._settings.retry_period_seconds)
        if outcome.refused or retry_at > deadline:
            return AttemptResult("failed", duration_us, outcome.http_status, outcome.error)
        return AttemptResult("pending", duration_us, outcome.http_status, outcome.error, retry_at)
