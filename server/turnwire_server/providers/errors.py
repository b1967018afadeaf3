"""Provider failures → one normalized :class:`ProviderError`.

Both official SDKs (``anthropic``, ``openai``) raise ``APIStatusError`` for an
HTTP error status, ``APIConnectionError`` / ``APITimeoutError`` when no
response arrived, and let ``httpx2`` errors through while a stream is read.
Each adapter catches its SDK's types and calls one of the builders here, so the
mapping rules live in one place:

- ``status``: the HTTP status; 0 for an error inside an HTTP 200 stream, a
  dropped connection or a timeout.
- ``type`` / ``code``: the provider's error type and code, from the body shapes
  seen in the wild: Anthropic ``{"type":"error","error":{"type","message",
  "details":{"error_code"}}}``, OpenAI ``{"error":{"message","type","param",
  "code"}}``, vLLM/FastChat ``{"object":"error","type","code":400}``, Google
  ``{"error":{"code":400,"status":"INVALID_ARGUMENT"}}``, Bedrock's
  ``x-amzn-ErrorType`` header, and plain text. ``code`` is always a string.
- ``retryable``: the same request may succeed later (408, 409, 429 unless it is
  a quota or a request larger than the limit, 5xx, 529, overloaded, timeouts,
  dropped connections); the ``x-should-retry`` header wins when present, except
  that a request over a limit (see :func:`classify`) is never retryable,
  whatever its status or headers.
- ``retry_after_seconds``: seconds, from ``retry-after-ms`` or ``retry-after``
  (seconds or an HTTP date), else from the body's structured hint (Google's
  ``RetryInfo.retryDelay``), else from the message ("try again in 1.5s").
- ``body``: the whole error body as received (parsed JSON, or the text) for
  ``classify_chat_error``.

:func:`classify` names the kind of failure (``context_overflow``,
``rate_limit`` …, the classes of ``tests/providers/cases/provider_errors.json``)
from the structured fields first (HTTP status, error type, code, quota and
throttling identifiers) and from the message text last, so one failure gets
one class, and through ``api/status.py`` one gRPC status, whatever the shape
of the body it came in (docs/semantics.md §11).
"""

from __future__ import annotations

import email.utils
import re
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any, Literal

import orjson

from turnwire.providers import ProviderError
from turnwire_server.providers.wire import clean_strings, clean_text

_RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
_RETRYABLE_TYPES = frozenset(
    {
        "overloaded_error",
        "api_error",
        "server_error",
        "rate_limit_error",
        "rate_limit_exceeded",
        "timeout_error",
        "service_unavailable",
        "internal_error",
    }
)
# --- classification ------------------------------------------------------------------------------

ErrorClass = Literal[
    "context_overflow",
    "max_output_tokens_invalid",
    "request_too_large",
    "rate_limit",
    "quota_or_billing",
    "overloaded",
    "server_error",
    "server_capacity",
    "invalid_request_transcript",
    "invalid_request",
    "authentication",
    "not_found",
    "transient",
    "invalid_response",
    "unknown",
]
"""What kind of failure a ProviderError is (see :func:`classify`)."""

OVER_LIMIT: frozenset[str] = frozenset({"context_overflow", "max_output_tokens_invalid", "request_too_large"})
"""Classes of a request over a limit (context size, output cap, payload bytes): never retryable."""

# Structured identifiers (error types and codes, lower case), checked before any text.
_QUOTA_IDS = frozenset(
    {
        "insufficient_quota",
        "quota_exceeded",
        "billing_hard_limit_reached",
        "billing_error",
        "payment_required",
    }
)
_RATE_IDS = frozenset(
    {
        "rate_limit_error",
        "rate_limit_exceeded",
        "ratelimiterror",
        "throttlingexception",
        "throttling",
        "too_many_requests",
        "resource_exhausted",
        "requests",
        "tokens",
    }
)
_OVERFLOW_IDS = frozenset(
    {
        "context_length_exceeded",
        "context_window_exceeded",
        "model_context_window_exceeded",
        "exceed_context_size_error",
        "context_overflow",
        "prompt_too_long",
    }
)
_TOO_LARGE_IDS = frozenset(
    {"request_too_large", "payload_too_large", "request_entity_too_large", "string_above_max_length"}
)
_OVERLOADED_IDS = frozenset({"overloaded_error", "overloaded", "service_unavailable", "serviceunavailable"})
_AUTH_IDS = frozenset(
    {"authentication_error", "permission_error", "invalid_api_key", "unauthenticated", "permission_denied"}
)
_NOT_FOUND_IDS = frozenset({"not_found_error", "model_not_found", "not_found"})
_SERVER_IDS = frozenset({"api_error", "server_error", "internal_error", "internal", "internalservererror"})
_TRANSIENT_IDS = frozenset({"connection_error", "timeout", "timeout_error", "incomplete_stream"})
_INVALID_RESPONSE_IDS = frozenset({"invalid_stream_data", "invalid_response", "structured_output_invalid"})
_INVALID_REQUEST_IDS = frozenset(
    {"invalid_request_error", "invalid_request", "badrequesterror", "validationexception", "invalid_argument"}
)

