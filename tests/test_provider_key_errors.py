"""A missing API key says what to fix, and the advice fits the entry (fresh-user trial 4): the
vendor's own API needs a key, so ``api_key_env: null`` is offered only for a server of your own
(an entry with a ``base_url``). The example in docs/providers.md is the real message."""

from __future__ import annotations

from pathlib import Path

import pytest

from turnwire_server.providers.settings import (
    AnthropicProviderSettings,
    OpenAIProviderSettings,
    ProviderConfigError,
    build_provider,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "providers.md"


def test_the_vendors_api_is_not_offered_a_null_key() -> None:
    settings = AnthropicProviderSettings(type="anthropic", api_key_env="ANTHROPIC_API_KEY")
    with pytest.raises(ProviderConfigError) as caught:
        build_provider("claude", settings, environ={})
    message = str(caught.value)
    assert message == (
        "provider 'claude': environment variable ANTHROPIC_API_KEY (its api_key_env) is not set; "
        "set it (the vendor's API needs a key)"
    )
    # The docs quote it as printed (wrapped at the same place).
    assert message.replace("is not set", "is\nnot set") in DOCS.read_text()


def test_a_server_of_your_own_is_offered_a_null_key() -> None:
    settings = OpenAIProviderSettings(
        type="openai", api_key_env="LOCAL_KEY", base_url="http://127.0.0.1:11434/v1"
    )
    with pytest.raises(
        ProviderConfigError, match="set it, or set api_key_env to null if the server at base_url"
    ):
        build_provider("local", settings, environ={})


def test_a_set_key_builds_the_provider() -> None:
    settings = OpenAIProviderSettings(
        type="openai", api_key_env="LOCAL_KEY", base_url="http://127.0.0.1:9/v1"
    )
    assert build_provider("local", settings, environ={"LOCAL_KEY": "k"}) is not None
