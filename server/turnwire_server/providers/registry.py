"""Model ids (``provider:model``) resolved to a provider and its model name."""

from __future__ import annotations

import re
from collections.abc import Mapping

from turnwire.errors import CanonicalCode, DomainError, ErrorDetails
from turnwire.providers import Provider
from turnwire_client.v1 import error_reason_pb2

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

KEY_VARIABLES = {"anthropic": "ANTHROPIC_API_KEY", "openai": "OPENAI_API_KEY", "gemini": "GEMINI_API_KEY"}
"""Provider names people try first, with the variable their entry reads by default: an unknown one
gets the entry to add (an API key alone configures nothing)."""


class UnknownModel(DomainError, LookupError):
    """The model id names no configured provider, or is not ``provider:model``: the request's
    ``model`` field is invalid."""

    error_reason = error_reason_pb2.ERROR_REASON_UNKNOWN_MODEL
    status_code = CanonicalCode.INVALID_ARGUMENT

    def details(self) -> ErrorDetails:
        return ErrorDetails(field_violations=(("model", str(self)),))


class ProviderRegistry:
    """The configured providers by name.

    ``resolve("anthropic:claude-sonnet-4-5")`` returns the ``anthropic``
    provider and ``"claude-sonnet-4-5"``.
    """

    def __init__(self, providers: Mapping[str, Provider]) -> None:
        self.providers = dict(providers)

    def resolve(self, model_id: str) -> tuple[Provider, str]:
        """Split ``model_id`` and find its provider. Raises :class:`UnknownModel`, also for an id
        with a control character (U+0000-U+001F, U+007F): no model is named so, and the store's
        text columns cannot hold NUL (PostgreSQL refuses it in ``text``)."""
        if _CONTROL.search(model_id):
            raise UnknownModel(
                f"model {model_id!r} contains a control character; model ids are provider:model "
                "in printable characters"
            )
        provider_name, sep, model = model_id.partition(":")
        if not sep or not provider_name or not model:
            raise UnknownModel(
                f"model {model_id!r} is not of the form provider:model (for example scripted:demo)"
            )
        provider = self.providers.get(provider_name)
        if provider is None:
            raise UnknownModel(
                f"model {model_id!r} names provider {provider_name!r}, which is not configured; "
                f"configured: {sorted(self.providers)}{self._unconfigured_hint(provider_name)}"
            )
        if not provider.has_model(model):
            raise UnknownModel(
                f"model {model_id!r}: provider {provider_name!r} has no model {model!r}"
                + ("; its scripts: " + ", ".join(names) if (names := _script_names(provider)) else "")
                + " (docs/providers.md)"
            )
        return provider, model

    def _unconfigured_hint(self, provider_name: str) -> str:
        """What to add for a model of ``provider_name``, which is not configured: the entry of a
        well-known vendor, and that a ``providers:`` section replaces the embedded providers
        (``scripted`` alone), so the offline model needs ``scripted`` listed in it (a fresh-user
        trial wrote ``providers:`` with only ``openai`` and lost ``scripted:demo``). "" otherwise."""
        if provider_name == "scripted":
            return (
                "; a providers: section replaces the embedded providers (scripted alone), so list "
                "scripted: {} in it to keep the offline model (docs/providers.md)"
            )
        if provider_name not in KEY_VARIABLES:
            return ""
        add = (
            f"; to use it, add {provider_name}: {{type: {provider_name}, "
            f"api_key_env: {KEY_VARIABLES[provider_name]}}} under providers:"
        )
        if "scripted" not in self.providers:
            return f"{add} (docs/providers.md)"
        return (
            f"{add} and keep scripted listed there too (a providers: section replaces the embedded "
            "providers; docs/providers.md)"
        )

    async def aclose(self) -> None:
        """Close every provider."""
        for provider in self.providers.values():
            await provider.aclose()


def _script_names(provider: Provider) -> list[str]:
    """The script names of a scripted provider (``turnwire.testing.ScriptedProvider.scripts``),
    for an unknown-model message; [] for a provider that does not list its models."""
    scripts = getattr(provider, "scripts", None)
    return sorted(scripts) if isinstance(scripts, dict) else []