# Message text, checked last and in this order (each pattern's false friends come earlier).
_CAPACITY_TEXT = re.compile(
    r"available memory|out of memory|insufficient (?:\w+ )?memory|not enough memory", re.IGNORECASE
)
_MAX_OUTPUT_TEXT = re.compile(
    r"maximum allowed number of output tokens"
    r"|max_(?:completion_|output_)?tokens'?:? ?\d+ > \d+"
    r"|max_(?:completion_|output_)?tokens'?(?: or '?max_completion_tokens'?)? is too large"
    r"|maximum tokens you requested exceeds"
    r"|supports at most \d+ completion tokens",
    re.IGNORECASE,
)
_OVERFLOW_TEXT = re.compile(
    r"prompt is too long|input is too long|context (?:length|window|size|limit)|maximum prompt length"
    r"|input token count\b.{0,20}exceeds|(?:input|prompt) (?:length|tokens?)\b.{0,30}exceeds? the"
    r"|too many tokens in (?:the )?(?:prompt|input|messages)",
    re.IGNORECASE,
)
_TOO_LARGE_TEXT = re.compile(
    r"request (?:entity |body )?(?:is )?too large|payload too large"
    r"|request exceeds the maximum (?:allowed )?size|request size exceeds",
    re.IGNORECASE,
)
_TRANSCRIPT_TEXT = re.compile(
    r"tool_use.{0,40}without .?tool_result|tool_result.{0,80}(?:corresponding|tool_use)"
    r"|must be followed by tool messages|insufficient tool messages|tool_call_id"
    r"|text content blocks must (?:be non-empty|contain non-whitespace)"
    r"|thinking.{0,80}cannot be modified|roles must alternate|unexpected role|must alternate",
    re.IGNORECASE,
)
_QUOTA_TEXT = re.compile(
    r"insufficient_quota|quota|billing|per day|daily limit|credit|spend limit|monthly limit|payment required",
    re.IGNORECASE,
)
# A rate-limited request that can never fit the limit (one request above the tokens-per-minute budget).
_OVER_RATE_TEXT = re.compile(r"request too large|requested \d+.{0,40}limit \d+", re.IGNORECASE)
_TRY_AGAIN_TEXT = re.compile(r"try again in (\d+(?:\.\d+)?)\s*(ms|s|seconds?)\b", re.IGNORECASE)


def classify_fields(status: int, type_: str, code: str, text: str, body: Any = None) -> ErrorClass:
    """The class of a failure with HTTP ``status`` (0: none), the provider's error ``type`` and
    ``code``, ``text`` (its message) and ``body`` (parsed): structured fields first, text last."""
    ids = {type_.lower(), code.lower()} - {""}
    if ids & _QUOTA_IDS or status == 402:
        return "quota_or_billing"
    if status == 429 or ids & _RATE_IDS:
        # 429 is never an overflow, whatever its text says. A quota that resets within minutes (or a
        # retry hint) is a rate limit; a daily, monthly or billing quota is not.
        window = _quota_window(body)
        if window is not None:
            return "rate_limit" if window == "short" else "quota_or_billing"
        if _body_retry_delay(body, "") is not None:
            return "rate_limit"
        return "quota_or_billing" if _QUOTA_TEXT.search(text) else "rate_limit"
    if ids & _OVERFLOW_IDS:
        return "context_overflow"
    if ids & _TOO_LARGE_IDS:
        return "request_too_large"
    if ids & _OVERLOADED_IDS or status == 529:
        return "overloaded"
    if ids & _AUTH_IDS or status in (401, 403):
        return "authentication"
    if ids & _NOT_FOUND_IDS or status == 404:
        return "not_found"
    if _CAPACITY_TEXT.search(text):
        return "server_capacity"
    if _MAX_OUTPUT_TEXT.search(text):
        return "max_output_tokens_invalid"
    if _OVERFLOW_TEXT.search(text):
        return "context_overflow"
    if status == 413 or _TOO_LARGE_TEXT.search(text):
        return "request_too_large"
    if _TRANSCRIPT_TEXT.search(text):
        return "invalid_request_transcript"
    if _QUOTA_TEXT.search(text) and status in (0, 400, 403):
        return "quota_or_billing"  # e.g. Anthropic's 400 "Your credit balance is too low"
    if ids & _SERVER_IDS or status >= 500:
        return "server_error"
    if ids & _TRANSIENT_IDS or status in (408, 409, 425):
        return "transient"  # dropped connections, timeouts, streams cut short, conflicts
    if ids & _INVALID_RESPONSE_IDS:
        return "invalid_response"
    if status in (400, 422) or ids & _INVALID_REQUEST_IDS:
        return "invalid_request"
    return "unknown"


