"""What a webhook call sends: the body made from a delivery row, and its Standard Webhooks headers
(docs/webhooks.md, "The call").

The body is the specification's recommended envelope, ``{"type", "timestamp", "data"}``, made
only from the delivery row (the submission's end as copied in its ending transaction), so every
attempt sends the same bytes. The ids in it are the client's (the tenant prefix of the store
keys removed; the tenant is its own field). Headers: ``webhook-id`` (the delivery id, the same on
every attempt), ``webhook-timestamp`` (this attempt's time, integer seconds) and
``webhook-signature`` (``v1,`` and the base64 HMAC-SHA256 of ``id.timestamp.body``), made by
the maintained ``standardwebhooks`` library's :meth:`Webhook.sign`.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import os
from collections.abc import Mapping

import orjson
from google.rpc import status_pb2
from standardwebhooks import Webhook

from turnwire_server.store.webhooks import WebhookDeliveryRecord
from turnwire_server.tenant_keys import SEPARATOR, tenant_of_key
from turnwire_server.webhooks.settings import WebhookSettings

__all__ = ["MissingSecret", "Signers", "signed_headers", "webhook_body"]

_PREFIX = "whsec_"
_MIN_KEY_BYTES = 24
_SECRET_FORM = "whsec_ and standard base64 of 24-64 random bytes"


class MissingSecret(ValueError):
    """A ``secret_env`` names a variable that is unset, empty or not a Standard Webhooks secret
    (the message names the variable and the setting, never a value)."""


def _local(key: str) -> str:
    tenant = tenant_of_key(key)
    return key.removeprefix(tenant + SEPARATOR) if tenant else key


def webhook_body(delivery: WebhookDeliveryRecord) -> bytes:
    """The JSON body of ``delivery``: ``type`` (its event type), ``timestamp`` (when the
    submission ended, RFC 3339 UTC) and ``data``: ``submission_id``, ``conversation_id``,
    ``state`` (the submission's: completed, error, aborted, skipped), ``tenant`` (when not the
    default) and, when it failed or was cancelled, ``error`` ``{code, message}`` (the
    ``google.rpc.Code`` number and its message, tenant prefixes removed)."""
    tenant = tenant_of_key(delivery.submission_id)
    data: dict[str, object] = {
        "submission_id": _local(delivery.submission_id),
        "conversation_id": _local(delivery.conversation_id),
        "state": delivery.submission_state,
    }
    if tenant:
        data["tenant"] = tenant
    if delivery.error is not None:
        status = status_pb2.Status.FromString(delivery.error)
        message = status.message.replace(tenant + SEPARATOR, "") if tenant else status.message
        data["error"] = {"code": status.code, "message": message}
    envelope = {
        "type": delivery.event_type,
        "timestamp": delivery.create_time.astimezone(dt.UTC).isoformat().replace("+00:00", "Z"),
        "data": data,
    }
    return orjson.dumps(envelope)


def signed_headers(signer: Webhook, delivery_id: str, body: bytes, now: dt.datetime) -> dict[str, str]:
    """The three Standard Webhooks headers of one attempt at ``now``."""
    timestamp = dt.datetime.fromtimestamp(int(now.timestamp()), dt.UTC)
    return {
        "webhook-id": delivery_id,
        "webhook-timestamp": str(int(timestamp.timestamp())),
        "webhook-signature": signer.sign(delivery_id, timestamp, body.decode()),
    }


class Signers:
    """The signing keys, read once from the environment at start: one per endpoint, and the
    server's own (for per-request URLs) when configured. Raises :class:`MissingSecret` at
    construction for a variable that is unset or holds no valid secret, so a bad setup stops
    the start instead of failing every call."""

    def __init__(self, settings: WebhookSettings, environ: Mapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        self._endpoints = {
            name: _signer(env, endpoint.secret_env, f"webhooks.endpoints.{name}.secret_env")
            for name, endpoint in settings.endpoints.items()
        }
        self._urls = {name: endpoint.url for name, endpoint in settings.endpoints.items()}
        self._own = (
            None if settings.secret_env is None else _signer(env, settings.secret_env, "webhooks.secret_env")
        )

    def endpoint(self, name: str) -> tuple[str, Webhook] | None:
        """The URL and signer of the endpoint ``name``; None when it is not configured (any
        more)."""
        signer = self._endpoints.get(name)
        return None if signer is None else (self._urls[name], signer)

    @property
    def own(self) -> Webhook | None:
        """The server's own signer (per-request URLs), None when ``webhooks.secret_env`` is unset."""
        return self._own


def _signer(env: Mapping[str, str], variable: str, setting: str) -> Webhook:
    """The signer of the secret in ``variable``. Checked strictly, as every verifier decodes it:
    standard base64 (the Python library's lenient decoding drops ``-`` and ``_``, so a URL-safe
    secret signed with another key than the one Node.js's or Go's verifier refuses to read), of
    at least 24 bytes (the specification's minimum; ``whsec_mysecret`` is six)."""
    value = env.get(variable, "").strip()  # a file's trailing newline is no part of it
    if not value:
        raise MissingSecret(
            f"{setting} names the environment variable {variable}, which is unset or empty; set it "
            f"to a signing secret ({_SECRET_FORM})"
        )
    try:
        key = base64.b64decode(value.removeprefix(_PREFIX), validate=True)
    except binascii.Error:
        raise MissingSecret(
            f"the environment variable {variable} ({setting}) holds no valid signing secret: it is "
            f"not standard base64 after whsec_ (URL-safe '-' and '_' are not read alike by every "
            f"verifier); it must be {_SECRET_FORM}"
        ) from None
    if len(key) < _MIN_KEY_BYTES:
        raise MissingSecret(
            f"the environment variable {variable} ({setting}) holds a signing secret of {len(key)} "
            f"bytes; it must be {_SECRET_FORM}"
        )
    try:
        return Webhook(value)
    except Exception as error:  # binascii.Error, EmptyWebhookSecretError …: the library raises several kinds
        raise MissingSecret(
            f"the environment variable {variable} ({setting}) holds no valid signing secret "
            f"({type(error).__name__}); it must be whsec_ and base64, as Standard Webhooks secrets are"
        ) from None
