"""What an HTTP door's refusal tells the client about sending the request again
(docs/api/http.md, "Retries").

The official OpenAI SDKs (and every other Stainless-generated SDK) send a request again, twice by
default after 0.5 to 8 s, when it answered 408, 409, 429 or 5xx; they obey an
``x-should-retry: true|false`` header before the status, and wait a ``Retry-After`` only when it
is at most 60 s (openai-python ``_base_client``: ``_should_retry``,
``_calculate_retry_timeout``). So every door answers a refused call with:

- ``Retry-After`` (RFC 9110 §10.2.3, whole seconds, rounded up) when the refusal carries a
  ``google.rpc.RetryInfo`` delay (an overload, a rate limit, a budget's reset);
- ``x-should-retry: false`` when sending it again soon cannot succeed: a spent budget (reason
  ``BUDGET_EXHAUSTED``: refused until its period resets, or for good) or a delay above those
  60 s, which the SDKs would otherwise replace by their own short back-off.

:data:`TURN_RAN` is the header of an answer for a turn that was admitted (a non-streamed call
that failed after its turn's first event, a failed non-streamed Chat Completions turn): sending
the request again would run the turn again, its tool calls and its billed model steps included,
so the client is told not to.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from google.rpc import error_details_pb2

from turnwire_server.http.calls import CallEnded

__all__ = ["SDK_RETRY_AFTER_MAX_S", "TURN_RAN", "retry_headers"]

SDK_RETRY_AFTER_MAX_S: Final = 60.0
"""The longest ``Retry-After`` (seconds) the SDKs wait; above it they back off on their own."""

TURN_RAN: Final[Mapping[str, str]] = MappingProxyType({"x-should-retry": "false"})
"""The header of an answer for a turn that ran (see the module docstring)."""

_NOT_SOON: Final = frozenset({"BUDGET_EXHAUSTED"})
"""``google.rpc.ErrorInfo`` reasons no retry within seconds can get past."""


def retry_headers(ended: CallEnded) -> dict[str, str]:
    """The retry headers (see the module docstring) of the call ``ended`` refused, from its
    ``google.rpc`` details: ``{}`` when it carries neither a RetryInfo delay nor a reason that
    rules a retry out."""
    delay: float | None = None
    for detail in ended.status_details():
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            delay = max(0.0, info.retry_delay.ToTimedelta().total_seconds())
    error = ended.error_info()
    reason = error.reason if error is not None else ""
    headers: dict[str, str] = {}
    if delay is not None:
        headers["retry-after"] = str(math.ceil(delay))
    if reason in _NOT_SOON or (delay is not None and delay > SDK_RETRY_AFTER_MAX_S):
        headers["x-should-retry"] = "false"
    return headers
