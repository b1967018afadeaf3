"""The streaming loop every SDK adapter shares.

An adapter gives :func:`run_stream`:

- ``open_response``: an async context manager that sends the request through
  the SDK (``client.post(path, content=…, stream=True)`` with the JSON body encoded by
  :mod:`~turnwire_server.providers.json_body`, or the API's
  ``client.<api>.with_streaming_response.create(..., stream=True)``), so the SDK builds
  the HTTP request, authenticates, applies its retries to error statuses and connection
  failures, and raises its typed errors; entering it yields an object whose
  ``http_response`` is the 2xx response, unread;
- a :class:`Decoder` that turns ``(event, data)`` SSE pairs (:mod:`turnwire_server.providers.sse`)
  into :data:`ModelChunk`s, raising :class:`ProviderError` for error events;
- ``map_error``: its SDK's exceptions → :class:`ProviderError`.

Rules it enforces (issue 3):

- Retries happen only before the first chunk reaches the engine. The SDK retries
  failed HTTP attempts; a failure after the 2xx response opened (an ``error``
  event such as Anthropic ``overloaded_error``, a dropped connection) is retried
  here, up to ``retries`` times, only while nothing was yielded. After that the
  error ends the step.
- Closing the returned iterator (``aclose``, or cancelling its consumer) leaves
  the SDK's context manager, which closes the HTTP response at once.
- After the terminal event the rest of the body is drained (≤ 0.25 s) so the
  connection can be reused.
- Every error of the exchange names the endpoint called: errors found in the
  stream (error events, streams cut short, lines that are not JSON) get it here
  (:func:`errors.naming_endpoint`), the decoders not knowing the URL.
- A server that answers the streaming request with one complete JSON response
  (``content-type: application/json``, or a body that starts with ``{``, which
  no event stream does; some OpenAI-compatible servers do when tools are
  offered) gets it read whole and handed to :meth:`Decoder.whole`: one step
  with the same chunks its stream would have given, or a ProviderError at once,
  never retried, when the body is not the API's response object.

:class:`SdkProvider` is the provider side every SDK adapter shares: the
allow-list, the per-request SDK options (retries, headers, the trace context, timeout, extra body)
and the call to :func:`run_stream`; an adapter supplies its request
(:meth:`SdkProvider._prepare`), its SDK method and its error mapping.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, ClassVar, Generic, NamedTuple, Protocol, Self, TypeVar

import httpx2
from opentelemetry import propagate

from turnwire.providers import ModelRequest, ProviderError
from turnwire.types import FinishStep, ModelChunk, Usage, UsageUpdate
from turnwire_server.providers import errors, metrics
from turnwire_server.providers.json_body import JsonBodies
from turnwire_server.providers.sse import iter_sse

DRAIN_SECONDS = 0.25
MAX_RETRY_DELAY = 8.0
NOTHING: tuple[ModelChunk, ...] = ()

EventReader = Callable[[AsyncIterator[bytes]], AsyncIterator[tuple[bytes, bytes]]]
"""A response body's framing: byte chunks → ``(event, data)`` pairs (:func:`iter_sse`)."""


class Decoder(Protocol):
    """Turns one provider's SSE events into chunks. ``done`` is set by the terminal event."""

    done: bool

    def feed(self, event: bytes, data: bytes) -> Sequence[ModelChunk]:
        """Chunks for one event. Raises ProviderError for an error event."""
        ...

    def end(self) -> Sequence[ModelChunk]:
        """The stream ended without a terminal event: the final chunks, or raise ProviderError."""
        ...

    def whole(self, body: bytes) -> Sequence[ModelChunk]:
        """A complete non-streamed response body: all chunks of the step, or raise ProviderError."""
        ...


def map_transport_error(provider: str, error: BaseException, *, in_stream: bool) -> ProviderError | None:
    """``httpx2`` errors (drop, reset, read timeout) → ProviderError; ``in_stream`` when raised while
    reading a 2xx response."""
    if isinstance(error, httpx2.TimeoutException):
        return errors.connection_error(provider, error, timeout=True, in_stream=in_stream)
    if isinstance(error, httpx2.HTTPError | httpx2.StreamError | OSError):
        return errors.connection_error(provider, error, in_stream=in_stream)
    return None


class Attempt:
    """How far one attempt of a step got: ``opened`` once its response began (a failure after that
    is in the stream, and may be retried while nothing was yielded); ``endpoint`` the request's
    ``"POST http://host/path"``, named in its errors."""

    __slots__ = ("endpoint", "opened")

    def __init__(self) -> None:
        self.opened = False
        self.endpoint: str | None = None


