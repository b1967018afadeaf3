"""The ``pricing:`` section: where the cost of a step comes from (docs/cost.md).

Prices are in US dollars per million tokens, as genai-prices and the vendors' price pages give
them. A ``models`` entry prices one model id (``provider:model``, the id a turn names) and wins
over the price data; ``provider_ids`` says under which genai-prices provider the models of a
configured provider entry are looked up (by default from its ``type``: ``anthropic`` →
``anthropic``, ``openai`` and ``openai-responses`` → ``openai``, ``bedrock`` → ``aws``, ``vertex``
and ``gemini`` → ``google``; a ``scripted`` entry has none).
"""

from __future__ import annotations

from pydantic import Field, field_validator

from turnwire_server.config_section import ConfigSection


class ModelPrices(ConfigSection):
    """One model's prices in US dollars per million tokens. ``input_mtok`` prices every input
    token the cache rates do not; ``cache_read_mtok`` / ``cache_write_mtok`` the cached ones
    (unset: at ``input_mtok``), ``cache_write_1h_mtok`` writes kept an hour (unset: at
    ``cache_write_mtok``); ``output_mtok`` every output token, reasoning included."""

    input_mtok: float = Field(ge=0, allow_inf_nan=False, description="USD per million input tokens")
    output_mtok: float = Field(
        ge=0, allow_inf_nan=False, description="USD per million output tokens (reasoning included)"
    )
    cache_read_mtok: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="USD per million input tokens read from the cache; unset: input_mtok",
    )
    cache_write_mtok: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="USD per million input tokens written to the cache; unset: input_mtok",
    )
    cache_write_1h_mtok: float | None = Field(
        None,
        ge=0,
        allow_inf_nan=False,
        description="USD per million input tokens written to a cache kept an hour; unset: cache_write_mtok",
    )


class PricingSettings(ConfigSection):
    """Cost of each step in USD (docs/cost.md). ``enabled``: false prices nothing (every cost
    is unknown). ``models``: prices by model id, over the price data (custom and self-hosted
    models, negotiated rates). ``provider_ids``: a configured provider entry's name → the
    genai-prices provider id its models are priced under (``openrouter``, ``groq`` … for an
    ``openai`` entry whose base_url is that vendor's), or null for none (every cost unknown
    unless ``models`` names it)."""

    enabled: bool = Field(True, description="price each step's usage; false: every cost is unknown")
    models: dict[str, ModelPrices] = Field(
        default_factory=dict, description="prices by model id (provider:model), over the price data"
    )
    provider_ids: dict[str, str | None] = Field(
        default_factory=dict,
        description="provider entry name → the genai-prices provider id its models are priced under; "
        "null: none",
    )

    @field_validator("models")
    @classmethod
    def _model_ids(cls, value: dict[str, ModelPrices]) -> dict[str, ModelPrices]:
        for model_id in value:
            provider, sep, model = model_id.partition(":")
            if not sep or not provider or not model:
                raise ValueError(
                    f"{model_id!r} is not a model id; key each entry by provider:model, "
                    "for example openai:gpt-4o"
                )
        return value
