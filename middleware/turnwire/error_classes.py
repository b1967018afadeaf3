"""What kind of failure a provider error is: one normalized error, one answer, for every reader.

The adapters normalize every provider failure into one :class:`~turnwire.providers.ProviderError`
(status, type, code, message, raw body, ``in_stream``). The rules here read that one error, and
everything that decides about it calls them: the adapters' "retryable" (:func:`never_retryable`),
the gRPC status the client gets (``turnwire_server/api/status.py``), the built-in
``classify_chat_error`` (:class:`turnwire.middlewares.ErrorClassifier`) and the context-overflow
recovery (:func:`overflow_remedy`, :func:`finish_overflows`). So "retryable", the status and the
classification never disagree about the same error (docs/semantics.md §3, §9, §11).

Public API (pure functions over the error's fields: a few regular-expression searches, no I/O, no
state; any hook may call them on ``ctx.error``):

- :data:`ErrorClass` and :func:`classify_error`: the fine class (``context_overflow``,
  ``rate_limit``, ``quota_or_billing`` … the classes of ``tests/providers/cases/README.md``).
- :func:`coarse_class`: the fine class as a ``classify_chat_error`` answer
  (:data:`COARSE` is the table).
- :func:`overflow_remedy` / :func:`overflow_tokens`: for an overflow, whether compaction can help,
  from the token counts in the message; :func:`fitting_output_tokens`: the output reservation
  that fits, when the remedy is a smaller one.
- :func:`finish_overflows`: a finish reason that says the window is full (not an error).
- :func:`never_retryable`: the one rule that makes an error not retryable whatever its status said.

Rules, in order (the shared cases' README): structured fields first (HTTP status, error type and
code, quota and throttling identifiers), the message text last; a 429, a rate-limit type or a
throttling code is never an overflow whatever its text says; output-limit errors
(``max_tokens: 128000 > 64000``) and payload-bytes errors (``Request exceeds the maximum size``)
are never overflows; an overflow may come with 400, 413, 422, 500, 503 or inside a 200 stream.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from turnwire.providers import ProviderError

ChatErrorClassification = Literal["context_overflow", "rate_limit", "transient", "fatal", "unknown"]
"""What ``classify_chat_error`` may return (re-exported by :mod:`turnwire.hooks`)."""

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
"""What kind of failure an error is (see :func:`classify_error`)."""

OverflowRemedy = Literal["compact", "reduce_max_tokens", "compact_or_reduce_max_tokens"]
"""What can make an overflowing request fit (see :func:`overflow_remedy`)."""

OVER_LIMIT: frozenset[ErrorClass] = frozenset(
    {"context_overflow", "max_output_tokens_invalid", "request_too_large"}
)
"""Classes of a request over a limit (context size, output cap, payload bytes)."""

COARSE: Mapping[ErrorClass, ChatErrorClassification] = MappingProxyType(
    {
        # The prompt (or prompt + reserved output) does not fit the window: compaction may help.
        "context_overflow": "context_overflow",
        # Requests or tokens per minute: waiting helps (unless one request is above the whole limit).
        "rate_limit": "rate_limit",
        # The provider (or the connection to it) failed this time; the same request may succeed.
        "overloaded": "transient",
        "server_error": "transient",
        "transient": "transient",
        # The same request fails again until someone changes something: fatal.
        "quota_or_billing": "fatal",  # credits, spend limits, daily quotas: a person has to act
        "max_output_tokens_invalid": "fatal",  # max_tokens above the model's cap: clamp it, no compaction
        "request_too_large": "fatal",  # payload bytes (images, attachments), not tokens
        "invalid_request_transcript": "fatal",  # malformed history: repair it, do not compact it
        "invalid_request": "fatal",
        "authentication": "fatal",
        "not_found": "fatal",  # unknown model or endpoint
        "invalid_response": "fatal",  # the server answers this way, it did not fail once
        "server_capacity": "fatal",  # a local server lacks memory for this prompt: an operator must act
        "unknown": "unknown",
    }
)
"""The coarse ``classify_chat_error`` answer of every fine class (docs/semantics.md §3)."""

# Structured identifiers (error types and codes, lower case), checked before any text.
_QUOTA_IDS = frozenset(
    {
        "insufficient_quota",
        "quota_exceeded",
        "billing_hard_limit_reached",
        "billing_error",
        "payment_required",
        "servicequotaexceededexception",  # Bedrock: over an account quota
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
_OVERLOADED_IDS = frozenset(
    {
        "overloaded_error",
        "overloaded",
        "service_unavailable",
        "serviceunavailable",
        "serviceunavailableexception",  # Bedrock
        "modelnotreadyexception",  # Bedrock: the model is not ready to serve yet
    }
)
_AUTH_IDS = frozenset(
    {
        "authentication_error",
        "permission_error",
        "invalid_api_key",
        "unauthenticated",
        "permission_denied",
        "accessdeniedexception",  # Bedrock
    }
)
_NOT_FOUND_IDS = frozenset({"not_found_error", "model_not_found", "not_found", "resourcenotfoundexception"})
_SERVER_IDS = frozenset(
    {
        "api_error",
        "server_error",
        "internal_error",
        "internal",
        "internalservererror",
        # Bedrock (an event stream's :exception-type, lower-cased): the service or the model failed.
        "internalserverexception",
        "modelstreamerrorexception",
        "modelerrorexception",
    }
)
_TRANSIENT_IDS = frozenset(
    {
        "connection_error",
        "timeout",
        "timeout_error",
        "incomplete_stream",
        "corrupt_stream",
        "modeltimeoutexception",
    }
)
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
# Anthropic, Bedrock "prompt is too long" / "Input is too long"; OpenAI, Azure, DeepSeek, vLLM, Groq,
# OpenRouter "maximum context length"; llama.cpp, Ollama "exceeds the available context size", "the
# prompt is longer than the context length", "prompt too long; exceeded max context length"; Google
# "input token count exceeds"; xAI "maximum prompt length"; Mistral "too large for model with N
# maximum context length"; Together "longer than the model's context length", and (text-generation-
# inference) "`inputs` tokens + `max_new_tokens` must be <= N"; Bedrock's OpenAI-compatible
# endpoint "prompt tokens (N) exceed model maximum (M)"; Cerebras "Current length is N while limit is
# M"; Z.ai "tokens in request more than max tokens allowed".
_OVERFLOW_TEXT = re.compile(
    r"prompt is too long|input is too long|context (?:length|window|size|limit)|maximum prompt length"
    r"|tokens \+ `?max_new_tokens`? must be <="
    r"|input token count\b.{0,20}exceeds"
    r"|(?:input|prompt) (?:length|tokens?)\b.{0,30}exceeds? (?:the|model max)"
    r"|too many tokens in (?:the )?(?:prompt|input|messages)"
    r"|current length is \d[\d,]* while limit is \d|tokens in (?:the )?request (?:is )?more than",
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
_LONG_QUOTA = re.compile(r"per ?(?:day|month|year)|daily|monthly", re.IGNORECASE)
_SHORT_QUOTA = re.compile(r"per ?(?:second|minute|hour)", re.IGNORECASE)


def classify_error(error: BaseException) -> ErrorClass:
    """The fine class of ``error``.

    A :class:`~turnwire.providers.ProviderError` is classified from its fields
    (:func:`classify_fields`), the same for every body shape. Anything else: a ``TimeoutError``
    (the engine's model timeouts included) or ``ConnectionError`` is ``transient``; every other
    exception (a hook's, a tool's, the store's) is ``unknown``.
    """
    if isinstance(error, ProviderError):
        return classify_fields(error.status, error.type, error.code, _text_of(error), error.body)
    if isinstance(error, TimeoutError | ConnectionError):
        return "transient"
    return "unknown"


def coarse_class(fine: ErrorClass) -> ChatErrorClassification:
    """The ``classify_chat_error`` answer for the fine class ``fine`` (the table :data:`COARSE`):
    ``context_overflow`` and ``rate_limit`` stay; ``overloaded``, ``server_error`` and ``transient``
    are ``transient``; ``unknown`` stays; every other class is ``fatal`` (the same request fails
    again until someone changes something)."""
    return COARSE[fine]


def classify_fields(status: int, type_: str, code: str, text: str, body: Any = None) -> ErrorClass:
    """The class of a failure with HTTP ``status`` (0: none), the provider's error ``type`` and
    ``code``, ``text`` (its message) and ``body`` (parsed JSON, or text): structured fields first,
    text last."""
    ids = {type_.lower(), code.lower()} - {""}
    if ids & _QUOTA_IDS or status == 402:
        return "quota_or_billing"
    if status == 429 or ids & _RATE_IDS:
        # 429 is never an overflow, whatever its text says. A quota that resets within minutes (or a
        # retry hint) is a rate limit; a daily, monthly or billing quota is not.
        window = _quota_window(body)
        if window is not None:
            return "rate_limit" if window == "short" else "quota_or_billing"
        if retry_hint_seconds(body, "") is not None:
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


def never_retryable(error: ProviderError) -> bool:
    """True when sending the same request again cannot succeed, whatever the status or headers said:
    an overflow, a ``fatal`` class (:data:`COARSE`: over a limit, a spent quota, a malformed
    request, …), or one request above a whole rate limit ("Request too large … on tokens per min
    (TPM): Limit 30000, Requested 31538")."""
    coarse = COARSE[classify_error(error)]
    if coarse in ("fatal", "context_overflow"):
        return True
    return coarse == "rate_limit" and _OVER_RATE_TEXT.search(_text_of(error)) is not None


def retry_hint_seconds(body: Any, message: str) -> float | None:
    """A retry hint inside an error body: Google's ``RetryInfo`` detail (``"retryDelay": "30s"``),
    else the message's "try again in 1.5s" / "in 20ms"; None when there is none."""
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


# --- context overflow ------------------------------------------------------------------------------


class OverflowTokens(NamedTuple):
    """Token counts an overflow error states (None: not stated): ``prompt`` (the input: messages,
    functions, tool input, draft tokens), ``output`` (the requested output reservation, e.g.
    ``max_tokens``) and ``window`` (the model's context window)."""

    prompt: int | None
    output: int | None
    window: int | None


_N = r"\d[\d,]*"  # a token count, maybe with thousands separators
# One pattern per wording, with the groups p (prompt), p2 (a second part of the prompt), c (output)
# and w (window), the first match wins. Sources: the entries of tests/providers/cases/
# provider_errors.json and cases_extra/provider_errors_extra.json, which name them.
_TOKEN_WORDINGS = tuple(
    re.compile(pattern, re.IGNORECASE | re.DOTALL)
    for pattern in (
        # OpenAI Chat, Azure OpenAI, DeepSeek, vLLM, Groq: "This model's maximum context length is W
        # tokens. However, you requested T tokens (P in the messages[, F in the functions], C in the
        # completion)."; OpenAI's legacy Completions: "(P in your prompt; C for the completion)".
        rf"maximum context length is (?P<w>{_N}) tokens.*?\((?P<p>{_N}) in (?:the messages|your prompt)"
        rf"(?:,\s*(?P<p2>{_N}) in the functions)?"
        rf"(?:[,;]\s*(?:and\s+)?(?P<c>{_N}) (?:in|for) the completion)?\)",
        # vLLM (vllm-project/vllm#36197): "... maximum context length is W tokens. However, you
        # requested C output tokens and your prompt contains at least P input tokens ..."; Bedrock's
        # OpenAI-compatible endpoint says it without "at least" (gsd-build/gsd-2#5409).
        rf"maximum context length is (?P<w>{_N}) tokens.*?requested (?P<c>{_N}) output tokens"
        rf" and your prompt contains (?:at least )?(?P<p>{_N}) input tokens",
        # vLLM behind Chutes and other hosts (RooCodeInc/Roo-Code#6806): "Requested token count
        # exceeds the model's maximum context length of W tokens. You requested a total of T tokens:
        # P tokens from the input messages and C tokens for the completion."
        rf"maximum context length of (?P<w>{_N}) tokens.*?(?P<p>{_N}) tokens from the input messages"
        rf" and (?P<c>{_N}) tokens for the completion",
        # Bedrock's OpenAI-compatible endpoint (BerriAI/litellm#37862): "prompt tokens (P) exceed
        # model maximum (W) for <model>"
        rf"prompt tokens \((?P<p>{_N})\) exceed model maximum \((?P<w>{_N})\)",
        # OpenRouter: "This endpoint's maximum context length is W tokens. However, you requested
        # about T tokens (P of text input[, P2 of tool input][, C in the output])."
        rf"maximum context length is (?P<w>{_N}) tokens.*?\((?P<p>{_N}) of text input"
        rf"(?:,\s*(?P<p2>{_N}) of tool input)?(?:,\s*(?P<c>{_N}) in the output)?\)",
        # OpenAI (older), FastChat: "... maximum context length is W tokens. However, your messages
        # resulted in P tokens."
        rf"maximum context length is (?P<w>{_N}) tokens.*?your messages resulted in (?P<p>{_N}) tokens",
        # Anthropic (also on Vertex AI): "input length and `max_tokens` exceed context limit: P + C > W"
        rf"exceed context limit: (?P<p>{_N}) \+ (?P<c>{_N}) > (?P<w>{_N})",
        # Anthropic, Bedrock (Anthropic models): "prompt is too long: P tokens > W maximum"
        rf"prompt is too long: (?P<p>{_N}) tokens > (?P<w>{_N})",
        # Together: "The input (P tokens) is longer than the model's context length (W tokens)."
        rf"input \((?P<p>{_N}) tokens\) is longer than the model's context length \((?P<w>{_N}) tokens\)",
        # xAI: "This model's maximum prompt length is W but the request contains P tokens"
        rf"maximum prompt length is (?P<w>{_N}) but the request contains (?P<p>{_N}) tokens",
        # Google Gemini / Vertex: "The input token count (P) exceeds the maximum number of tokens
        # allowed (W)." (Gemini 2.5 leaves out "(P)")
        rf"input token count(?: \((?P<p>{_N})\))? exceeds the maximum number of tokens allowed"
        rf" \((?P<w>{_N})\)",
        # Mistral (docs.mistral.ai/resources/known-limitations): "Prompt contains P tokens[ and D draft
        # tokens], too large for model with W maximum context length"
        rf"prompt contains (?P<p>{_N}) tokens(?: and (?P<p2>{_N}) draft tokens)?, too large for model with"
        rf" (?P<w>{_N}) maximum context length",
        # llama.cpp server (tools/server), and Ollama passing its runner's error on: "request (P
        # tokens) exceeds the available context size (W tokens), try increasing it"
        rf"request \((?P<p>{_N}) tokens\) exceeds the available context size \((?P<w>{_N}) tokens\)",
        # vLLM V1 engine (vllm-project/vllm#12165): "The prompt (total length P) is too long to fit into
        # the model (context length W)."
        rf"prompt \(total length (?P<p>{_N})\) is too long to fit into the model"
        rf" \(context length (?P<w>{_N})\)",
        # text-generation-inference (Together, Hugging Face): "`inputs` tokens + `max_new_tokens` must
        # be <= W. Given: P `inputs` tokens and C `max_new_tokens`"
        rf"must be <= (?P<w>{_N})\. Given: (?P<p>{_N}) `?inputs`? tokens and (?P<c>{_N}) `?max_new_tokens",
        # Ollama (older): "input length exceeds maximum context length (P > W)"
        rf"context length \((?P<p>{_N}) > (?P<w>{_N})\)",
        # Cerebras (cline/cline#5140): "Please reduce the length of the messages or completion.
        # Current length is T while limit is W" (T counts the prompt and the output reservation)
        rf"current length is {_N} while limit is (?P<w>{_N})",
    )
)
# The wording names the output reservation as a cause (Groq "… reduce the length of the messages or
# completion", Anthropic "… decrease input length or `max_tokens`", OpenRouter "… either one").
_NAMES_OUTPUT = re.compile(
    r"completion|max_tokens|max_output_tokens|output tokens|in the output|either one", re.IGNORECASE
)


def overflow_tokens(error: BaseException) -> OverflowTokens:
    """The prompt, output and window token counts ``error`` states (each None when it does not):
    from the body's structured fields where a server sends them (llama.cpp ``n_prompt_tokens`` and
    ``n_ctx``), else from the message (the wordings listed in this module's ``_TOKEN_WORDINGS``)."""
    if not isinstance(error, ProviderError):
        return OverflowTokens(None, None, None)
    body = error.body
    inner = body.get("error") if isinstance(body, dict) else None
    fields = inner if isinstance(inner, dict) else body
    if isinstance(fields, dict) and isinstance(fields.get("n_prompt_tokens"), int):
        n_ctx = fields.get("n_ctx")
        return OverflowTokens(fields["n_prompt_tokens"], None, n_ctx if isinstance(n_ctx, int) else None)
    text = _text_of(error)
    for wording in _TOKEN_WORDINGS:
        match = wording.search(text)
        if match is None:
            continue
        found = {name: int(value.replace(",", "")) for name, value in match.groupdict().items() if value}
        prompt = found.get("p")
        if prompt is not None and "p2" in found:
            prompt += found["p2"]
        return OverflowTokens(prompt, found.get("c"), found.get("w"))
    return OverflowTokens(None, None, None)


def overflow_remedy(error: BaseException) -> OverflowRemedy | None:
    """What can make the request fit, for a ``context_overflow`` (None for any other error).

    With P (prompt), C (requested output) and W (window) from :func:`overflow_tokens`:

    - P ≥ W: ``compact``: the prompt alone does not fit; a smaller output cannot help.
    - C ≥ P: ``reduce_max_tokens``: the output reservation is at least half of what was asked for
      (E09: 64 in the messages, 8192 in the completion of an 8192 window; E15, E33): lowering it
      fits the request without losing history, and when C ≥ W no compaction can ever fit it.
      Compaction is skipped.
    - otherwise, both stated: ``compact_or_reduce_max_tokens`` (E07, E03).
    - only C ≥ W: ``reduce_max_tokens``; only P < W: ``compact_or_reduce_max_tokens`` (the
      reservation pushed it over).
    - no counts: ``compact_or_reduce_max_tokens`` when the wording names the output as a cause
      (E23 Groq "… the messages or completion"), else ``compact`` (an input-only wording, or a
      bare ``context_length_exceeded`` code: E11, E13, E17, E19).

    Source of the expected remedies: ``tests/providers/cases/provider_errors.json``.
    """
    if not isinstance(error, ProviderError) or classify_error(error) != "context_overflow":
        return None
    prompt, output, window = overflow_tokens(error)
    if prompt is not None and window is not None and prompt >= window:
        return "compact"
    if prompt is not None and output is not None:
        return "reduce_max_tokens" if output >= prompt else "compact_or_reduce_max_tokens"
    if output is not None and window is not None and output >= window:
        return "reduce_max_tokens"
    if prompt is not None and window is not None:
        return "compact_or_reduce_max_tokens"
    return "compact_or_reduce_max_tokens" if _NAMES_OUTPUT.search(_text_of(error)) else "compact"


def fitting_output_tokens(error: BaseException) -> int | None:
    """The largest output reservation (``max_tokens``, tokens) that fits the window the overflow
    ``error`` states: window minus prompt (W - P of :func:`overflow_tokens`; both counts are the
    provider's own, so the request then fits exactly). None when the error does not state both
    counts, or when the prompt leaves no room for any output. The engine clamps a step's
    ``max_output_tokens`` to it when the remedy is ``reduce_max_tokens`` (docs/semantics.md §9)."""
    prompt, _, window = overflow_tokens(error)
    if prompt is None or window is None or window - prompt < 1:
        return None
    return window - prompt


_OVERFLOW_FINISH = frozenset({"model_context_window_exceeded"})


def finish_overflows(raw_finish_reason: str) -> bool:
    """True when a step's raw finish reason (``FinishStep.raw_finish_reason``) says the context window
    filled up: the response is valid but truncated (the adapter reports finish ``length``); compact
    before the next model call.

    Anthropic's ``model_context_window_exceeded`` stop reason
    (https://docs.anthropic.com/en/api/handling-stop-reasons), the same on Bedrock and Vertex AI,
    which pass Anthropic's stop reasons through. A plain output limit (``max_tokens``, ``length``)
    is not an overflow.
    """
    return raw_finish_reason in _OVERFLOW_FINISH


# --- helpers ---------------------------------------------------------------------------------------------


_URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+", re.IGNORECASE)


def _text_of(error: ProviderError) -> str:
    """The words of ``error`` to read: its message and a text body, without the provider's name that
    starts the message and without URLs (the endpoint an adapter names, a link in the text): a
    ``/v1/chat/completions`` path or a provider called ``completions`` is not a wording."""
    message = error.message.removeprefix(f"{error.provider}: ") if error.provider else error.message
    body = error.body
    return _URL.sub(" ", f"{message} {body}" if isinstance(body, str) else message)


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
