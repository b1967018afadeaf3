"""The cost of each step and turn from a real ``turnwire serve`` (docs/cost.md): OpenAI and
Anthropic entries pointed at a replay server that reports usage, and a scripted model priced in
``pricing.models``. ``StepFinish.cost`` and ``TurnEnd.cost`` carry it, ``turnwire_cost_usd_total``
counts it, ``ResumeTurn`` replays it, ``turnwire chat`` shows it on its status line; an unknown
model's cost stays unset (never 0) with one warning in the log however many turns use it."""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from providers.helpers import a_block, a_end, a_start, a_stop, a_text, anthropic_sse, c_usage_stream
from providers.replay import ReplayServer, Reply
from support.prices import SOURCE, expected_usd
from support.sidecar import SidecarFactory, SidecarProcess, free_port, run_turnwire
from support.waiting import wait_until

from turnwire.types import Usage
from turnwire_client import TurnResult, TurnwireClient, collect
from turnwire_client.v1 import event_pb2

SCRIPTED_RATES = (2.0, 8.0)  # pricing.models: USD per million input / output tokens
SCRIPT: list[dict[str, Any]] = [
    {
        "text": "Let me check.",
        "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}],
        "usage": {"input_tokens": 1200, "output_tokens": 40},
    },
    {"text": "It is sunny.", "usage": {"input_tokens": 1300, "output_tokens": 25}},
]


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


def _config(replay: ReplayServer, metrics_port: int) -> dict[str, object]:
    sdk = {"api_key_env": None, "max_retries": 0}
    return {
        "default_model": "scripted:weather",
        "providers": {
            "openai": {"type": "openai", "base_url": f"{replay.url}/v1", **sdk},
            "anthropic": {"type": "anthropic", "base_url": replay.url, **sdk},
            "scripted": {"scripts": {"weather": SCRIPT}},
        },
        "pricing": {
            "models": {
                "scripted:weather": {"input_mtok": SCRIPTED_RATES[0], "output_mtok": SCRIPTED_RATES[1]}
            }
        },
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
    }


def _openai_stream(prompt: int, cached: int, output: int) -> Reply:
    return Reply.sse(c_usage_stream(prompt, cached, output))


def _anthropic_stream(uncached: int, output: int) -> Reply:
    return Reply.sse(
        anthropic_sse(
            a_start(input_tokens=uncached),
            a_block(0, {"type": "text", "text": ""}),
            a_text(0, "Hi."),
            a_stop(0),
            *a_end(output_tokens=output),
        )
    )


def _step_costs(result: TurnResult) -> list[event_pb2.StepFinish]:
    return [event.step_finish for event in result.events if event.WhichOneof("event") == "step_finish"]


def _cost_samples(port: int) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.labels["tenant"], s.labels["provider"], s.labels["model"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "turnwire_cost_usd_total"
    }


async def _started(sidecar_factory: SidecarFactory, replay: ReplayServer) -> tuple[SidecarProcess, int]:
    port = free_port()
    return await sidecar_factory(config=_config(replay, port)).start(), port


