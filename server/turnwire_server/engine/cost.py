"""The cost of a step in US dollars, priced from its usage (docs/cost.md).

Prices come from the ``genai-prices`` package (https://github.com/pydantic/genai-prices): it ships
its price data and updates it only when asked, which the sidecar never does, so a cost is the
same offline and names its source as ``genai-prices <version>``. The package is imported at the
first step priced, not at start-up (its import takes ~0.1 s). A ``pricing.models`` entry
(:class:`~turnwire_server.engine.cost_settings.PricingSettings`) prices a model id itself and
wins over the data; its source is ``config``.

Usage maps to genai-prices' units as both define them: ``input_tokens`` (all input, cached
included) → ``input_tokens``, ``cached_input_tokens`` → ``cache_read_tokens``,
``cache_write_input_tokens`` → ``cache_write_tokens`` (of which ``cache_write_1h_input_tokens`` →
``cache_write_1h_tokens``, at the one-hour rate), ``output_tokens`` (reasoning included) →
``output_tokens``, ``reasoning_tokens`` → ``output_reasoning_tokens`` (a part of the output,
priced apart only where the data has a reasoning rate).

A cost is unknown (None, never 0) when the step reported no usage, when its provider entry has no
price list and no ``models`` entry names it, or when the data does not know the model; each model
id gets one warning per process for it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from decimal import Decimal
from importlib import metadata
from typing import Any, Literal, TypeAlias

from turnwire.types import Cost, Usage
from turnwire_server.engine.cost_settings import ModelPrices, PricingSettings

log = logging.getLogger("turnwire.cost")

CacheWrites: TypeAlias = Literal["5m", "1h"]
"""The longest lifetime a step may write the prompt cache at (``5m``, ``1h``), which decides
the most a prompt token of it can cost (:meth:`PriceBook.rates`)."""

PRICE_PACKAGE = "genai-prices"
"""The distribution the price data comes with; a cost's source names it and its version."""

CONFIG_SOURCE = "config"
"""The source of a cost priced by a ``pricing.models`` entry."""

PRICE_LISTS = {
    "anthropic": "anthropic",
    "openai": "openai",
    "openai-responses": "openai",
    "bedrock": "aws",  # Bedrock's model ids (us.anthropic.claude-…-v1:0) as genai-prices lists them
    "vertex": "google",  # Vertex AI's Claude ids (claude-sonnet-4-5@20250929)
    "gemini": "google",
}
"""A provider entry's ``type`` → the genai-prices provider id its models are priced under by
default (``pricing.provider_ids`` overrides it per entry)."""


class PriceBook:
    """Prices steps for one process: ``cost(model_id, provider_type, usage)``.

    ``model_id`` is the turn's ``provider:model``; ``provider_type`` the entry's ``type``
    (``anthropic``, ``openai``, ``openai-responses``, ``bedrock``, ``vertex``, ``gemini``, ``scripted``; None
    when unknown). Never
    raises: a step whose cost cannot be known gets None and, once per model id, a warning.
    """

    def __init__(self, settings: PricingSettings | None = None) -> None:
        self.settings = settings if settings is not None else PricingSettings()
        self._warned: set[str] = set()
        self._unlisted: set[str] = set()  # model ids the price data does not know: not looked up again
        self._source: str | None = None  # genai-prices <version>, read at the first use
        # By model id and the cache writes a step may make, for budgets.
        self._rates: dict[tuple[str, CacheWrites | None], tuple[float, float] | None] = {}

    def price_list(self, model_id: str, provider_type: str | None) -> str | None:
        """The genai-prices provider id ``model_id``'s entry is priced under, or None."""
        entry = model_id.partition(":")[0]
        if entry in self.settings.provider_ids:
            return self.settings.provider_ids[entry]
        return PRICE_LISTS.get(provider_type or "")

    def cost(self, model_id: str, provider_type: str | None, usage: Usage) -> Cost | None:
        """What ``usage`` of ``model_id`` cost, or None when unknown (see the module docstring)."""
        settings = self.settings
        if not settings.enabled:
            return None
        prices = settings.models.get(model_id)
        price_list = None if prices is not None else self.price_list(model_id, provider_type)
        if prices is None and (price_list is None or model_id in self._unlisted):
            return None  # nothing to price with (by configuration, or already warned about)
        if not (usage.input_tokens or usage.output_tokens):
            self._warn(model_id, "the provider reported no token usage")
            return None
        try:
            if prices is not None:
                return Cost(_configured(prices, usage), CONFIG_SOURCE)
            return Cost(_listed(price_list or "", model_id.partition(":")[2], usage), self._data_source())
        except LookupError as error:  # a model or provider the data does not know
            self._unlisted.add(model_id)
            self._warn(model_id, f"{PRICE_PACKAGE} does not know it ({error})")
        except ValueError as error:  # usage the data refuses (more cached tokens than input)
            self._warn(model_id, f"{PRICE_PACKAGE} cannot price its usage ({error})")
        return None

    def rates(
        self, model_id: str, provider_type: str | None, cache_writes: CacheWrites | None = None
    ) -> tuple[float, float] | None:
        """``(USD per input token, USD per output token)`` of ``model_id``, or None when its
        cost is unknown: what a budget reserves a step at (docs/cost.md, "Budgets"), so that a
        reservation is never below what the step can cost. Priced on a million input tokens and a
        million output tokens: the top tier of tiered prices. The input at the highest rate a
        prompt token can be billed at: uncached (no cache discount) or, when the step may write
        the prompt cache (``cache_writes``: the longest lifetime it may write at, ``5m`` or
        ``1h``; None: it writes none), a cache write, which costs more (Anthropic: 1.25 times the
        input price for five minutes, twice for an hour). Looked up once per model id and
        ``cache_writes``."""
        key = (model_id, cache_writes)
        if key not in self._rates:
            million = 1_000_000
            inputs = [Usage(input_tokens=million)]
            if cache_writes is not None:  # a write kept an hour may sit beside five minutes' ones
                inputs.append(Usage(input_tokens=million, cache_write_input_tokens=million))
            if cache_writes == "1h":
                inputs.append(
                    Usage(
                        input_tokens=million,
                        cache_write_input_tokens=million,
                        cache_write_1h_input_tokens=million,
                    )
                )
            costs = [self.cost(model_id, provider_type, usage) for usage in inputs]
            known = [cost.usd for cost in costs if cost is not None]
            # Tiers go by the input: the output's top-tier rate is what a million more adds.
            both = self.cost(model_id, provider_type, Usage(input_tokens=million, output_tokens=million))
            self._rates[key] = (
                None
                if both is None or len(known) < len(costs)
                else (max(known) / million, (both.usd - known[0]) / million)
            )
        return self._rates[key]

    def _data_source(self) -> str:
        if self._source is None:
            self._source = f"{PRICE_PACKAGE} {metadata.version(PRICE_PACKAGE)}"
        return self._source

    def _warn(self, model_id: str, why: str) -> None:
        if model_id in self._warned:
            return
        self._warned.add(model_id)
        log.warning(
            "cost of model %s is unknown: %s; add it under pricing.models to price it (docs/cost.md)",
            model_id,
            why,
        )