AttemptStream = Callable[[Attempt], AsyncGenerator[ModelChunk, None]]
"""One attempt of a step: its chunks, updating the :class:`Attempt` it is given."""


async def run_stream(
    provider: str,
    open_response: Callable[[], AbstractAsyncContextManager[Any]],
    new_decoder: Callable[[], Decoder],
    map_error: Callable[[BaseException], ProviderError | None],
    *,
    retries: int,
    retry_delay: float = 0.5,
    read_events: EventReader = iter_sse,
) -> AsyncGenerator[ModelChunk, None]:
    """Stream one step; see the module docstring for the retry, cancel and drain rules.

    ``read_events`` turns the 2xx body into ``(event, data)`` pairs for the decoder: server-sent
    events by default; Bedrock's AWS event stream (:mod:`.aws_event_stream`) otherwise.
    """

    async def attempt(state: Attempt) -> AsyncGenerator[ModelChunk, None]:
        decoder = new_decoder()
        async with open_response() as response:
            state.opened = True
            http = response.http_response
            state.endpoint = errors.endpoint_of(http.request)
            whole, body = await _whole_json(provider, http.aiter_bytes(), http.headers.get("content-type"))
            if whole is not None:
                for chunk in decoder.whole(whole):
                    yield chunk
                return
            events = read_events(body)
            async for event, data in events:
                for chunk in decoder.feed(event, data):
                    yield chunk
                if decoder.done:
                    break
            if not decoder.done:
                for chunk in decoder.end():
                    yield chunk
                return
            # Drain what follows the terminal event (usually nothing) so the connection is reused.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(DRAIN_SECONDS):
                    async for _ in events:
                        pass

    async for chunk in retry_before_first_chunk(
        provider, attempt, map_error, retries=retries, retry_delay=retry_delay
    ):
        yield chunk


async def retry_before_first_chunk(
    provider: str,
    attempt_stream: AttemptStream,
    map_error: Callable[[BaseException], ProviderError | None],
    *,
    retries: int,
    retry_delay: float = 0.5,
) -> AsyncGenerator[ModelChunk, None]:
    """The chunks of ``attempt_stream``, attempted again (up to ``retries`` times) when it fails
    retryably after its response opened and before any content was yielded; see the module
    docstring. Closing this generator closes the attempt's at once (its response with it).

    Usage reported by attempts that failed and were retried is carried into the next attempt's
    usage (its ``UsageUpdate``\\ s and ``FinishStep``): every model call counts
    (docs/semantics.md §11). A ``UsageUpdate`` alone does not stop a retry: it is not content.
    """
    attempt = 0
    carry = _UsageCarry()
    while True:
        state = Attempt()
        sent = False
        try:
            async with contextlib.aclosing(attempt_stream(state)) as chunks:
                async for chunk in chunks:
                    sent = sent or carry.is_content(chunk)
                    yield carry.apply(chunk)
            return
        except ProviderError as error:
            failure = errors.naming_endpoint(error, state.endpoint) if error.in_stream else error
        except Exception as exc:
            mapped = map_error(exc) or map_transport_error(provider, exc, in_stream=state.opened)
            if mapped is None:
                raise
            mapped = errors.naming_endpoint(mapped, state.endpoint)
            if sent or not state.opened or not mapped.retryable or attempt >= retries:
                raise mapped from exc
            failure = mapped
        if sent or not state.opened or not failure.retryable or attempt >= retries:
            raise failure
        carry.next_attempt()
        delay = failure.retry_after_seconds
        if delay is None:
            delay = min(retry_delay * (2**attempt), MAX_RETRY_DELAY) * (0.75 + random.random() / 4)
        attempt += 1
        metrics.RETRIES.labels(provider).inc()
        await asyncio.sleep(delay)


class _UsageCarry:
    """The usage of retried attempts, added to what the next attempt reports."""

    __slots__ = ("_attempt", "_carried")

    def __init__(self) -> None:
        self._carried = Usage()
        self._attempt = Usage()

    @staticmethod
    def is_content(chunk: ModelChunk) -> bool:
        return not isinstance(chunk, UsageUpdate)

    def apply(self, chunk: ModelChunk) -> ModelChunk:
        if isinstance(chunk, UsageUpdate):
            self._attempt = chunk.usage
            return UsageUpdate(self._plus(chunk.usage)) if self._carried.total_tokens else chunk
        if isinstance(chunk, FinishStep) and self._carried.total_tokens:
            chunk.usage = self._plus(chunk.usage)
        return chunk

    def next_attempt(self) -> None:
        self._carried = self._plus(self._attempt)
        self._attempt = Usage()

    def _plus(self, usage: Usage) -> Usage:
        total = Usage()
        total.add(self._carried)
        total.add(usage)
        return total