async def test_steps_and_turns_carry_their_cost_and_the_metric_counts_it(
    sidecar_factory: SidecarFactory, replay: ReplayServer
) -> None:
    sidecar, metrics_port = await _started(sidecar_factory, replay)
    replay.enqueue(
        _openai_stream(prompt=5200, cached=2048, output=310), _anthropic_stream(uncached=900, output=120)
    )
    async with TurnwireClient(sidecar.target) as client:
        openai_turn = await collect(client.chat("cost-openai", "hi", model="openai:gpt-4o"))
        anthropic_turn = await collect(
            client.chat("cost-anthropic", "hi", model="anthropic:claude-haiku-4-5")
        )
        scripted_turn = await collect(client.chat("cost-scripted", "weather?", model="scripted:weather"))
        # ResumeTurn replays the stored stream, costs included.
        replayed = [event async for event in client.resume_turn(scripted_turn.request_id)]
        # A second turn on the conversation: GetConversation sums the stored turns' costs.
        again = await collect(client.chat("cost-scripted", "and now?", model="scripted:weather"))
        stored = await client.get_conversation("cost-scripted")

    openai_usd = expected_usd(
        "openai", "gpt-4o", Usage(input_tokens=5200, cached_input_tokens=2048, output_tokens=310)
    )
    anthropic_usd = expected_usd("anthropic", "claude-haiku-4-5", Usage(input_tokens=900, output_tokens=120))
    for result, usd in ((openai_turn, openai_usd), (anthropic_turn, anthropic_usd)):
        assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
        (step,) = _step_costs(result)
        assert step.HasField("cost")
        assert step.cost.usd == pytest.approx(usd, rel=1e-9)
        assert step.cost.price_source == SOURCE
        end = result.events[-1].turn_end
        assert end.cost.usd == pytest.approx(usd, rel=1e-9) and end.cost.price_source == SOURCE

    # Two scripted steps priced by the configuration; the turn's cost is their sum.
    steps = _step_costs(scripted_turn)
    wanted = [
        (s["usage"]["input_tokens"] * SCRIPTED_RATES[0] + s["usage"]["output_tokens"] * SCRIPTED_RATES[1])
        / 1e6
        for s in SCRIPT
    ]
    assert [pytest.approx(step.cost.usd, rel=1e-9) for step in steps] == wanted
    assert {step.cost.price_source for step in steps} == {"config"}
    scripted_end = scripted_turn.events[-1].turn_end
    assert scripted_end.cost.usd == pytest.approx(sum(wanted), rel=1e-9)
    assert scripted_end.cost.price_source == "config"
    assert [e for e in replayed if e.WhichOneof("event") in ("step_finish", "turn_end")] == [
        e for e in scripted_turn.events if e.WhichOneof("event") in ("step_finish", "turn_end")
    ]

    assert again.events[-1].turn_end.cost.usd == pytest.approx(sum(wanted), rel=1e-9)
    assert stored.cost.usd == pytest.approx(2 * sum(wanted), rel=1e-9)
    assert stored.cost.price_source == "config"

    expected = {
        ("", "openai", "openai:other"): openai_usd,
        ("", "anthropic", "anthropic:other"): anthropic_usd,
        ("", "scripted", "scripted:weather"): 2 * sum(wanted),
    }

    def counted() -> dict[tuple[str, str, str], float] | None:
        found = _cost_samples(metrics_port)
        return found if found.keys() == expected.keys() else None

    samples = await wait_until(counted)
    assert samples is not None
    for labels, usd in expected.items():
        assert samples[labels] == pytest.approx(usd, rel=1e-9), labels


async def test_an_unknown_model_has_no_cost_and_one_warning(
    sidecar_factory: SidecarFactory, replay: ReplayServer
) -> None:
    sidecar, _ = await _started(sidecar_factory, replay)
    replay.enqueue(*(_openai_stream(prompt=100, cached=0, output=10) for _ in range(2)))
    async with TurnwireClient(sidecar.target) as client:
        turns = [
            await collect(client.chat(f"cost-unknown-{n}", "hi", model="openai:gpt-nobody-knows"))
            for n in (1, 2)
        ]
        stored = await client.get_conversation("cost-unknown-1")
    assert not stored.HasField("cost")
    for result in turns:
        assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
        (step,) = _step_costs(result)
        assert step.usage.input_tokens == 100
        assert not step.HasField("cost")
        assert not result.events[-1].turn_end.HasField("cost")
    warning = "cost of model openai:gpt-nobody-knows is unknown"
    await wait_until(lambda: warning in sidecar.log_text())
    assert sidecar.log_text().count(warning) == 1, sidecar.log_text()


async def test_the_cli_status_line_shows_the_cost(
    sidecar_factory: SidecarFactory, replay: ReplayServer
) -> None:
    sidecar, _ = await _started(sidecar_factory, replay)
    run = await run_turnwire(
        "chat", "cost-cli", "weather?", "--target", sidecar.target, "--model", "scripted:weather"
    )
    assert run.code == 0, run
    usd = (
        sum(
            s["usage"]["input_tokens"] * SCRIPTED_RATES[0] + s["usage"]["output_tokens"] * SCRIPTED_RATES[1]
            for s in SCRIPT
        )
        / 1e6
    )
    status = run.stdout.splitlines()[-1]
    assert status.startswith("COMPLETED · 2 steps · tokens in 2500 / out 65"), run.stdout
    assert f"· cost ${usd:.6f}".rstrip("0") in status, status
