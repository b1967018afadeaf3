"""Webhooks at the API (docs/webhooks.md): the check of a request's ``WebhookTarget`` and the
``ListWebhookDeliveries`` RPC of ``turnwire.v1.ChatService``.

A target names a configured endpoint or, when ``webhooks.allow_request_urls`` is on, gives its
own http(s) URL (a literal IP address is checked at once against the same rules the call
applies; a name is checked on its resolved addresses at each call). The listing is scoped to
the caller's tenant: it lists only deliveries of submissions whose keys carry its prefix.
"""

from __future__ import annotations

import ipaddress
from typing import Any
from urllib.parse import urlsplit

import grpc
from google.protobuf import duration_pb2

from turnwire_client.v1 import webhook_pb2
from turnwire_server.api.resources import timestamp
from turnwire_server.api.status import invalid_argument, invalid_page_token, status_error_of
from turnwire_server.api.tenancy import listing_prefix
from turnwire_server.api.turn_streams import abort
from turnwire_server.api.validation import check_id
from turnwire_server.store.errors import InvalidPageToken, StoreError
from turnwire_server.store.webhooks import WebhookDeliveryRecord
from turnwire_server.url_check import check_http_url, numeric_host_problem
from turnwire_server.webhooks.settings import ENDPOINT_NAME, WebhookSettings
from turnwire_server.webhooks.targets import refusal_of

__all__ = ["WebhookRpcs", "check_webhook_target", "delivery_proto"]

_STATES: dict[str, int] = {
    "pending": webhook_pb2.WEBHOOK_DELIVERY_STATE_PENDING,
    "delivered": webhook_pb2.WEBHOOK_DELIVERY_STATE_DELIVERED,
    "failed": webhook_pb2.WEBHOOK_DELIVERY_STATE_FAILED,
}
_STATE_NAMES = {number: name for name, number in _STATES.items()}
_DEFAULT_PAGE_SIZE = 50
_MAX_PAGE_SIZE = 100
_MAX_URL_CHARS = 2048


def check_webhook_target(
    request: Any, field: str, settings: WebhookSettings, violations: list[tuple[str, str]]
) -> tuple[str | None, str | None]:
    """The ``(endpoint, url)`` of ``request.<field>`` (a ``WebhookTarget``; both None when unset),
    appending a ``(field path, what to fix)`` to ``violations`` for an unknown endpoint, a URL
    the server does not accept, or both given. Reusable by every request that carries a target."""
    if not request.HasField(field):
        return None, None
    target: webhook_pb2.WebhookTarget = getattr(request, field)
    if target.endpoint and target.url:
        violations.append((field, "set either endpoint or url, not both"))
        return None, None
    if target.endpoint:
        if not ENDPOINT_NAME.fullmatch(target.endpoint) or target.endpoint not in settings.endpoints:
            violations.append(
                (
                    f"{field}.endpoint",
                    f"names no endpoint configured on this server ({target.endpoint[:64]!r}); use a "
                    "name from its webhooks.endpoints (ask its operator)",
                )
            )
            return None, None
        return target.endpoint, None
    if target.url:
        return None, _checked_url(target.url, f"{field}.url", settings, violations)
    violations.append((field, "set endpoint (a configured endpoint's name) or url"))
    return None, None


def _checked_url(
    url: str, path: str, settings: WebhookSettings, violations: list[tuple[str, str]]
) -> str | None:
    if not settings.allow_request_urls:
        violations.append(
            (path, "this server takes no per-request webhook URLs; name a configured endpoint instead")
        )
        return None
    if len(url) > _MAX_URL_CHARS:
        violations.append((path, f"is {len(url)} characters; at most {_MAX_URL_CHARS}"))
        return None
    try:
        check_http_url(url, "https://app.example.com/hooks")
    except ValueError as error:
        violations.append((path, str(error)))
        return None
    if urlsplit(url).username is not None:
        violations.append((path, "must not hold credentials (user:password@); the call is signed instead"))
        return None
    if (problem := numeric_host_problem(urlsplit(url).hostname or "")) is not None:
        violations.append((path, problem))
        return None
    try:
        address = ipaddress.ip_address(urlsplit(url).hostname or "")
    except ValueError:
        return url  # a name: checked on its resolved addresses at each call
    reason = refusal_of(address, settings.allowed_networks)
    if reason is not None:
        violations.append((path, f"is a {reason} address, which this server's webhooks do not call"))
        return None
    return url


def _duration(us: int) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromMicroseconds(us)
    return duration


def delivery_proto(record: WebhookDeliveryRecord) -> webhook_pb2.WebhookDelivery:
    """The API's view of a stored delivery (store keys as they are: the tenancy layer unscopes
    ``submission_id`` and ``conversation_id`` on the way out)."""
    proto = webhook_pb2.WebhookDelivery(
        delivery_id=record.delivery_id,
        submission_id=record.submission_id,
        conversation_id=record.conversation_id,
        event_type=record.event_type,
        target=webhook_pb2.WebhookTarget(endpoint=record.endpoint or "", url=record.url or ""),
        state=_STATES[record.state],  # type: ignore[arg-type]
        create_time=timestamp(record.create_time),
    )
    if record.next_attempt_time is not None and record.state == "pending":
        proto.next_attempt_time.CopyFrom(timestamp(record.next_attempt_time))
    if record.end_time is not None:
        proto.end_time.CopyFrom(timestamp(record.end_time))
    for attempt in record.attempts:
        item = proto.attempts.add(
            attempt=attempt.attempt,
            start_time=timestamp(attempt.start_time),
            http_status=attempt.http_status or 0,
            error=attempt.error or "",
        )
        if attempt.duration_us is not None:
            item.duration.CopyFrom(_duration(attempt.duration_us))
    return proto


class WebhookRpcs:
    """``ListWebhookDeliveries``: a mixin of the ChatService servicer (it supplies ``store``)."""

    async def ListWebhookDeliveries(
        self: Any,
        request: webhook_pb2.ListWebhookDeliveriesRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> webhook_pb2.ListWebhookDeliveriesResponse:
        """Deliveries oldest first, with their attempts, filtered (AIP-158), of the caller's tenant."""
        violations: list[tuple[str, str]] = []
        if request.page_size < 0:
            violations.append(("page_size", "must not be negative; 0 means the default of 50"))
        if request.submission_id:
            check_id(request.submission_id, "submission_id", violations, required=False)
        if request.conversation_id:
            check_id(request.conversation_id, "conversation_id", violations, required=False)
        if request.state and request.state not in _STATE_NAMES:
            violations.append(("state", f"unknown state {request.state}"))
        if violations:
            await abort(context, invalid_argument(violations))
        try:
            records, token = await self.store.list_webhook_deliveries(
                min(request.page_size or _DEFAULT_PAGE_SIZE, _MAX_PAGE_SIZE),
                request.page_token,
                submission_id=request.submission_id,
                conversation_id=request.conversation_id,
                state=_STATE_NAMES.get(request.state, ""),
                id_prefix=listing_prefix(),
            )
        except InvalidPageToken:
            await abort(
                context,
                invalid_page_token(
                    "for these filters", "with the same submission_id, conversation_id and state,"
                ),
            )
            raise AssertionError("unreachable") from None
        except StoreError as error:
            await abort(context, status_error_of(error))
            raise AssertionError("unreachable") from None
        return webhook_pb2.ListWebhookDeliveriesResponse(
            deliveries=[delivery_proto(r) for r in records], next_page_token=token
        )
