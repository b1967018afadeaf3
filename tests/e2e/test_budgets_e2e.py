"""Budgets end to end against a real ``turnwire serve`` (docs/cost.md, "Budgets"): a turn whose
next step has no room in the tenant's daily budget ends ``TURN_STATUS_ERROR`` with reason
``BUDGET_EXHAUSTED`` (its first step's reply stored); the next turn is refused before anything
is stored with ``RESOURCE_EXHAUSTED``, ``QuotaFailure`` naming the budget, ``ErrorInfo`` and a
``RetryInfo`` delay until midnight UTC; an accepted submission meeting it runs and ends ``error``
with that reason; the metrics count them and show the day's spend. A step clamped by its budget
stops at the clamp (the scripted model as a real one). A principal's daily budget
holds for its own calls and submissions, not another principal's of the same tenant. A step that
falls back to another model is reserved again at that model's prices."""

from __future__ import annotations

import datetime as dt
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.rpc import error_details_pb2
from prometheus_client.parser import text_string_to_metric_families
from providers.helpers import c_usage_stream
from providers.replay import ReplayServer, Reply
from support.sidecar import SidecarFactory, free_port
from support.tokens import auth_config, new_token, write_tokens_file
from support.waiting import wait_until

from turnwire_client import TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2

OVERLOADED = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
SCRIPT = [
    {
        "text": "Let me check.",
        "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}],
        "usage": {"input_tokens": 1200, "output_tokens": 40},
    },
    {"text": "It is sunny.", "usage": {"input_tokens": 1300, "output_tokens": 25}},
]


def _detail(error: TurnwireError, kind: type[object]) -> object:
    assert error.status is not None
    for detail in error.status.details:
        found = kind()
        if detail.Unpack(found):
            return found
    raise AssertionError(f"no {kind.__name__} in {error.status}")


def _samples(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("turnwire_budget")
    }


async def test_a_turn_over_budget_ends_with_the_reason_and_the_next_is_refused(
    sidecar_factory: SidecarFactory,
) -> None:
    metrics_port = free_port()
    config = {
        "default_model": "scripted:weather",
        "providers": {"scripted": {"scripts": {"weather": SCRIPT}}},
        # The first step's reservation (its prompt estimate and 50 of output) fits; it reports
        # 1 240 tokens (more than estimated), which spends the day: no second step, no next turn.
        "budgets": {"tenant": {"day": {"tokens": 1_200}}, "assumed_max_output_tokens": 50},
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
    }
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("budget", "weather in Paris?"))
        assert result.status == event_pb2.TURN_STATUS_ERROR, result
        assert result.error is not None and "tenant/day budget" in result.error.message
        info = error_details_pb2.ErrorInfo()
        assert result.error.details[0].Unpack(info) and info.reason == "BUDGET_EXHAUSTED"
        assert info.metadata["budget"] == "tenant/day"
        assert result.step_count == 1
        stored = await client.get_conversation("budget")
        assert stored.message_count == 2  # the question and the partial reply
        assert "Let me check." in "".join(p.text.text for p in stored.messages[-1].parts)

        with pytest.raises(TurnwireError) as raised:
            await collect(client.chat("budget-2", "and tomorrow?"))
        error = raised.value
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.reason == "BUDGET_EXHAUSTED" and error.error_metadata["budget"] == "tenant/day"
        assert error.message.startswith("the tenant/day budget has no room for a new turn: 1,240 of")
        quota = _detail(error, error_details_pb2.QuotaFailure)
        assert isinstance(quota, error_details_pb2.QuotaFailure)
        (violation,) = quota.violations
        assert violation.subject == "tenant/day" and "1,240 of its 1,200 tokens" in violation.description
        now = dt.datetime.now(dt.UTC)
        midnight = dt.datetime.combine(now.date() + dt.timedelta(days=1), dt.time(), dt.UTC)
        assert error.retry_delay is not None
        assert abs(error.retry_delay - (midnight - now).total_seconds()) < 60
        with pytest.raises(TurnwireError) as missing:
            await client.get_conversation("budget-2")  # nothing of the refused turn was stored
        assert missing.value.code == grpc.StatusCode.NOT_FOUND

        # An accepted submission is never dropped: its turn starts and ends with the reason.
        submitted = await client.submit_messages("budget-3", "when you can")
        assert submitted.accepted
        submission_id = submitted.submission.submission_id

        async def ended() -> bool:
            record = await client.get_submission(submission_id)
            return record.state == chat_service_pb2.SUBMISSION_STATE_ERROR

        await wait_until(ended, what="the submission ends")
        record = await client.get_submission(submission_id)
        reason = error_details_pb2.ErrorInfo()
        assert record.error.details[0].Unpack(reason) and reason.reason == "BUDGET_EXHAUSTED"

    samples = _samples(metrics_port)
    day = (("budget", "tenant/day"), ("tenant", ""))
    # The turn ended, the next refused, the submission's turn ended.
    assert samples[("turnwire_budget_exhausted_total", day)] == 3
    assert samples[("turnwire_budget_spent_tokens", day)] == 1_240