@dataclass(slots=True)
class CostTotal:
    """The running cost of a turn: the sum of its priced usages, unknown as soon as one usage
    was not priced. ``total()`` is the :class:`Cost` (sources joined by ``, ``) or None."""

    usd: float = 0.0
    sources: list[str] = field(default_factory=list)
    unknown: bool = False

    def add(self, cost: Cost | None) -> None:
        """Add one step's (or summary's) ``cost``; None makes the total unknown."""
        if cost is None:
            self.unknown = True
            return
        self.usd += cost.usd
        if cost.price_source not in self.sources:
            self.sources.append(cost.price_source)

    def merge(self, other: CostTotal) -> None:
        """Add ``other``'s priced usages (and its unknown ones) to this total."""
        self.unknown = self.unknown or other.unknown
        self.usd += other.usd
        self.sources.extend(source for source in other.sources if source not in self.sources)

    def stored(self) -> tuple[float | None, str | None]:
        """``(cost_usd, cost_source)`` as the store keeps them with the turn
        (``TurnRecord``): ``(None, None)`` when unknown, ``(0.0, "")`` when nothing was priced
        (no model call: nothing spent), else the total and its sources."""
        if self.unknown:
            return None, None
        return self.usd, ", ".join(self.sources)

    def total(self) -> Cost | None:
        """The turn's cost so far, or None when unknown or nothing was priced."""
        if self.unknown or not self.sources:
            return None
        return Cost(self.usd, ", ".join(self.sources))


def _usage(usage: Usage) -> Any:
    from genai_prices.types import Usage as PriceUsage  # here, not at start-up

    # The hour's writes only when there are some: genai-prices then prices them at its one-hour
    # rate (a model without one, at the write rate) and the rest of the writes at five minutes'.
    hour_writes = usage.cache_write_1h_input_tokens
    hour = {"cache_write_1h_tokens": hour_writes} if hour_writes else {}
    return PriceUsage(
        input_tokens=usage.input_tokens,
        cache_read_tokens=usage.cached_input_tokens,
        cache_write_tokens=usage.cache_write_input_tokens,
        output_tokens=usage.output_tokens,
        output_reasoning_tokens=usage.reasoning_tokens,
        **hour,
    )


def _listed(price_list: str, model: str, usage: Usage) -> float:
    import genai_prices  # here, not at start-up: its import takes ~0.1 s

    return float(genai_prices.calc_price(_usage(usage), model, provider_id=price_list).total_price)


def _configured(prices: ModelPrices, usage: Usage) -> float:
    from genai_prices.types import ModelPrice  # here, not at start-up

    def rate(value: float | None) -> Decimal | None:
        return None if value is None else Decimal(str(value))

    model_price = ModelPrice(
        input_mtok=rate(prices.input_mtok),
        output_mtok=rate(prices.output_mtok),
        cache_read_mtok=rate(prices.cache_read_mtok),
        cache_write_mtok=rate(prices.cache_write_mtok),
        cache_write_1h_mtok=rate(prices.cache_write_1h_mtok),
    )
    return float(model_price.calc_price(_usage(usage))["total_price"])
