"""Pieces both OpenAI adapters (Chat Completions, Responses) share: error mapping and model traits."""

from __future__ import annotations

import re

import openai

from server.providers import errors
from server.providers.base import ModelSettings, ProviderError

_REASONING_MODEL = re.compile(r"^(o\d|gpt-5|codex)", re.IGNORECASE)


def is_reasoning_model(model: str) -> bool:
    """OpenAI reasoning models (o-series, gpt-5 family, codex): they reject temperature, top_p and the
    penalties, and return encrypted reasoning. A ``vendor/`` prefix (OpenRouter style) is ignored."""
    return bool(_REASONING_MODEL.match(model.rsplit("/", 1)[-1]))


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


def map_openai_error(provider: str, error: BaseException) -> ProviderError | None:
    """The ``openai`` SDK's exceptions → ProviderError (None for anything else).

    The SDK keeps only the inner ``error`` object in ``.body``; the whole body as
    received is re-read from the response for ``ProviderError.body``.
    """
    if isinstance(error, openai.APIStatusError):
        response = error.response
        try:
            body = errors.parse_body(response.content)
        except Exception:  # the body was not read
            body = error.body
        return errors.from_status(
            provider, error.status_code, response.headers, body, fallback_message=error.message
        )
    if isinstance(error, openai.APITimeoutError):
        return errors.connection_error(provider, error, timeout=True)
    if isinstance(error, openai.APIConnectionError):
        return errors.connection_error(provider, error.__cause__ or error)
    return None
