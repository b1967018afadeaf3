"""The Gemini adapter (``google-genai``): the Gemini Developer API, or Gemini on Vertex AI.

Request: :mod:`turnwire_server.providers.gemini_request`. The SDK's ``client.aio.models.
generate_content_stream`` sends it (``POST …/models/{model}:streamGenerateContent?alt=sse``; the API
key in ``x-goog-api-key``, or on Vertex AI a bearer token from Application Default Credentials;
its retries of 408, 429 and 5xx; its typed errors) and parses the server-sent events into
``GenerateContentResponse`` objects, which :class:`GeminiDecoder` reads.

Stream (https://ai.google.dev/api/generate-content#method:-models.streamgeneratecontent): each
event is a whole ``GenerateContentResponse`` whose first candidate holds the next parts; the last
has the ``finishReason``; ``usageMetadata`` is cumulative; the stream has no terminal event, so one
that ends without a finish reason failed (retryable, like a cut connection).

Chunks: ``text`` parts → TextStart/Delta/End, one block per run of text; ``thought`` parts
(thought summaries, with ``thinking_config.include_thoughts``) → ReasoningStart/Delta/End;
``function_call`` parts (whole, never split) → ToolInputStart, one ToolInputDelta of the
arguments' JSON and, once the finish reason is known, the ToolCall (``MAX_TOKENS`` → every call
errored, never run). A call's id is Gemini's when it gives one, else ``<prefix>-call<n>``; its
thought signature (base64) and whether the id is Gemini's go in ``provider_metadata["gemini"]``
for the next request. A thought signature on a text part is not kept (Google: optional there).
Other parts (code execution, generated images) are not read.

Finish reasons: ``STOP`` → stop (tool-calls when it called tools), ``MAX_TOKENS`` → length,
``SAFETY``, ``RECITATION``, ``BLOCKLIST``, ``PROHIBITED_CONTENT``, ``SPII``, ``IMAGE_SAFETY`` and
a blocked prompt (``promptFeedback.blockReason``) → content-filter, others → other (raw kept).
Usage: input = ``promptTokenCount`` (cached included) + ``toolUsePromptTokenCount``; output =
``candidatesTokenCount`` + ``thoughtsTokenCount``; reasoning = ``thoughtsTokenCount``; cached input
= ``cachedContentTokenCount`` (implicit caching on Gemini 2.5 and later, or an explicit
``cached_content``). Gemini reports no cache writes.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator, Sequence
from contextvars import ContextVar
from typing import Any, cast

import httpx2
import orjson
from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from opentelemetry import propagate

from turnwire.providers import ModelRequest, ProviderError
from turnwire.types import (
    FinishReason,
    ModelChunk,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputDelta,
    ToolInputStart,
    Usage,
    UsageUpdate,
)
from turnwire_server.providers import errors
from turnwire_server.providers.convert import (
    CallIds,
    PendingCall,
    as_int,
    check_structured_output,
    finish_step,
    finish_tool_calls,
)
from turnwire_server.providers.gemini_request import API, GeminiPlan, build_request
from turnwire_server.providers.streaming import Attempt, retry_before_first_chunk

_FILTERED = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
    }
)
_CONFIG_FIELDS = frozenset(types.GenerateContentConfig.model_fields)

_OPENED: ContextVar[list[httpx2.Response] | None] = ContextVar("turnwire_gemini_responses", default=None)
"""The HTTP responses the current attempt opened (see :func:`async_http_client`)."""


async def _opened(response: httpx2.Response) -> None:
    opened = _OPENED.get()
    if opened is not None:
        opened.append(response)


def async_http_client() -> httpx2.AsyncClient:
    """The SDK's HTTP client (``HttpOptions.httpx_async_client``): httpx2 with an event hook that
    notes each response an attempt opens, so that closing the attempt closes it at once. The
    SDK's stream is nested generators that do not close the response when the outer one is closed
    (it would stay open, and the model go on generating, until garbage collection). Our own client
    also keeps the SDK off aiohttp (installed for the other SDKs), whose responses no such hook sees."""
    return httpx2.AsyncClient(event_hooks={"response": [_opened]})


# Block kinds.
_TEXT, _THINKING = range(2)


class GeminiDecoder:
    """``GenerateContentResponse`` objects → chunks (see the module docstring)."""

    def __init__(self, provider: str, prefix: str, plan: GeminiPlan) -> None:
        self.provider = provider
        self.prefix = prefix
        self.plan = plan
        self.ids = CallIds(plan.call_ids)
        self.block: tuple[int, str] | None = None  # the open block: (kind, id)
        self.blocks = 0
        self.signature = b""  # the open thought block's signature
        self.calls: list[PendingCall] = []
        self.call_metadata: dict[str, dict[str, Any]] = {}
        self.text: list[str] = []
        self.usage: types.GenerateContentResponseUsageMetadata | None = None
        self.finish_reason = ""
        self.blocked = ""
        self.response_id = ""
        self.model = ""

    def feed(self, response: types.GenerateContentResponse) -> Sequence[ModelChunk]:
        """The chunks of one streamed response."""
        out: list[ModelChunk] = []
        self.response_id = response.response_id or self.response_id
        self.model = response.model_version or self.model
        feedback = response.prompt_feedback
        if feedback is not None and feedback.block_reason is not None:
            self.blocked = _name(feedback.block_reason)
        for candidate in (response.candidates or ())[:1]:
            content = candidate.content
            for part in (content.parts if content is not None else None) or ():
                out.extend(self._part(part))
            if candidate.finish_reason is not None:
                self.finish_reason = _name(candidate.finish_reason)
        if response.usage_metadata is not None:
            self.usage = response.usage_metadata
            out.append(UsageUpdate(self._usage()))
        return out

    def _part(self, part: types.Part) -> list[ModelChunk]:
        if part.function_call is not None:
            call = part.function_call
            out = self._close()
            name = call.name or ""
            call_id = self.ids.assign(call.id or "", f"{self.prefix}-call{len(self.calls)}")
            raw = orjson.dumps(call.args or {}).decode()
            self.calls.append(PendingCall(call_id, name, final=raw))
            record: dict[str, Any] = {"id": bool(call.id)}
            if part.thought_signature:
                record["thought_signature"] = base64.b64encode(part.thought_signature).decode()
            self.call_metadata[call_id] = {API: record}
            return [*out, ToolInputStart(call_id, name), ToolInputDelta(call_id, raw)]
        if not part.text:
            return []
        kind = _THINKING if part.thought else _TEXT
        out = [] if self.block is not None and self.block[0] == kind else self._close()
        if self.block is None:
            block_id = f"{self.prefix}-{self.blocks}"
            self.blocks += 1
            self.block = (kind, block_id)
            out.append(ReasoningStart(block_id) if kind == _THINKING else TextStart(block_id))
        block_id = self.block[1]
        if kind == _THINKING:
            self.signature += part.thought_signature or b""
            out.append(ReasoningDelta(block_id, part.text))
        else:
            self.text.append(part.text)
            out.append(TextDelta(block_id, part.text))
        return out

    def _close(self) -> list[ModelChunk]:
        if self.block is None:
            return []
        kind, block_id = self.block
        self.block = None
        if kind == _TEXT:
            return [TextEnd(block_id)]
        signature, self.signature = self.signature, b""
        return [ReasoningEnd(block_id, signature=signature, provider_metadata={API: {"type": "thought"}})]

    def _usage(self) -> Usage:
        usage = self.usage
        if usage is None:
            return Usage()
        input_tokens = as_int(usage.prompt_token_count) + as_int(usage.tool_use_prompt_token_count)
        reasoning = as_int(usage.thoughts_token_count)
        output_tokens = as_int(usage.candidates_token_count) + reasoning
        return Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
            reasoning_tokens=reasoning,
            cached_input_tokens=as_int(usage.cached_content_token_count),
        )

    def end(self) -> Sequence[ModelChunk]:
        """The stream ended: the step's last chunks. Raises ProviderError when no finish reason (nor a
        blocked prompt) came: the stream was cut short."""
        raw = self.finish_reason or self.blocked
        if not raw:
            raise errors.incomplete_stream(self.provider, "a finish reason")
        out = self._close()
        truncated = raw == "MAX_TOKENS"
        for call in finish_tool_calls(self.calls, truncated):
            if isinstance(call, ToolCall):
                call.provider_metadata = self.call_metadata.get(call.tool_call_id)
            out.append(call)
        reason = _finish_reason(raw, bool(self.calls), bool(self.blocked and not self.finish_reason))
        if reason == "stop" and self.plan.output_schema is not None:
            check_structured_output(self.provider, "".join(self.text), self.plan.output_schema)
        metadata: dict[str, Any] = {}
        if self.usage is not None:
            metadata["usage"] = self.usage.model_dump(mode="json", exclude_none=True)
        if self.blocked:
            metadata["block_reason"] = self.blocked
        if self.ids.renamed:
            metadata["tool_call_ids"] = dict(self.ids.renamed)
        step = finish_step(
            reason,
            raw_reason=raw,
            usage=self._usage(),
            response_id=self.response_id,
            response_model=self.model,
            metadata={API: metadata},
            warnings=self.plan.warnings,
        )
        return (*out, step)


def _name(value: Any) -> str:
    """An SDK enum's name (``FinishReason.STOP`` → ``STOP``), or the string it already is."""
    return str(getattr(value, "value", value))


