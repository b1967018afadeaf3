"""What a usage costs by genai-prices' data, computed here from the data's rates (not by the
package's own arithmetic), for the cost tests (docs/cost.md)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from importlib import metadata

from genai_prices import data_snapshot

from turnwire.types import Usage

SOURCE = f"genai-prices {metadata.version('genai-prices')}"
"""The ``price_source`` of a cost priced from the package's data."""


def expected_usd(price_list: str, model: str, usage: Usage) -> float:
    """US dollars for ``usage`` of ``model`` under genai-prices provider ``price_list``: every
    uncached input token at the input rate, cache reads and writes at theirs (a one-hour write at
    its own), every output token
    (reasoning included) at the output rate; rates per million tokens, as of now."""
    _, info = data_snapshot.get_snapshot().find_provider_model(model, None, price_list, None)
    prices = info.get_prices(dt.datetime.now(dt.UTC))

    def rate(name: str) -> Decimal:
        value = getattr(prices, name)
        assert isinstance(value, Decimal), f"{model}: {name} is {value!r}, not one flat rate"
        return value

    read, write = usage.cached_input_tokens, usage.cache_write_input_tokens
    hour = usage.cache_write_1h_input_tokens  # of the writes, those kept an hour, at their own rate
    total = (
        (usage.input_tokens - read - write) * rate("input_mtok")
        + (read * rate("cache_read_mtok") if read else 0)
        + ((write - hour) * rate("cache_write_mtok") if write - hour else 0)
        + (hour * rate("cache_write_1h_mtok") if hour else 0)
        + usage.output_tokens * rate("output_mtok")
    )
    return float(total / 1_000_000)
