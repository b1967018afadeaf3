"""What the HTTP doors tell a client about sending a refused request again (docs/api/http.md,
"Retries"), against a real ``turnwire serve``: a spent budget answers 429 with ``Retry-After``
(seconds to its reset) and ``x-should-retry: false`` on the OpenAI door (Responses and Chat
Completions), the AI SDK door and the AG-UI door, so the official ``openai`` SDK, retries on
(its default, 2), sends the request once instead of three times; a non-streamed Chat Completions
turn that ran and failed answers 500 with ``x-should-retry: false``, so the SDK does not run the
turn again. Before, both were sent three times (the SDK retries 429 and 5xx after 0.5-8 s)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2
import openai
import orjson
import pytest
from support.http_sidecar import http_base, http_sidecar_config
from support.sidecar import SidecarFactory, SidecarProcess
from support.tokens import new_token

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

TOKEN = new_token()
SCRIPTS = {
    # One step's reported use (1 240 tokens) spends the tenant's day (1 200): the next turn is
    # refused at its admission.
    "spend": [{"text": "Spent.", "usage": {"input_tokens": 1200, "output_tokens": 40}}],
    "echo": [{"text": "unreachable"}],
    # A provider 500 (api_error) after output: a 5xx the OpenAI SDK would retry but for x-should-retry
    # (a 400 is an invalid_request_error now, as Anthropic types it, which no SDK retries).
    "fails": [
        {"text": "partial ", "error": {"message": "the model is down", "status": 500, "after_chunks": 1}}
    ],
    # The first step reports 1 240 tokens: the tenant's day (1 200) has no room for a second.
    "overspends": [
        {
            "text": "Let me check.",
            "tool_calls": [{"name": "get_weather", "input": {"city": "Paris"}}],
            "usage": {"input_tokens": 1200, "output_tokens": 40},
        },
        {"text": "unreachable"},
    ],
}


class CountingClient:
    """The official ``openai`` SDK with its default retries (2), counting the requests it sends."""

    def __init__(self, sidecar: SidecarProcess) -> None:
        self.sent: list[str] = []

        async def count(request: object) -> None:
            self.sent.append(str(getattr(request, "url", "")))

        self.client = openai.AsyncOpenAI(
            base_url=f"{http_base(sidecar)}/v1",
            api_key=TOKEN,
            http_client=openai.DefaultAsyncHttpxClient(event_hooks={"request": [count]}),
        )


@pytest.fixture
async def spent(
    sidecar_factory: SidecarFactory, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SidecarProcess]:
    """A sidecar whose tenant has spent its day's budget (one turn did)."""
    config = http_sidecar_config(tmp_path_factory.mktemp("door-retries"), {TOKEN: ("alice", "acme")}, SCRIPTS)
    config["budgets"] = {"tenant": {"day": {"tokens": 1_200}}, "assumed_max_output_tokens": 50}
    sidecar = await sidecar_factory(config=config).start()
    async with TurnwireClient(sidecar.target, token=TOKEN) as client:
        result = await collect(client.chat("spender", "spend it", model="scripted:spend"))
        assert result.status == event_pb2.TURN_STATUS_COMPLETED, result
    yield sidecar


def _refused_for_the_day(headers: httpx2.Headers | dict[str, str]) -> None:
    assert headers["x-should-retry"] == "false"
    assert 0 < int(headers["retry-after"]) <= 86_400  # seconds to midnight UTC


async def test_a_spent_budget_is_not_retried_by_the_openai_sdk(spent: SidecarProcess) -> None:
    counting = CountingClient(spent)
    with pytest.raises(openai.RateLimitError) as raised:
        await counting.client.responses.create(model="scripted:echo", input="hi", conversation="door-r1")
    assert raised.value.code == "budget_exhausted"
    _refused_for_the_day(dict(raised.value.response.headers))
    with pytest.raises(openai.RateLimitError) as raised:
        await counting.client.chat.completions.create(
            model="scripted:echo", messages=[{"role": "user", "content": "hi"}]
        )
    _refused_for_the_day(dict(raised.value.response.headers))
    # Once each: without x-should-retry the SDK sends each three times.
    assert [url.rsplit("/v1/", 1)[1] for url in counting.sent] == ["responses", "chat/completions"]
    await counting.client.close()


