"""A budget's reservation under prompt caching (docs/cost.md, "Budgets"): a cache write costs more
than uncached input (Anthropic: 1.25 times for five minutes, twice for an hour), so a step that
may write the cache reserves its prompt at the write's rate; one that may not, as before."""

from __future__ import annotations

from typing import Any, cast

import anthropic
import pytest
from google.rpc import error_details_pb2
from support.engine_harness import EngineFactory, collect, end_of

from turnwire.providers import ModelRequest
from turnwire.testing import ScriptedProvider, ScriptedUsage, ScriptStep
from turnwire.types import ModelSettings, Usage
from turnwire_client.v1 import event_pb2
from turnwire_server.engine.budget_settings import BudgetSettings
from turnwire_server.engine.budgets import StepBudgets
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.prompt_cache import CacheTtl
from turnwire_server.store.budgets import BudgetStore
from turnwire_server.store.records import BudgetCharge, BudgetGrant

SONNET = "anthropic:claude-sonnet-4-5"  # genai-prices: tiered (above 200k input), with 1h writes


def _provider(prompt_caching: CacheTtl | None) -> AnthropicMessagesProvider:
    client = anthropic.AsyncAnthropic(api_key="test-key", base_url="http://127.0.0.1:9")
    return AnthropicMessagesProvider("anthropic", client, prompt_caching=prompt_caching)


def _request(options: dict[str, Any] | None = None, max_output_tokens: int | None = 1_000) -> ModelRequest:
    settings = ModelSettings(max_output_tokens=max_output_tokens, provider_options=options)
    system = "You answer briefly. " * 200  # a prompt of some 1 000 tokens
    return ModelRequest(model="claude-sonnet-4-5", system=system, messages=[], tools=[], settings=settings)


def test_the_input_rate_is_the_highest_a_prompt_token_may_be_billed_at() -> None:
    prices = PriceBook(
        PricingSettings.model_validate(
            {
                "models": {
                    "x:m": {
                        **{"input_mtok": 3, "output_mtok": 15},
                        **{"cache_write_mtok": 3.75, "cache_write_1h_mtok": 6},
                    },
                    "x:cheap-writes": {"input_mtok": 3, "output_mtok": 15, "cache_write_mtok": 1},
                }
            }
        )
    )
    assert prices.rates("x:m", None) == pytest.approx((3e-6, 15e-6))  # no cache write: uncached
    assert prices.rates("x:m", None, "5m") == pytest.approx((3.75e-6, 15e-6))
    assert prices.rates("x:m", None, "1h") == pytest.approx((6e-6, 15e-6))
    # Writes cheaper than input: the input's rate is still the highest.
    assert prices.rates("x:cheap-writes", None, "1h") == pytest.approx((3e-6, 15e-6))
    assert prices.rates("scripted:unpriced", "scripted", "1h") is None


@pytest.mark.parametrize("ttl", ["5m", "1h"])
def test_a_step_writing_its_whole_prompt_to_the_cache_costs_no_more_than_it_reserved(ttl: CacheTtl) -> None:
    # The worst case: a prompt in the top tier (above 200k tokens), every token of it a write.
    prices = PriceBook()
    usd_in, usd_out = prices.rates(SONNET, "anthropic", ttl) or (0.0, 0.0)
    prompt, output = 300_000, 4_000
    hour = prompt if ttl == "1h" else 0
    usage = Usage(
        input_tokens=prompt,
        output_tokens=output,
        cache_write_input_tokens=prompt,
        cache_write_1h_input_tokens=hour,
    )
    cost = prices.cost(SONNET, "anthropic", usage)
    assert cost is not None
    assert cost.usd <= prompt * usd_in + output * usd_out + 1e-9
    assert usd_in == pytest.approx(6e-6 * (2 if ttl == "1h" else 1.25))  # $6 a million above 200k


