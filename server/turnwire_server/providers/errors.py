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
  that an error :func:`turnwire.error_classes.never_retryable` names (an
  overflow, a ``fatal`` class) is never retryable, whatever its status or headers.
- ``retry_after_seconds``: seconds, from ``retry-after-ms`` or ``retry-after``
  (seconds or an HTTP date), else from the body's structured hint (Google's
  ``RetryInfo.retryDelay``), else from the message ("try again in 1.5s").
- ``body``: the whole error body as received (parsed JSON, or the text) for
  ``classify_chat_error``.
- the message names the endpoint called (``"POST http://host/path"``) for every
  error of an HTTP exchange: error statuses, failed connections, timeouts and
  errors inside a stream (:func:`naming_endpoint`), so a wrong ``base_url`` or a
  proxy in the way shows at once. A body that is not JSON (a proxy's HTML page,
  plain text) appears in the message as a one-line excerpt
  (:func:`turnwire_server.providers.wire.excerpt`).
- ``in_stream``: True for every error found after the 2xx response began (error
  events, streams cut short, lines that are not JSON, an error object in a 2xx
  body, a connection dropped while reading); False for error statuses, failed
  connections and requests the adapter refuses to send.

What kind of failure it is (``context_overflow``, ``rate_limit`` …), whether it
may ever be retried and what can fix an overflow are decided by
:mod:`turnwire.error_classes` from these fields alone, so one failure gets one
class, one ``retryable`` and, through ``api/status.py``, one gRPC status,
whatever the shape of the body it came in (docs/semantics.md §11).
"""

from __future__ import annotations

import email.utils
import errno
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import orjson

from turnwire.error_classes import never_retryable, retry_hint_seconds
from turnwire.providers import ProviderError
from turnwire_server.providers.wire import clean_strings, clean_text, excerpt

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
        # Bedrock's exception types (x-amzn-ErrorType, an event stream's :exception-type), lower-cased:
        # https://docs.aws.amazon.com/bedrock/latest/APIReference/API_runtime_InvokeModelWithResponseStream.html
        "throttlingexception",
        "serviceunavailableexception",
        "internalserverexception",
        "modelstreamerrorexception",
        "modeltimeoutexception",
        "modelnotreadyexception",
    }
)


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
    """(message, type, code) from any of the known error body shapes; a body that is not a JSON object
    gives its :func:`excerpt` as the message."""
    if isinstance(body, list) and body and isinstance(body[0], dict):
        return _fields(body[0])  # Google (Vertex AI) wraps its error object in a list
    if not isinstance(body, dict):
        return (excerpt(str(body)) if body is not None else ""), "", ""
    error = body.get("error")
    if isinstance(error, str):  # {"error": "text", ...}
        inner = parse_body(error) if error.lstrip()[:1] == "{" else None
        if isinstance(inner, dict):
            # Ollama passes its runner's (llama.cpp's) JSON error on as the text of "error".
            return _fields(inner)
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
    endpoint: str | None = None,
) -> ProviderError:
    """An error HTTP response (status ≥ 400) as a ProviderError; ``body`` is already parsed (parse_body).

    The message is ``"<provider>: HTTP <status> (<endpoint>): <text>"``: ``endpoint``
    (``"POST http://host/path"``) whatever the status, since a proxy or a wrong host answers any
    status; a 404 or 405 adds "check base_url" (the commonest cause is a ``base_url`` without its
    ``/v1``, which only the called URL shows). ``text`` is the body's message, or an excerpt of a body
    that is not JSON (a proxy's HTML page), else ``fallback_message``."""
    message, type_, code = _fields(body)
    message = clean_text(message)
    if not type_ and headers:
        amz = headers.get("x-amzn-errortype") or headers.get("x-amzn-ErrorType")
        if amz:
            type_ = amz.split(":", 1)[0]
    retryable = status in _RETRYABLE_STATUS or status >= 500 or type_.lower() in _RETRYABLE_TYPES
    if status in (400, 401, 402, 403, 404, 413, 422):
        retryable = False
    if headers:
        should_retry = headers.get("x-should-retry")
        if should_retry in ("true", "false"):
            retryable = should_retry == "true"
    text = message or excerpt(fallback_message) or f"HTTP {status}"
    hint = "; check base_url" if status in (404, 405) else ""
    where = f" ({endpoint}{hint})" if endpoint else ""
    error = ProviderError(
        f"{provider}: HTTP {status}{where}: {text}",
        status=status,
        type=type_,
        code=code,
        retryable=retryable,
        retry_after_seconds=retry_after_seconds(headers),
        body=body,
        provider=provider,
    )
    error.endpoint = endpoint
    return _settle(error)


def _settle(error: ProviderError) -> ProviderError:
    """Apply the rules every builder shares: over a limit (or a spent quota) is never retryable; a
    retryable error without a ``retry-after`` header takes the body's retry hint."""
    if error.retryable and never_retryable(error):
        error.retryable = False
    if error.retryable and error.retry_after_seconds is None:
        error.retry_after_seconds = retry_hint_seconds(error.body, error.message)
    return error


def from_stream_error(provider: str, body: Any) -> ProviderError:
    """An error event inside an HTTP 200 stream (Anthropic ``error``, OpenAI ``{"error":…}``, Responses
    ``error`` / ``response.failed``), or the error object of a 2xx body.

    ``status`` is 0, ``in_stream`` True; ``retryable`` follows the provider's error type (overloaded,
    server errors, rate limits).
    """
    body = clean_strings(body)  # a lone surrogate from a JSON escape would not survive protobuf
    message, type_, code = _fields(body)
    if isinstance(body, dict) and type_ == "error" and not isinstance(body.get("error"), dict):
        type_ = ""  # Responses' top-level {"type":"error","code":…}: "error" is the event type
    retryable = type_.lower() in _RETRYABLE_TYPES or code.lower() in _RETRYABLE_TYPES
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
            in_stream=True,
        )
    )