async def test_a_clamped_steps_output_stays_within_the_clamp(sidecar_factory: SidecarFactory) -> None:
    """Fresh-user trial: the scripted model ignored ``max_output_tokens``, so a step its budget
    clamped still streamed and reported its whole script, and the clamp could not be seen offline.
    Now the clamped step stops at the clamp with finish ``length``, and what it reports (its prompt
    plus its output) fits the turn's 40 tokens; the metric counts the clamp."""
    metrics_port = free_port()
    words = [f"w{i}" for i in range(60)]
    config = {
        "default_model": "scripted:long",
        "providers": {"scripted": {"scripts": {"long": [{"text": " ".join(words)}]}}},
        # No tools, no system prompt: the scripted model counts the prompt as the budget estimates it.
        "tools": {"demo": False},
        "budgets": {"turn": {"tokens": 40}},
        "metrics": {"enabled": True, "listen": f"127.0.0.1:{metrics_port}"},
    }
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat("clamped", "hi"))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, result
    (step,) = [event.step_finish for event in result.events if event.WhichOneof("event") == "step_finish"]
    assert step.finish_reason == event_pb2.FINISH_REASON_LENGTH and step.raw_finish_reason == "length"
    output = step.usage.output_tokens
    assert 0 < output < len(words) and step.usage.input_tokens + output <= 40, step.usage
    assert result.text.split() == words[:output]
    assert _samples(metrics_port)[("turnwire_budget_clamped_steps_total", (("tenant", ""),))] == 1