HTML_EXCERPT_BYTES = 65_536
"""How much of an HTML page answered to a streaming request is read for the error (the rest is not)."""

WRONG_PAGE = (
    "an HTML page, not an event stream; check base_url, which must be the API's root "
    "(e.g. http://host:port/v1), not a web page"
)


async def _whole_json(
    provider: str, body: AsyncIterator[bytes], content_type: str | None
) -> tuple[bytes | None, AsyncIterator[bytes]]:
    """``(the whole body, _)`` when the response is one JSON document (its content type says JSON, or
    it starts with ``{``, which no event stream does: SSE lines start with a field name, ``:`` or a
    line break); else ``(None, the body to read as SSE)``, the bytes already read put back in front.

    Raises ProviderError (``invalid_response``, not retryable) for an HTML page (its content type
    says HTML, or it starts with ``<``): a ``base_url`` pointing at a web server or a proxy's page
    answers 200 this way, and reading it as events would only say the stream ended early."""
    kind = (content_type or "").lower()
    if "json" in kind:
        return b"".join([chunk async for chunk in body]), body
    first = b""
    async for chunk in body:
        first += chunk
        if first.strip():
            break
    if "html" in kind or first.lstrip()[:1] == b"<":
        async for chunk in body:
            if len(first) >= HTML_EXCERPT_BYTES:
                break
            first += chunk
        raise errors.invalid_response(provider, WRONG_PAGE, first[:HTML_EXCERPT_BYTES])
    if first.lstrip()[:1] == b"{":
        return first + b"".join([chunk async for chunk in body]), body
    return None, _prepend(first, body)


