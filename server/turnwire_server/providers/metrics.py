"""The provider adapters' Prometheus metrics (prometheus-client's default registry).

``provider`` is a configured provider name (the ``provider`` part of ``provider:model``). Failed
steps are counted by the engine (``turnwire_provider_errors_total``, by error class); this
counts the retries that happened before a step succeeded or failed.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx2
from prometheus_client import Counter

RETRIES = Counter(
    "turnwire_provider_retries",
    "Provider requests sent again after a failure: the SDK's retries of error statuses and "
    "connection failures, and Turnwire's of a stream that failed before its first chunk.",
    ["provider"],
)

RETRY_COUNT_HEADER = "x-stainless-retry-count"
"""The header the official Anthropic and OpenAI SDKs put on every attempt of a request: how many
attempts failed before it (``0`` on the first)."""


def count_sdk_retries(provider: str) -> Callable[[httpx2.Request], Awaitable[None]]:
    """An httpx ``request`` event hook that counts each SDK retry of ``provider`` in :data:`RETRIES`."""
    retries = RETRIES.labels(provider)

    async def on_request(request: httpx2.Request) -> None:
        if request.headers.get(RETRY_COUNT_HEADER, "0") != "0":
            retries.inc()

    return on_request