def _text_of(error: ProviderError) -> str:
    body = error.body
    return f"{error.message} {body}" if isinstance(body, str) else error.message


def classify(error: ProviderError) -> ErrorClass:
    """The class of ``error`` (see :func:`classify_fields`), the same for every body shape."""
    return classify_fields(error.status, error.type, error.code, _text_of(error), error.body)


_LONG_QUOTA = re.compile(r"per ?(?:day|month|year)|daily|monthly", re.IGNORECASE)
_SHORT_QUOTA = re.compile(r"per ?(?:second|minute|hour)", re.IGNORECASE)


def _quota_window(body: Any) -> str | None:
    """``"long"`` / ``"short"`` from the quota identifiers of Google's ``QuotaFailure`` detail
    (``quotaId: GenerateRequestsPerDayPerProjectPerModel``), None when the body names none."""
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    if not isinstance(details, list):
        return None
    ids = [
        f"{violation.get('quotaId', '')} {violation.get('quotaMetric', '')}"
        for detail in details
        if isinstance(detail, dict)
        for violation in detail.get("violations") or ()
        if isinstance(violation, dict)
    ]
    if any(_LONG_QUOTA.search(quota) for quota in ids):
        return "long"
    if any(_SHORT_QUOTA.search(quota) for quota in ids):
        return "short"
    return None


def never_retryable(error: ProviderError) -> bool:
    """True when sending the same request again cannot succeed, whatever the status or headers said:
    a request over a limit, a spent quota, or one request above a whole rate limit."""
    kind = classify(error)
    if kind in OVER_LIMIT or kind == "quota_or_billing":
        return True
    return kind == "rate_limit" and _OVER_RATE_TEXT.search(_text_of(error)) is not None


def _body_retry_delay(body: Any, message: str) -> float | None:
    """A retry hint inside the body: Google's ``RetryInfo`` detail (``"retryDelay": "30s"``), else the
    message's "try again in 1.5s" / "in 20ms"."""
    error = body.get("error") if isinstance(body, dict) else None
    details = error.get("details") if isinstance(error, dict) else None
    if isinstance(details, list):
        for detail in details:
            delay = detail.get("retryDelay") if isinstance(detail, dict) else None
            if isinstance(delay, str) and delay.endswith("s"):
                try:
                    return max(float(delay[:-1]), 0.0)
                except ValueError:
                    pass
    match = _TRY_AGAIN_TEXT.search(message)
    if match is None:
        return None
    value = float(match.group(1))
    return value / 1000.0 if match.group(2).lower() == "ms" else value


