"""Webhooks (docs/webhooks.md): the ``webhooks:`` settings, the signed body of a call, the
SSRF-guarded HTTP call and the outbox sender every replica runs."""

from turnwire_server.webhooks.outbox import WebhookOutbox
from turnwire_server.webhooks.settings import WebhookSettings
from turnwire_server.webhooks.signing import MissingSecret, Signers

__all__ = ["MissingSecret", "Signers", "WebhookOutbox", "WebhookSettings"]
