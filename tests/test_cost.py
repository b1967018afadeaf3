"""The price book (engine/cost.py, docs/cost.md): recorded usages priced as genai-prices' data says,
an unknown model's cost unknown with one warning, a ``pricing.models`` entry over the data, and the
package not imported until a step is priced."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest
from support.prices import SOURCE, expected_usd

from turnwire.types import Cost, Usage
from turnwire_server.engine.cost import CostTotal, PriceBook
from turnwire_server.engine.cost_settings import PricingSettings

# Usages as the adapters report them (input counts the cached tokens, output the reasoning ones).
OPENAI_USAGE = Usage(input_tokens=12_400, output_tokens=830, cached_input_tokens=4_096, reasoning_tokens=0)
ANTHROPIC_USAGE = Usage(
    input_tokens=9_000, output_tokens=512, cached_input_tokens=6_000, cache_write_input_tokens=2_500
)


@pytest.mark.parametrize(
    ("model_id", "provider_type", "price_list", "usage"),
    [
        ("openai:gpt-4o", "openai", "openai", OPENAI_USAGE),
        ("responses:gpt-4o", "openai-responses", "openai", OPENAI_USAGE),
        ("anthropic:claude-haiku-4-5", "anthropic", "anthropic", ANTHROPIC_USAGE),
    ],
)
def test_a_recorded_usage_costs_what_the_price_data_says(
    model_id: str, provider_type: str, price_list: str, usage: Usage
) -> None:
    cost = PriceBook().cost(model_id, provider_type, usage)
    assert cost is not None
    assert cost.price_source == SOURCE
    assert cost.usd == pytest.approx(expected_usd(price_list, model_id.partition(":")[2], usage), rel=1e-9)
    assert cost.usd > 0


def test_a_cache_write_kept_an_hour_costs_the_hour_rate() -> None:
    """Anthropic bills a one-hour cache write at twice the input price, a five-minute one at 1.25
    times (docs/cost.md); before, every write was priced at the five-minute rate (money trial:
    $0.003525 for a step that cost $0.00465)."""
    usage = Usage(
        input_tokens=2_600,
        output_tokens=50,
        cached_input_tokens=2_000,
        cache_write_input_tokens=500,
        cache_write_1h_input_tokens=500,
    )
    cost = PriceBook().cost("anthropic:claude-haiku-4-5", "anthropic", usage)
    assert cost is not None
    assert cost.usd == pytest.approx(expected_usd("anthropic", "claude-haiku-4-5", usage), rel=1e-9)
    # $1 per million input: 100 uncached, 2 000 read at $0.10, 500 written for an hour at $2, 50 out at $5.
    assert cost.usd == pytest.approx((100 * 1 + 2_000 * 0.1 + 500 * 2 + 50 * 5) / 1e6, rel=1e-9)
    # A configured price: the hour's writes at cache_write_1h_mtok, else at cache_write_mtok.
    mixed = Usage(input_tokens=1_000, cache_write_input_tokens=1_000, cache_write_1h_input_tokens=400)
    rates = {"input_mtok": 1.0, "output_mtok": 5.0, "cache_write_mtok": 1.25}
    book = PriceBook(PricingSettings(models={"local:m": {**rates, "cache_write_1h_mtok": 2.0}}))
    hourly = book.cost("local:m", None, mixed)
    assert hourly is not None and hourly.price_source == "config"
    assert hourly.usd == pytest.approx((600 * 1.25 + 400 * 2.0) / 1e6, rel=1e-9)
    book = PriceBook(PricingSettings(models={"local:m": rates}))
    flat = book.cost("local:m", None, mixed)
    assert flat is not None and flat.usd == pytest.approx(1_000 * 1.25 / 1e6, rel=1e-9)


def test_an_unknown_model_costs_unknown_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    book = PriceBook()
    with caplog.at_level(logging.WARNING, logger="turnwire.cost"):
        first = book.cost("openai:no-such-model-x1", "openai", OPENAI_USAGE)
        again = book.cost("openai:no-such-model-x1", "openai", OPENAI_USAGE)
        other = book.cost("openai:no-such-model-x2", "openai", OPENAI_USAGE)
    assert first is None and again is None and other is None
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2, warnings  # one per model id
    assert "openai:no-such-model-x1" in warnings[0] and "pricing.models" in warnings[0]


def test_missing_usage_is_unknown_not_zero(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="turnwire.cost"):
        assert PriceBook().cost("openai:gpt-4o", "openai", Usage()) is None
    assert len(caplog.records) == 1
    assert "no token usage" in caplog.records[0].getMessage()


def test_a_configured_price_wins_over_the_data() -> None:
    settings = PricingSettings.model_validate(
        {"models": {"openai:gpt-4o": {"input_mtok": 1.0, "output_mtok": 4.0, "cache_read_mtok": 0.5}}}
    )
    cost = PriceBook(settings).cost("openai:gpt-4o", "openai", OPENAI_USAGE)
    read = OPENAI_USAGE.cached_input_tokens
    usd = ((OPENAI_USAGE.input_tokens - read) * 1.0 + read * 0.5 + OPENAI_USAGE.output_tokens * 4.0) / 1e6
    assert cost == Cost(pytest.approx(usd, rel=1e-9), "config")  # type: ignore[arg-type]


def test_an_entry_without_a_price_list_is_unknown_unless_configured(caplog: pytest.LogCaptureFixture) -> None:
    settings = PricingSettings.model_validate(
        {
            "models": {"scripted:priced": {"input_mtok": 2.0, "output_mtok": 2.0}},
            "provider_ids": {"proxy": None},
        }
    )
    book = PriceBook(settings)
    with caplog.at_level(logging.WARNING, logger="turnwire.cost"):
        assert book.cost("scripted:demo", "scripted", OPENAI_USAGE) is None
        assert book.cost("proxy:gpt-4o", "openai", OPENAI_USAGE) is None
    assert caplog.records == []  # unpriced by configuration: nothing to warn about
    priced = book.cost("scripted:priced", "scripted", Usage(input_tokens=1_000_000, output_tokens=500_000))
    assert priced == Cost(3.0, "config")


def test_a_model_id_key_must_name_provider_and_model() -> None:
    with pytest.raises(ValueError, match="provider:model"):
        PricingSettings.model_validate({"models": {"gpt-4o": {"input_mtok": 1, "output_mtok": 1}}})


def test_a_turn_total_is_unknown_once_one_usage_is() -> None:
    total = CostTotal()
    assert total.total() is None  # nothing priced yet
    total.add(Cost(0.25, "config"))
    total.add(Cost(0.5, SOURCE))
    assert total.total() == Cost(0.75, f"config, {SOURCE}")
    total.add(None)
    assert total.total() is None


def test_the_price_data_is_not_imported_at_start_up() -> None:
    code = (
        "import sys, turnwire_server.app, turnwire_server.engine.engine, turnwire_server.cli.app; "
        "sys.exit('genai_prices' in sys.modules)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr or "genai_prices was imported at start-up"


def test_usage_the_data_refuses_is_unknown(caplog: pytest.LogCaptureFixture) -> None:
    refused = Usage(input_tokens=10, output_tokens=5, cached_input_tokens=50)  # more cached than input
    with caplog.at_level(logging.WARNING, logger="turnwire.cost"):
        assert PriceBook().cost("openai:gpt-4o", "openai", refused) is None
    assert ["cannot price its usage" in record.getMessage() for record in caplog.records] == [True]
