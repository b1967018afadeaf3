"""Pieces both OpenAI adapters (Chat Completions, Responses) share: error mapping, model traits (which
reasoning goes back, :func:`replay_reasoning_for`), the decoders' common state and their finish step."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

import openai

from turnwire.providers import ProviderError
from turnwire.types import FinishReason, FinishStep, ModelSettings, Usage
from turnwire_server.providers import errors
from turnwire_server.providers.convert import as_int, check_structured_output, finish_step

_REASONING_MODEL = re.compile(r"^(o\d|gpt-5|codex)", re.IGNORECASE)


def is_reasoning_model(model: str) -> bool:
    """OpenAI reasoning models (o-series, gpt-5 family, codex): they reject temperature, top_p and the
    penalties, and return encrypted reasoning. A ``vendor/`` prefix (OpenRouter style) is ignored."""
    return bool(_REASONING_MODEL.match(model.rsplit("/", 1)[-1]))


ReplayReasoningSetting = Literal["auto", "tool_turns", "always", "never"]
"""A provider entry's ``replay_reasoning`` (docs/providers.md, "What goes back on the next request"):
which assistant messages carry their reasoning text back. ``auto`` is decided per request by
:func:`replay_reasoning_for`."""

ReplayReasoning = Literal["tool_turns", "always"] | None
"""What one request sends back: the reasoning of every user turn in which the model called a tool
(``tool_turns``), all of it (``always``), or none (None)."""

_REPLAYS_REASONING = re.compile(r"deepseek|kimi-k2(?:\.\d|-thinking)", re.IGNORECASE)
"""Model families whose thinking mode needs a tool turn's reasoning back (400 without it): DeepSeek
(https://api-docs.deepseek.com/guides/thinking_mode: "between two user messages, if the model made
tool calls, the reasoning must be passed back in all later requests"; its Responses API,
https://api-docs.deepseek.com/guides/responses_api) and Kimi K2's thinking models
(https://platform.moonshot.ai/docs/guide/use-kimi-k2-thinking-model)."""


def replay_reasoning_for(
    setting: ReplayReasoningSetting, model: str, options: Mapping[str, Any]
) -> ReplayReasoning:
    """The reasoning one request sends back. ``auto``: ``tool_turns`` for the model families of
    :data:`_REPLAYS_REASONING` (a ``vendor/`` prefix ignored) unless the request's provider options
    turn thinking off (Chat: ``thinking: {type: disabled}``; Responses: ``reasoning: {effort:
    none}``, DeepSeek's switches), else none; any other setting as it says (``never``: None)."""
    if setting == "never":
        return None
    if setting != "auto":
        return setting
    thinking, reasoning = options.get("thinking"), options.get("reasoning")
    if isinstance(thinking, Mapping) and thinking.get("type") == "disabled":
        return None
    if isinstance(reasoning, Mapping) and reasoning.get("effort") == "none":
        return None
    return "tool_turns" if _REPLAYS_REASONING.search(model.rsplit("/", 1)[-1]) else None


def drop_sampling(
    settings: ModelSettings, model: str, fields: tuple[str, ...], warnings: list[str]
) -> set[str]:
    """The sampling fields of ``fields`` not to send to ``model`` (reasoning models reject them)."""
    if not is_reasoning_model(model):
        return set()
    dropped = {name for name in fields if getattr(settings, name) is not None}
    for name in sorted(dropped):
        warnings.append(f"{name} is not supported by reasoning model {model} and was not sent")
    return dropped


def sampling(
    settings: ModelSettings, model: str, fields: tuple[str, ...], warnings: list[str]
) -> dict[str, Any]:
    """The sampling fields of ``fields`` to send to ``model``: those set, less the ones it rejects
    (:func:`drop_sampling`, which warns)."""
    dropped = drop_sampling(settings, model, fields, warnings)
    values = {name: getattr(settings, name) for name in fields if name not in dropped}
    return {name: value for name, value in values.items() if value is not None}


def map_openai_error(provider: str, error: BaseException) -> ProviderError | None:
    """The ``openai`` SDK's exceptions → ProviderError (None for anything else).

    The SDK keeps only the inner ``error`` object in ``.body``; the whole body as
    received is re-read from the response for ``ProviderError.body``.
    """
    return errors.from_sdk_error(provider, error, openai)


def openai_usage(usage: Mapping[str, Any], inputs: str, outputs: str) -> Usage:
    """An OpenAI usage object as :class:`Usage`. Its counts are ``<inputs>_tokens`` and
    ``<outputs>_tokens`` (Chat Completions: ``prompt`` / ``completion``; Responses: ``input`` /
    ``output``), ``total_tokens`` (their sum when absent), ``<outputs>_tokens_details.reasoning_tokens``
    and ``<inputs>_tokens_details.cached_tokens``, else DeepSeek's ``<inputs>_cache_hit_tokens``
    (https://api-docs.deepseek.com/guides/kv_cache)."""
    input_tokens = as_int(usage.get(f"{inputs}_tokens"))
    output_tokens = as_int(usage.get(f"{outputs}_tokens"))
    cached = as_int((usage.get(f"{inputs}_tokens_details") or {}).get("cached_tokens"))
    return Usage(
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        total_tokens=as_int(usage.get("total_tokens")) or input_tokens + output_tokens,
        reasoning_tokens=as_int((usage.get(f"{outputs}_tokens_details") or {}).get("reasoning_tokens")),
        cached_input_tokens=cached or as_int(usage.get(f"{inputs}_cache_hit_tokens")),
    )


class OpenAIDecoder:
    """The state both OpenAI stream decoders keep, and their finish step.

    ``prefix`` starts every block id of the step; ``text`` collects the output
    text when ``output_schema`` asks for structured output (checked at the finish);
    ``warnings`` (from the request builder) go into the FinishStep.
    """

    def __init__(
        self, provider: str, prefix: str, output_schema: Mapping[str, Any] | None, warnings: list[str]
    ):
        self.provider = provider
        self.prefix = prefix
        self.output_schema = output_schema
        self.warnings = warnings
        self.done = False
        self.text: list[str] | None = [] if output_schema is not None else None
        self.response_id = ""
        self.model = ""

    def _finish_step(
        self,
        reason: FinishReason,
        raw: str,
        usage: Usage,
        metadata: dict[str, Any],
        *,
        response_id: str,
        response_model: str,
    ) -> FinishStep:
        """The FinishStep, ``metadata`` under ``provider_metadata["openai"]``; checks the structured
        output of a ``stop`` (raises ProviderError when it does not match the schema)."""
        if self.text is not None and reason == "stop" and self.output_schema is not None:
            check_structured_output(self.provider, "".join(self.text), self.output_schema)
        return finish_step(
            reason,
            raw_reason=raw,
            usage=usage,
            response_id=response_id,
            response_model=response_model,
            metadata={"openai": metadata} if metadata else {},
            warnings=self.warnings,
        )