def endpoint_of(request: Any) -> str | None:
    """``"POST http://host:port/path"`` of an ``httpx2.Request`` (no query string: it may hold a key);
    None when it has no URL."""
    url = getattr(request, "url", None)
    if url is None:
        return None
    return f"{request.method} {url.scheme}://{url.netloc.decode('ascii', 'replace')}{url.path}"


def naming_endpoint(error: ProviderError, endpoint: str | None) -> ProviderError:
    """``error`` with ``endpoint`` named in its message, after its first clause as in the other
    builders' messages (``"p: error in the stream (POST http://h/v1/messages): overloaded_error: …"``),
    or at its end when it has one clause; unchanged when ``endpoint`` is None or already named."""
    if not endpoint:
        return error
    error.endpoint = endpoint
    if endpoint in error.message:
        return error
    prefix = f"{error.provider}: " if error.message.startswith(f"{error.provider}: ") else ""
    head, sep, tail = error.message[len(prefix) :].partition(": ")
    error.message = f"{prefix}{head} ({endpoint}){sep}{tail}"
    error.args = (error.message,)
    return error


def request_endpoint(error: BaseException) -> str | None:
    """``"POST http://host:port/path"`` of the HTTP request ``error`` (an SDK ``APIConnectionError`` or
    an ``httpx2`` error, or their cause) was raised for, without the query string; None when unknown.
    A network error names the endpoint so a wrong ``base_url`` is visible at once."""
    seen: BaseException | None = error
    for _ in range(3):  # the error, its cause, the cause's cause
        if seen is None:
            return None
        try:
            request = getattr(seen, "request", None)
        except RuntimeError:  # httpx: ".request" of an error raised without one
            request = None
        endpoint = endpoint_of(request) if request is not None else None
        if endpoint is not None:
            return endpoint
        seen = seen.__cause__
    return None