def _finish_reason(raw: str, called: bool, blocked: bool) -> FinishReason:
    if blocked or raw in _FILTERED:
        return FinishReason.CONTENT_FILTER
    if raw == "STOP":
        return FinishReason.TOOL_CALLS if called else FinishReason.STOP
    if raw == "MAX_TOKENS":
        return FinishReason.LENGTH
    return FinishReason.OTHER


def map_gemini_error(provider: str, error: BaseException) -> ProviderError | None:
    """``google-genai``'s and ``google-auth``'s exceptions → ProviderError (None for anything else).
    An ``APIError`` carries the status and Google's error body (``{"error": {"code", "message",
    "status", "details"}}``); credentials that cannot be had are a non-retryable
    ``authentication_error`` (retryable when the token endpoint did not answer)."""
    if isinstance(error, genai_errors.APIError):
        response = error.response
        headers = getattr(response, "headers", None)
        try:
            endpoint = errors.endpoint_of(getattr(response, "request", None))
        except RuntimeError:  # httpx: a response built without its request
            endpoint = None
        body = error.details if error.details else None
        return errors.from_status(
            provider, error.code, headers, body, fallback_message=error.message or "", endpoint=endpoint
        )
    from google.auth.exceptions import GoogleAuthError, TransportError

    if isinstance(error, GoogleAuthError):
        failure = errors.no_credentials(provider, errors.GOOGLE_CREDENTIALS, error)
        failure.retryable = isinstance(error, TransportError)
        return failure
    return None


