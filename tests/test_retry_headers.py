"""The retry headers of an HTTP door's refusal (``turnwire_server.http.retry_headers``;
docs/api/http.md, "Retries"), from the refusal's ``google.rpc`` details."""

from __future__ import annotations

import datetime as dt

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from turnwire_server.http.calls import STATUS_DETAILS_KEY, CallEnded
from turnwire_server.http.retry_headers import TURN_RAN, retry_headers


def ended(reason: str = "", delay_s: float | None = None) -> CallEnded:
    details = []
    if reason:
        details.append(any_pb2.Any())
        details[-1].Pack(error_details_pb2.ErrorInfo(reason=reason, domain="turnwire.dev"))
    if delay_s is not None:
        delay = duration_pb2.Duration()
        delay.FromTimedelta(dt.timedelta(seconds=delay_s))
        details.append(any_pb2.Any())
        details[-1].Pack(error_details_pb2.RetryInfo(retry_delay=delay))
    status = status_pb2.Status(code=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], details=details)
    trailer = ((STATUS_DETAILS_KEY, status.SerializeToString()),) if details else ()
    return CallEnded(grpc.StatusCode.RESOURCE_EXHAUSTED, "refused", trailer)


@pytest.mark.parametrize(
    ("reason", "delay_s", "expected"),
    [
        # An overload or a rate limit: the SDKs wait what the server says (up to 60 s), then retry.
        ("OVERLOADED", 0.2, {"retry-after": "1"}),
        ("RATE_LIMITED", 60, {"retry-after": "60"}),
        # Longer than the SDKs wait: they would back off 0.5-8 s instead, so not at all.
        ("RATE_LIMITED", 60.5, {"retry-after": "61", "x-should-retry": "false"}),
        # A spent budget: never soon, with its reset (a day's) or without one (a conversation's).
        ("BUDGET_EXHAUSTED", 3_600, {"retry-after": "3600", "x-should-retry": "false"}),
        ("BUDGET_EXHAUSTED", 5, {"retry-after": "5", "x-should-retry": "false"}),
        ("BUDGET_EXHAUSTED", None, {"x-should-retry": "false"}),
        # Nothing said: the client's own policy.
        ("INVALID_FIELD", None, {}),
        ("", None, {}),
    ],
)
def test_the_headers_follow_the_refusals_details(
    reason: str, delay_s: float | None, expected: dict[str, str]
) -> None:
    assert retry_headers(ended(reason, delay_s)) == expected


def test_a_turn_that_ran_is_not_sent_again() -> None:
    assert dict(TURN_RAN) == {"x-should-retry": "false"}
    with pytest.raises(TypeError):
        TURN_RAN["x-should-retry"] = "true"  # type: ignore[index]  # shared: read-only