async def test_a_principals_daily_budget_follows_its_calls_and_submissions(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    alice, bob = new_token(), new_token()
    tokens = write_tokens_file(tmp_path / "tokens.json", {alice: ("alice", "acme"), bob: ("bob", "acme")})
    config = {
        "default_model": "scripted:weather",
        "providers": {"scripted": {"scripts": {"weather": SCRIPT}}},
        "auth": auth_config(tokens),
        "budgets": {"principal": {"day": {"tokens": 1_200}}, "assumed_max_output_tokens": 50},
    }
    sidecar = await sidecar_factory(config=config, workdir=tmp_path / "sidecar").start()
    async with TurnwireClient(sidecar.target, token=alice) as as_alice:
        spent = await collect(as_alice.chat("a1", "weather?"))  # its first step spends the day
        assert spent.status == event_pb2.TURN_STATUS_ERROR
        with pytest.raises(TurnwireError) as raised:
            await collect(as_alice.chat("a2", "again"))
        assert raised.value.reason == "BUDGET_EXHAUSTED"
        assert raised.value.error_metadata["budget"] == "principal/day"
        # Her submission runs under her budget too, whichever replica runs it, whenever.
        submitted = await as_alice.submit_messages("a3", "later")
        submission_id = submitted.submission.submission_id

        async def ended() -> bool:
            record = await as_alice.get_submission(submission_id)
            return record.state == chat_service_pb2.SUBMISSION_STATE_ERROR

        await wait_until(ended, what="alice's submission ends")
    async with TurnwireClient(sidecar.target, token=bob) as as_bob:
        # Bob, of the same tenant, has a day of his own.
        assert (await collect(as_bob.chat("b1", "weather?"))).status == event_pb2.TURN_STATUS_ERROR
        with pytest.raises(TurnwireError) as bob_raised:
            await collect(as_bob.chat("b2", "again"))
        assert bob_raised.value.error_metadata["budget"] == "principal/day"


async def test_a_step_falling_back_is_reserved_again_at_the_fallbacks_prices(
    sidecar_factory: SidecarFactory,
) -> None:
    """A dollar budget of $0.01 a turn: the Anthropic step (claude-haiku-4-5, $5 per million output
    tokens) is sent with max_tokens just under 2 000; it is overloaded before any output, so the
    step falls back to gpt-4o ($10 per million): charged only its prompt for the failed attempt, it
    is reserved again and sent with just under 1 000."""
    with ReplayServer() as anthropic, ReplayServer() as openai:
        sdk = {"api_key_env": None, "max_retries": 0}
        config = {
            "default_model": "anthropic:claude-haiku-4-5",
            "providers": {
                "anthropic": {"type": "anthropic", "base_url": anthropic.url, **sdk},
                "openai": {"type": "openai", "base_url": f"{openai.url}/v1", **sdk},
            },
            "fallback": {"models": {"anthropic:claude-haiku-4-5": ["openai:gpt-4o"]}},
            "tools": {"demo": False},
            "budgets": {"turn": {"usd": 0.01}},
        }
        sidecar = await sidecar_factory(config=config).start()
        anthropic.enqueue(Reply.error(529, OVERLOADED))
        openai.enqueue(Reply.sse(c_usage_stream(prompt=900, cached=0, output=12)))
        async with TurnwireClient(sidecar.target) as client:
            result = await collect(client.chat("falls-back", "hi"))
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, result.error
    assert 1_900 < anthropic.requests[0].json["max_tokens"] < 2_000
    sent = openai.requests[0].json
    assert 900 < sent.get("max_completion_tokens", sent.get("max_tokens", 0)) < 1_000


async def test_a_request_lowers_its_own_budget_through_the_client(sidecar_factory: SidecarFactory) -> None:
    """Fresh-user trial (stop 49): docs/cost.md says a request may lower its own budget, but the
    Python client had no way to send one. ``budget=`` on a turn-running call now does: under a
    configured turn budget that fits the script, a request's lower one ends the turn after its
    first step with the reason; the same turn without it completes. (That a request never raises
    the configured budget: tests/test_budgets_engine.py.)"""
    config = {
        "default_model": "scripted:weather",
        "providers": {"scripted": {"scripts": {"weather": SCRIPT}}},
        "budgets": {"turn": {"tokens": 100_000}, "assumed_max_output_tokens": 50},
    }
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        lowered = await collect(client.chat("own-1", "weather in Paris?", budget={"max_tokens": 1_300}))
        assert lowered.status == event_pb2.TURN_STATUS_ERROR, lowered
        assert lowered.error is not None and "turn budget" in lowered.error.message
        assert lowered.step_count == 1
        configured = await collect(client.chat("own-2", "weather in Paris?"))
        assert configured.status == event_pb2.TURN_STATUS_COMPLETED, configured
        assert configured.step_count == 2
        with pytest.raises(TypeError, match="take no budget"):
            await collect(client.submit_tool_results("own-2", {"call": "x"}, budget={"max_tokens": 5}))


async def test_a_budget_without_room_for_a_first_step_refuses_the_new_turn(
    sidecar_factory: SidecarFactory,
) -> None:
    """Fresh-user trial (stop 65): a conversation budget not spent but short of a step (1,903 of
    2,000 tokens used) admitted every new turn, stored its input, and ended it at its first step,
    unsent: each retry added an unanswered question to the conversation. Now the admission that
    sizes the first step's reservation refuses it, nothing stored, as a spent budget's does; a
    budget with room for it runs the turn."""
    config = {
        "default_model": "scripted:costly",
        "providers": {
            "scripted": {"scripts": {"costly": [{"text": "Done.", "usage": {"input_tokens": 1_900}}]}}
        },
        "budgets": {"conversation": {"tokens": 2_000}, "assumed_max_output_tokens": 50},
    }
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target) as client:
        first = await collect(client.chat("short", "hi"))
        assert first.status == event_pb2.TURN_STATUS_COMPLETED, first
        with pytest.raises(TurnwireError) as raised:
            await collect(client.chat("short", "and again?"))
        error = raised.value
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == "BUDGET_EXHAUSTED"
        assert error.message.startswith(
            "the conversation budget has no room for a new turn: 1,901 of its 2,000 tokens used or"
            " reserved, and the next step needs about "
        ), error.message
        assert error.retry_delay is None  # a conversation's budget never resets
        stored = await client.get_conversation("short")
        assert stored.message_count == 2  # the first turn's question and reply, nothing more
        # Another conversation has its own budget: its turn runs.
        other = await collect(client.chat("roomy", "hi"))
        assert other.status == event_pb2.TURN_STATUS_COMPLETED, other