def test_the_anthropic_adapter_says_what_its_requests_may_write() -> None:
    assert _provider(None).cache_writes(_request()) is None
    assert _provider("5m").cache_writes(None) == "5m"
    assert _provider("1h").cache_writes(_request()) == "1h"
    # Markers the request's own provider options place, with caching off or at five minutes.
    marker = {"anthropic": {"cache_control": {"type": "ephemeral"}}}
    assert _provider(None).cache_writes(_request(marker)) == "5m"
    hour = {"type": "ephemeral", "ttl": "1h"}
    hour_tool = {"anthropic": {"tools": [{"name": "web", "cache_control": hour}]}}
    assert _provider("5m").cache_writes(_request(hour_tool)) == "1h"
    assert _provider(None).cache_writes(_request({"openai": {"cache_control": {"ttl": "1h"}}})) is None


class _Asks:
    """A budget store that grants every ask whole and keeps it."""

    def __init__(self) -> None:
        self.charges: list[BudgetCharge] = []

    async def charge_budget(self, charge: BudgetCharge, checkpoint: Any = None) -> BudgetGrant:
        self.charges.append(charge)
        ask = charge.ask
        assert ask is not None
        usd = ask.prompt_usd + ask.max_output * ask.usd_per_output_token
        return BudgetGrant(ask.max_output, ask.prompt_tokens + ask.max_output, usd, budgets=charge.budgets)


@pytest.mark.parametrize(
    ("prompt_caching", "input_rate"), [(None, 6e-6), ("5m", 7.5e-6), ("1h", 12e-6)], ids=["off", "5m", "1h"]
)
async def test_a_step_reserves_its_prompt_at_the_rate_its_cache_writes_bill(
    prompt_caching: CacheTtl | None, input_rate: float
) -> None:
    store = _Asks()
    settings = BudgetSettings.model_validate({"turn": {"usd": 100.0}})
    budgets = StepBudgets(
        cast(BudgetStore, store),  # charge_budget is all a reservation calls
        settings,
        PriceBook(),
        request_id="r1",
        conversation_id="c1",
        lease=None,
        turn_limit=settings.turn,
        recovered=False,
    )
    request = _request(max_output_tokens=1_000)
    await budgets.reserve(request, SONNET, "anthropic", _provider(prompt_caching))
    (charge,) = store.charges
    assert charge.ask is not None and charge.ask.prompt_tokens > 900
    assert charge.ask.prompt_usd == pytest.approx(charge.ask.prompt_tokens * input_rate)
    assert charge.ask.usd_per_output_token == pytest.approx(22.5e-6)


class _CachingModel(ScriptedProvider):
    """A scripted model whose requests may write a cache kept an hour, as an Anthropic entry with
    ``prompt_caching: 1h`` says."""

    name = "cached"

    def cache_writes(self, request: ModelRequest | None) -> CacheTtl | None:
        return "1h"


@pytest.mark.parametrize("model", ["cached:main", "plain:main"])
async def test_a_turn_whose_steps_may_write_the_cache_is_held_to_the_writes_price(
    make_engine: EngineFactory, model: str
) -> None:
    # A prompt of about 10 000 tokens: $0.03 uncached, $0.06 written for an hour. A turn budget of
    # $0.045 has room for it uncached (and 1 000 tokens of output), none written for an hour.
    step = [ScriptStep(text="Done.", usage=ScriptedUsage(input_tokens=10, output_tokens=2))]
    prices = {"input_mtok": 3.0, "output_mtok": 15.0, "cache_write_mtok": 3.75, "cache_write_1h_mtok": 6.0}
    plain = ScriptedProvider({"main": step}, strict=True)
    plain.name = "plain"
    h = await make_engine(
        providers={"cached": _CachingModel({"main": step}, strict=True), "plain": plain},
        prices=PriceBook(
            PricingSettings.model_validate({"models": {"cached:main": prices, "plain:main": prices}})
        ),
        budgets=BudgetSettings.model_validate({"turn": {"usd": 0.045}, "min_output_tokens": 100}),
    )
    events = await collect(await h.engine.start(h.request("word " * 8_000, model=model)))
    end = end_of(events)
    if model == "plain:main":
        assert end.status == event_pb2.TURN_STATUS_COMPLETED
    else:
        assert end.status == event_pb2.TURN_STATUS_ERROR
        info = error_details_pb2.ErrorInfo()
        assert any(detail.Unpack(info) for detail in end.error.details)
        assert (info.reason, info.metadata["budget"]) == ("BUDGET_EXHAUSTED", "turn")
