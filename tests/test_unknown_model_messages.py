"""A model whose provider is not configured says what to fix (fresh-user trial): a ``providers:``
section replaces the embedded providers (``scripted`` alone), so a config that lists only ``openai``
lost ``scripted:demo``, and ``serve`` refused to start with a message that said neither that nor
that ``default_model`` should name a configured provider. The same hint reaches a client whose
request names such a model (``UNKNOWN_MODEL``)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from turnwire_server.app import check_startable
from turnwire_server.assembly import StartupError, build_providers
from turnwire_server.config import Settings
from turnwire_server.providers.registry import UnknownModel

OPENAI = {"type": "openai", "api_key_env": "TW_TEST_OPENAI_KEY"}
REPLACES = (
    "a providers: section replaces the embedded providers (scripted alone), so list scripted: {} in it "
    "to keep the offline model (docs/providers.md)"
)


@pytest.fixture(autouse=True)
def _openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TW_TEST_OPENAI_KEY", "sk-test")


async def _start_error(**config: Any) -> str:
    with pytest.raises(StartupError) as refused:
        await check_startable(Settings(**config))
    return str(refused.value)


async def _request_error(model: str, **config: Any) -> str:
    providers = build_providers(Settings(**config))
    try:
        with pytest.raises(UnknownModel) as refused:
            providers.resolve(model)
    finally:
        await providers.aclose()
    return str(refused.value)


async def test_a_providers_section_without_scripted_says_it_replaced_the_default_and_what_to_set() -> None:
    assert await _start_error(providers={"o": OPENAI}) == (
        "default_model (not set, so the embedded scripted:demo): model 'scripted:demo' names provider "
        f"'scripted', which is not configured; configured: ['o']; {REPLACES}; or set default_model to "
        "a model of a configured provider (for example o:<model>)"
    )


async def test_a_default_model_set_to_scripted_is_named_as_set() -> None:
    message = await _start_error(default_model="scripted:demo", providers={"o": OPENAI})
    assert message.startswith("default_model: model 'scripted:demo' names provider 'scripted'")
    assert REPLACES in message


async def test_either_fix_the_message_offers_starts() -> None:
    await check_startable(Settings(providers={"o": OPENAI, "scripted": {}}))
    await check_startable(Settings(providers={"o": OPENAI}, default_model="o:gpt-4.1"))


async def test_a_vendor_model_on_the_embedded_defaults_is_told_to_keep_scripted() -> None:
    assert await _request_error("openai:gpt-5-mini") == (
        "model 'openai:gpt-5-mini' names provider 'openai', which is not configured; configured: "
        "['scripted']; to use it, add openai: {type: openai, api_key_env: OPENAI_API_KEY} under "
        "providers: and keep scripted listed there too (a providers: section replaces the embedded "
        "providers; docs/providers.md)"
    )


async def test_a_vendor_model_beside_other_providers_is_told_only_the_entry() -> None:
    message = await _request_error("anthropic:claude-sonnet-4-5", providers={"o": OPENAI})
    assert message.endswith(
        "configured: ['o']; to use it, add anthropic: {type: anthropic, api_key_env: ANTHROPIC_API_KEY} "
        "under providers: (docs/providers.md)"
    )


async def test_the_scripted_model_missing_at_request_time_says_why() -> None:
    message = await _request_error("scripted:demo", providers={"o": OPENAI}, default_model="o:gpt-4.1")
    assert message.endswith(f"configured: ['o']; {REPLACES}")


async def test_a_provider_name_of_no_known_vendor_gets_no_guess() -> None:
    message = await _request_error("mine:model")
    assert (
        message
        == "model 'mine:model' names provider 'mine', which is not configured; configured: ['scripted']"
    )


async def test_a_price_for_a_model_no_provider_serves_is_refused_at_start() -> None:
    """A ``pricing.models`` id no configured provider serves (a misspelt provider or script) priced
    nothing, silently, and a dollar budget then refused the model as unpriced (developer trial)."""
    rates = {"input_mtok": 1.0, "output_mtok": 2.0}
    message = await _start_error(pricing={"models": {"opnai:gpt-4o": rates}})
    assert message.startswith("pricing.models['opnai:gpt-4o']: model 'opnai:gpt-4o' names provider 'opnai'")
    assert message.endswith("; it would price nothing")
    message = await _start_error(pricing={"models": {"scripted:dmeo": rates}})
    assert "provider 'scripted' has no model 'dmeo'; its scripts: demo, summarizer" in message
    await check_startable(Settings(pricing={"models": {"scripted:demo": rates}}))


async def test_provider_ids_of_no_provider_entry_are_refused_at_start() -> None:
    message = await _start_error(pricing={"provider_ids": {"openrouter": "openrouter"}})
    assert message == (
        "pricing.provider_ids['openrouter']: no provider entry is named 'openrouter' (configured: "
        "['scripted']); key provider_ids by the entry's name under providers:"
    )
    await check_startable(
        Settings(providers={"o": OPENAI, "scripted": {}}, pricing={"provider_ids": {"o": None}})
    )


def test_a_dollar_budget_with_pricing_off_is_refused_at_start() -> None:
    """``pricing.enabled: false`` makes every cost unknown, and a step of unknown cost is refused
    under a dollar budget: every turn ended BUDGET_EXHAUSTED, told to price its model under
    ``pricing.models``, which pricing off ignores (developer trial)."""
    with pytest.raises(ValidationError) as refused:
        Settings(pricing={"enabled": False}, budgets={"turn": {"usd": 1.0}, "tenant": {"day": {"usd": 5}}})
    assert (
        "budgets.turn.usd, budgets.tenant.day.usd limit US dollars, but pricing.enabled is false, so "
        "no step has a price and every turn would end BUDGET_EXHAUSTED; turn pricing on, or limit "
        "tokens instead"
    ) in str(refused.value)
    Settings(pricing={"enabled": False}, budgets={"turn": {"tokens": 1_000}})  # tokens need no price
    Settings(budgets={"turn": {"usd": 1.0}})  # priced