async def test_the_ai_sdk_and_ag_ui_doors_say_so_too(spent: SidecarProcess) -> None:
    user = {"id": "u1", "role": "user", "parts": [{"type": "text", "text": "hi"}]}
    async with httpx2.AsyncClient(headers={"authorization": f"Bearer {TOKEN}"}, timeout=30) as http:
        ai_sdk = await http.post(
            f"{http_base(spent)}/v1/ai-sdk/chat",
            json={"id": "door-r2", "messages": [user], "trigger": "submit-message", "model": "scripted:echo"},
        )
        ag_ui = await http.post(
            f"{http_base(spent)}/v1/ag-ui",
            headers={"accept": "text/event-stream"},
            json={
                "threadId": "door-r3",
                "runId": "door-r3-r1",
                "messages": [{"id": "u1", "role": "user", "content": "hi"}],
                "tools": [],
                "context": [],
                "state": {},
                "forwardedProps": {"model": "scripted:echo"},
            },
        )
    assert ai_sdk.status_code == 429 and "tenant/day budget" in ai_sdk.text
    _refused_for_the_day(dict(ai_sdk.headers))
    assert ag_ui.status_code == 429 and ag_ui.json()["code"] == "budget_exhausted"
    _refused_for_the_day(dict(ag_ui.headers))


async def test_a_failed_chat_completions_turn_is_not_run_again(
    sidecar_factory: SidecarFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    config = http_sidecar_config(tmp_path_factory.mktemp("door-ran"), {TOKEN: ("alice", "acme")}, SCRIPTS)
    sidecar = await sidecar_factory(config=config).start()
    counting = CountingClient(sidecar)
    with pytest.raises(openai.InternalServerError) as raised:
        await counting.client.chat.completions.create(
            model="scripted:fails", messages=[{"role": "user", "content": "hi"}]
        )
    assert "the model is down" in str(raised.value)
    assert raised.value.response.headers["x-should-retry"] == "false"
    assert len(counting.sent) == 1  # the SDK would otherwise run the turn three times
    await counting.client.close()


async def test_a_chat_completions_turn_its_budget_ended_answers_as_the_refusal_would(
    sidecar_factory: SidecarFactory, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A turn that ran and ended at a step its budget had no room for answers with the status
    and error the budget's refusal has (429 ``rate_limit_error``, ``code`` ``budget_exhausted``,
    ``Retry-After`` to the reset), streamed or not; before, always 500 ``server_error``."""
    other = new_token()
    tokens = {TOKEN: ("alice", "acme"), other: ("bob", "globex")}
    config = http_sidecar_config(tmp_path_factory.mktemp("door-spent"), tokens, SCRIPTS)
    config["budgets"] = {"tenant": {"day": {"tokens": 1_200}}, "assumed_max_output_tokens": 50}
    sidecar = await sidecar_factory(config=config).start()
    counting = CountingClient(sidecar)
    with pytest.raises(openai.RateLimitError) as raised:
        await counting.client.chat.completions.create(
            model="scripted:overspends", messages=[{"role": "user", "content": "weather in Paris?"}]
        )
    assert raised.value.code == "budget_exhausted" and raised.value.type == "rate_limit_error"
    assert "tenant/day budget" in raised.value.message
    _refused_for_the_day(raised.value.response.headers)
    assert len(counting.sent) == 1

    # Streamed, on another tenant's day: the stream's error chunk is the same error body.
    async with httpx2.AsyncClient(base_url=f"{http_base(sidecar)}/v1", timeout=30) as http:
        body = {
            "model": "scripted:overspends",
            "messages": [{"role": "user", "content": "weather in Paris?"}],
            "stream": True,
        }
        response = await http.post(
            "/chat/completions", json=body, headers={"authorization": f"Bearer {other}"}
        )
    assert response.status_code == 200
    errors = [line for line in response.text.splitlines() if line.startswith('data: {"error"')]
    (line,) = errors
    error = orjson.loads(line.removeprefix("data: "))["error"]
    assert error["code"] == "budget_exhausted" and error["type"] == "rate_limit_error", error
    await counting.client.close()