class GeminiProvider:
    """Streams steps from Gemini through ``client`` (a ``google.genai.Client`` for the Gemini API or
    Vertex AI). ``models``: an optional allow-list for :meth:`has_model`; ``max_retries``: the SDK's
    retry count and the bound for retrying a stream that fails before its first chunk;
    ``timeout_seconds`` per request; ``default_max_tokens``: ``max_output_tokens`` when a turn sets
    none (None: the model's own limit); ``retry_delay``: the base delay (seconds) between in-stream
    retries."""

    type = "gemini"

    def __init__(
        self,
        name: str,
        client: genai.Client,
        *,
        models: Sequence[str] = (),
        max_retries: int = 2,
        timeout_seconds: float = 600.0,
        default_max_tokens: int | None = None,
        retry_delay: float = 0.5,
    ) -> None:
        self.name = name
        self.client = client
        self.models = frozenset(models)
        self.max_retries = max_retries
        self.timeout_seconds = timeout_seconds
        self.default_max_tokens = default_max_tokens
        self.retry_delay = retry_delay

    def has_model(self, model: str) -> bool:
        """True unless an allow-list is configured and ``model`` is not on it."""
        return not self.models or model in self.models

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        """Stream one step. Raises ProviderError (see :mod:`turnwire_server.providers.errors`)."""
        plan = build_request(
            request,
            provider=self.name,
            config_fields=_CONFIG_FIELDS,
            default_max_tokens=self.default_max_tokens,
        )
        settings = request.settings
        retries = self.max_retries if settings.max_retries is None else settings.max_retries
        headers = dict(settings.headers) if settings.headers else {}
        propagate.inject(headers)  # the step's trace goes on at the provider (W3C traceparent)
        timeout = self.timeout_seconds if settings.timeout_seconds is None else settings.timeout_seconds
        config = {
            **plan.config,
            "http_options": types.HttpOptions(
                headers=headers or None,
                timeout=int(timeout * 1000),  # milliseconds
                retry_options=types.HttpRetryOptions(attempts=retries + 1),
            ),
        }
        prefix, name, models = f"s{request.step_number}", self.name, self.client.aio.models

        async def attempt(state: Attempt) -> AsyncGenerator[ModelChunk, None]:
            decoder = GeminiDecoder(name, prefix, plan)
            opened: list[httpx2.Response] = []
            _OPENED.set(opened)  # this task's context: the SDK sends from it (event_hooks)
            try:
                stream = await models.generate_content_stream(
                    model=request.model,
                    contents=plan.contents,
                    config=config,  # type: ignore[arg-type]  # a dict, as the SDK documents
                )
                responses = cast(AsyncGenerator[types.GenerateContentResponse, None], stream)
                async for response in responses:
                    # The request is sent at the first read: an HTTP error comes before this, once
                    # the SDK's own retries are spent, and is not retried again.
                    state.opened = True
                    if state.endpoint is None and opened:
                        state.endpoint = errors.endpoint_of(opened[-1].request)
                    for chunk in decoder.feed(response):
                        yield chunk
                for chunk in decoder.end():
                    yield chunk
            finally:
                _OPENED.set(None)
                for http in opened:
                    await http.aclose()

        async for chunk in retry_before_first_chunk(
            self.name,
            attempt,
            lambda error: map_gemini_error(name, error),
            retries=retries,
            retry_delay=self.retry_delay,
        ):
            yield chunk

    async def aclose(self) -> None:
        """Close the SDK client and its connections, and the HTTP client it was given
        (:func:`async_http_client`), which the SDK leaves to its owner."""
        await self.client.aio.aclose()
        given = self.client._api_client._http_options.httpx_async_client  # the SDK keeps it only here
        if given is not None:
            await given.aclose()