def connection_error(
    provider: str,
    error: BaseException,
    *,
    timeout: bool = False,
    in_stream: bool = False,
    endpoint: str | None = None,
) -> ProviderError:
    """No (complete) response: refused, reset, dropped mid-stream (``in_stream``), or timed out.
    Retryable, status 0. The message names ``endpoint`` (default: :func:`request_endpoint` of
    ``error``) so an unreachable or mistyped ``base_url`` shows."""
    kind = "timeout" if timeout else "connection_error"
    detail = str(error) or type(error).__name__
    endpoint = endpoint or request_endpoint(error)
    where = f" ({endpoint})" if endpoint else ""
    failure = ProviderError(
        f"{provider}: {kind.replace('_', ' ')}{where}: {detail}",
        status=0,
        type=kind,
        retryable=True,
        body=None,
        provider=provider,
        in_stream=in_stream,
    )
    failure.endpoint = endpoint
    return failure


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
            provider,
            error.status_code,
            response.headers,
            body,
            fallback_message=error.message,
            endpoint=request_endpoint(error),
        )
    if isinstance(error, sdk.APITimeoutError) and not _refused_as_timeout(error):
        return connection_error(provider, error, timeout=True, endpoint=request_endpoint(error))
    if isinstance(error, sdk.APIConnectionError):
        return connection_error(provider, error.__cause__ or error, endpoint=request_endpoint(error))
    return None


def _refused_as_timeout(error: BaseException) -> bool:
    """Whether an SDK timeout was caused by a connection failure that is no timeout (refused,
    unreachable, reset): the ``openai`` SDK's aiohttp transport maps every
    ``aiohttp.ClientConnectionError`` to ``ConnectTimeout`` (its vendored httpx-aiohttp's
    exception table; the ``anthropic`` SDK's copy maps it to ``ConnectError``), which would tell
    an operator with a mistyped ``base_url`` that the provider is slow. Read from the exception
    chain: an ``OSError`` other than a timeout (aiohttp's connection errors are ``OSError``s)."""
    chain: list[BaseException] = []
    link: BaseException | None = error
    while link is not None and link not in chain:  # a chain may loop back on itself
        chain.append(link)
        link = link.__cause__ or link.__context__
    return any(
        isinstance(link, OSError) and not isinstance(link, TimeoutError) and link.errno != errno.ETIMEDOUT
        for link in chain
    )


def incomplete_stream(provider: str, what: str) -> ProviderError:
    """The stream ended before its terminal event (and without an error event). Retryable, status 0."""
    return ProviderError(
        f"{provider}: the stream ended before {what}",
        status=0,
        type="incomplete_stream",
        retryable=True,
        provider=provider,
        in_stream=True,
    )


AWS_CREDENTIALS = (
    "the AWS default chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE or the entry's "
    "profile in the shared files, SSO, a container or instance role; or AWS_BEARER_TOKEN_BEDROCK"
)
GOOGLE_CREDENTIALS = (
    "Google Application Default Credentials: GOOGLE_APPLICATION_CREDENTIALS, "
    "`gcloud auth application-default login`, or the attached service account"
)
"""Where the cloud platforms' default chains look for credentials, for :func:`no_credentials`."""


def no_credentials(provider: str, where: str, error: BaseException) -> ProviderError:
    """A cloud platform's credential chain found no usable credentials (``where`` says where it
    looks): status 0, type ``authentication_error``, not retryable. Only the exception's class is
    named: its text may quote a credentials file's path or content."""
    return ProviderError(
        f"{provider}: no usable credentials ({type(error).__name__}); they are looked up in {where}",
        status=0,
        type="authentication_error",
        retryable=False,
        provider=provider,
    )


def corrupt_stream(provider: str, problem: str) -> ProviderError:
    """A stream whose framing is broken (an AWS event-stream message with a wrong checksum or
    length): retryable, status 0, like a connection cut mid-stream."""
    return ProviderError(
        f"{provider}: the stream is corrupt: {problem}",
        status=0,
        type="corrupt_stream",
        retryable=True,
        provider=provider,
        in_stream=True,
    )


def invalid_response(provider: str, problem: str, body: bytes | str) -> ProviderError:
    """A 2xx response the adapter cannot read (a non-streamed body that is not the API's response
    object). Not retryable: the server answers this way, it did not fail once."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    return ProviderError(
        f"{provider}: the server answered the streaming request with {problem}: {excerpt(text)}",
        status=0,
        type="invalid_response",
        retryable=False,
        body=text,
        provider=provider,
        in_stream=True,
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