def retry_after_seconds(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` / ``retry-after`` (seconds or HTTP date); None when absent."""
    if not headers:
        return None
    value = headers.get("retry-after-ms")
    if value:
        try:
            return max(float(value) / 1000.0, 0.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    parsed = email.utils.parsedate_tz(value)
    if parsed is None:
        return None
    return max(float(email.utils.mktime_tz(parsed)) - time.time(), 0.0)


def parse_body(raw: bytes | str | None) -> Any:
    """The body as JSON when it is JSON, else the stripped text (None when empty)."""
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    text = text.strip()
    if not text:
        return None
    if text[0] in "{[":
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return text


def _fields(body: Any) -> tuple[str, str, str]:
    """(message, type, code) from any of the known error body shapes."""
    if not isinstance(body, dict):
        return (str(body) if body is not None else ""), "", ""
    error = body.get("error")
    if isinstance(error, str):  # {"error": "text", ...}
        return error, str(body.get("type") or ""), _code(body.get("code"))
    source: dict[str, Any] = error if isinstance(error, dict) else body
    message = source.get("message") or body.get("message") or ""
    type_ = source.get("type") or source.get("status") or body.get("type") or ""
    code = source.get("code")
    details = source.get("details")
    if code is None and isinstance(details, dict):
        code = details.get("error_code")
    if code is None:
        code = body.get("code")
    return str(message), str(type_), _code(code)


def _code(value: Any) -> str:
    return "" if value is None else str(value)


def from_status(
    provider: str,
    status: int,
    headers: Mapping[str, str] | None,
    body: Any,
    *,
    fallback_message: str = "",
) -> ProviderError:
    """An error HTTP response (status ≥ 400) as a ProviderError; ``body`` is already parsed (parse_body)."""
    message, type_, code = _fields(body)
    message = clean_text(message)
    if not type_ and headers:
        amz = headers.get("x-amzn-errortype") or headers.get("x-amzn-ErrorType")
        if amz:
            type_ = amz.split(":", 1)[0]
    retryable = status in _RETRYABLE_STATUS or status >= 500 or type_ in _RETRYABLE_TYPES
    if status in (400, 401, 402, 403, 404, 413, 422):
        retryable = False
    if headers:
        should_retry = headers.get("x-should-retry")
        if should_retry in ("true", "false"):
            retryable = should_retry == "true"
    text = message or fallback_message or f"HTTP {status}"
    error = ProviderError(
        f"{provider}: HTTP {status}: {text}",
        status=status,
        type=type_,
        code=code,
        retryable=retryable,
        retry_after_seconds=retry_after_seconds(headers),
        body=body,
        provider=provider,
    )
    return _settle(error)


def _settle(error: ProviderError) -> ProviderError:
    """Apply the rules every builder shares: over a limit (or a spent quota) is never retryable; a
    retryable error without a ``retry-after`` header takes the body's retry hint."""
    if error.retryable and never_retryable(error):
        error.retryable = False
    if error.retryable and error.retry_after_seconds is None:
        error.retry_after_seconds = _body_retry_delay(error.body, error.message)
    return error


def from_stream_error(provider: str, body: Any) -> ProviderError:
    """An error event inside an HTTP 200 stream (Anthropic ``error``, OpenAI ``{"error":…}``, Responses
    ``error``).

    ``status`` is 0; ``retryable`` follows the provider's error type (overloaded, server errors, rate limits).
    """
    body = clean_strings(body)  # a lone surrogate from a JSON escape would not survive protobuf
    message, type_, code = _fields(body)
    if isinstance(body, dict) and type_ == "error" and not isinstance(body.get("error"), dict):
        type_ = ""  # Responses' top-level {"type":"error","code":…}: "error" is the event type
    retryable = type_ in _RETRYABLE_TYPES or code in _RETRYABLE_TYPES
    label = type_ or code or "error"
    return _settle(
        ProviderError(
            f"{provider}: error in the stream: {label}: {message or '(no message)'}",
            status=0,
            type=type_,
            code=code,
            retryable=retryable,
            body=body,
            provider=provider,
        )
    )


def connection_error(provider: str, error: BaseException, *, timeout: bool = False) -> ProviderError:
    """No (complete) response: refused, reset, dropped mid-stream, or timed out. Retryable, status 0."""
    kind = "timeout" if timeout else "connection_error"
    detail = str(error) or type(error).__name__
    return ProviderError(
        f"{provider}: {kind.replace('_', ' ')}: {detail}",
        status=0,
        type=kind,
        retryable=True,
        body=None,
        provider=provider,
    )


def from_sdk_error(provider: str, error: BaseException, sdk: ModuleType) -> ProviderError | None:
    """One of ``sdk``'s exceptions → ProviderError (None for anything else); ``sdk`` is the ``anthropic``
    or ``openai`` module (both generated by Stainless, with the same error classes).

    ``APIStatusError.body`` may be only part of the body (``openai`` keeps the
    inner ``error`` object), so the whole body as received is re-read from the
    response for ``ProviderError.body``.
    """
    if isinstance(error, sdk.APIStatusError):
        response = error.response
        try:
            body = parse_body(response.content)
        except Exception:  # the body was not read
            body = error.body
        return from_status(
            provider, error.status_code, response.headers, body, fallback_message=error.message
        )
    if isinstance(error, sdk.APITimeoutError):
        return connection_error(provider, error, timeout=True)
    if isinstance(error, sdk.APIConnectionError):
        return connection_error(provider, error.__cause__ or error)
    return None


def incomplete_stream(provider: str, what: str) -> ProviderError:
    """The stream ended before its terminal event (and without an error event). Retryable, status 0."""
    return ProviderError(
        f"{provider}: the stream ended before {what}",
        status=0,
        type="incomplete_stream",
        retryable=True,
        provider=provider,
    )


def invalid_response(provider: str, problem: str, body: bytes | str) -> ProviderError:
    """A 2xx response the adapter cannot read (a non-streamed body that is not the API's response
    object). Not retryable: the server answers this way, it did not fail once."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return ProviderError(
        f"{provider}: the server answered the streaming request with {problem}: {text[:300]}",
        status=0,
        type="invalid_response",
        retryable=False,
        body=text,
        provider=provider,
    )


def invalid_request(provider: str, message: str, *, code: str = "") -> ProviderError:
    """A request the adapter refuses to send because the provider would reject its shape. Not retryable."""
    return ProviderError(
        f"{provider}: {message}",
        status=0,
        type="invalid_request_error",
        code=code,
        retryable=False,
        provider=provider,
    )