async def _prepend(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    if first:
        yield first
    async for chunk in rest:
        yield chunk


class SdkClient(Protocol):
    """What :class:`SdkProvider` uses of an SDK client (``AsyncAnthropic``, ``AsyncOpenAI``)."""

    max_retries: int

    def with_options(self, *, max_retries: int) -> Self:
        """A copy with other options (here: the retry count)."""
        ...

    async def close(self) -> None:
        """Close the client and its connections."""
        ...


ClientT = TypeVar("ClientT", bound=SdkClient)
T = TypeVar("T")

OpenStream = Callable[..., AbstractAsyncContextManager[Any]]
"""An SDK's ``with_streaming_response.create``: called with the request's arguments and ``stream=True``."""


class SdkCall(NamedTuple):
    """One step's request, as an adapter prepares it: the SDK method's own arguments (``kwargs``), the
    fields the SDK does not know (``extra_body``, sent as is) and the decoder factory for its stream."""

    kwargs: dict[str, Any]
    extra_body: dict[str, Any]
    new_decoder: Callable[[], Decoder]


class SdkProvider(Generic[ClientT]):
    """An official-SDK provider: streams steps through ``client`` with :func:`run_stream`.

    ``models`` is an optional allow-list for :meth:`has_model`; ``retry_delay`` the
    base delay (seconds) between in-stream retries. Subclasses set ``type`` and
    implement :meth:`_prepare`, :meth:`_create` and :meth:`_map_error`.
    """

    type: ClassVar[str]
    json_path: ClassVar[str | None] = None
    """The API's path, when a step's request may be posted as JSON encoded here (the SDK's
    ``post(content=…)``, :mod:`~turnwire_server.providers.json_body`); None: always through
    :meth:`_create`."""
    json_fields: ClassVar[frozenset[str]] = frozenset()
    """The :meth:`_create` arguments that are body fields as they are. A call whose ``kwargs`` hold
    another (a header or a transport option given in provider options) goes through
    :meth:`_create`, which knows where the SDK puts it."""
    stream_cls: ClassVar[Any]
    """The SDK's ``AsyncStream[object]`` for :attr:`json_path` posts (only its raw response is read)."""

    def __init__(
        self, name: str, client: ClientT, *, models: Sequence[str] = (), retry_delay: float = 0.5
    ) -> None:
        self.name = name
        self.client = client
        self.models = frozenset(models)
        self.retry_delay = retry_delay

    def has_model(self, model: str) -> bool:
        """True unless an allow-list is configured and ``model`` is not on it."""
        return not self.models or model in self.models

    def _prepare(self, request: ModelRequest) -> SdkCall:
        """The SDK call for ``request``; raises ProviderError for a request the API would reject."""
        raise NotImplementedError

    def _events(self, body: AsyncIterator[bytes]) -> AsyncIterator[tuple[bytes, bytes]]:
        """The ``(event, data)`` pairs of a 2xx body: server-sent events, unless the platform
        frames its stream otherwise (Bedrock)."""
        return iter_sse(body)

    def _json_post(self, kwargs: dict[str, Any], extra_body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The path and body of a step posted as JSON (:attr:`json_path`): the body the SDK method
        would send, ``{**kwargs, "stream": True, **extra_body}``. A platform whose SDK client moves
        fields into the URL (Bedrock, Vertex AI) says where here."""
        assert self.json_path is not None
        return self.json_path, {**kwargs, "stream": True, **extra_body}

    def _create(self, client: ClientT) -> OpenStream:
        """The SDK's ``with_streaming_response.create`` of this API on ``client``."""
        raise NotImplementedError

    def _map_error(self, error: BaseException) -> ProviderError | None:
        """The SDK's exceptions → ProviderError (None for anything else)."""
        raise NotImplementedError

    async def _unary(self, call: Awaitable[T]) -> T:
        """Await one non-streaming SDK call (token counting); its SDK errors raised as
        ProviderError, like :meth:`stream`'s."""
        try:
            return await call
        except Exception as error:
            mapped = self._map_error(error)
            if mapped is None:
                raise
            raise mapped from error

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        """Stream one step. Raises ProviderError (see :mod:`turnwire_server.providers.errors`)."""
        kwargs, extra_body, new_decoder = self._prepare(request)
        settings = request.settings
        client = self.client
        if settings.max_retries is not None:
            client = client.with_options(max_retries=settings.max_retries)
        headers = dict(settings.headers) if settings.headers else {}
        # The step's span (current here: the engine iterates this stream inside it) continues in
        # the provider's trace: W3C traceparent as a per-request header, since the SDKs' httpx2
        # is not covered by the httpx instrumentation. Nothing is added when no span is recording.
        propagate.inject(headers)
        open_response: Callable[[], AbstractAsyncContextManager[Any]]
        if self.json_path is not None and kwargs.keys() <= self.json_fields:
            # The body the SDK method would send ({**arguments, stream, **extra_body}), encoded
            # here with the transcript's kept JSON instead of copied and encoded whole per step.
            path, body = self._json_post(kwargs, extra_body)
            content = _BODIES.encode(body)
            options: dict[str, Any] = {"headers": headers}
            if settings.timeout_seconds is not None:
                options["timeout"] = settings.timeout_seconds
            open_response = functools.partial(_posted, client, path, content, options, self.stream_cls)
        else:
            extra: dict[str, Any] = {"extra_body": extra_body} if extra_body else {}
            if headers:
                extra["extra_headers"] = headers
            if settings.timeout_seconds is not None:
                extra["timeout"] = settings.timeout_seconds
            create = self._create(client)

            def open_response() -> AbstractAsyncContextManager[Any]:
                return create(stream=True, **kwargs, **extra)

        async for chunk in run_stream(
            self.name,
            open_response,
            new_decoder,
            self._map_error,
            retries=client.max_retries,
            retry_delay=self.retry_delay,
            read_events=self._events,
        ):
            yield chunk

    async def aclose(self) -> None:
        """Close the SDK client and its connections."""
        await self.client.close()


_BODIES = JsonBodies()


class _Posted(NamedTuple):
    """What :func:`run_stream` reads of an opened response: the SDK's ``http_response``."""

    http_response: httpx2.Response


@contextlib.asynccontextmanager
async def _posted(
    client: Any, path: str, content: bytes, options: dict[str, Any], stream_cls: type[Any]
) -> AsyncIterator[_Posted]:
    """POST ``content`` (a JSON body) to ``path`` through the SDK's ``client.post`` (its auth,
    default headers, retries of error statuses and connection failures, typed errors), streamed:
    yields the 2xx response unread; leaving closes it, as ``with_streaming_response`` does."""
    stream = await client.post(
        path,
        cast_to=object,
        content=content,
        options=options,  # the SDK's default headers hold Content-Type: application/json
        stream=True,
        stream_cls=stream_cls,
    )
    try:
        yield _Posted(stream.response)
    finally:
        await stream.close()
