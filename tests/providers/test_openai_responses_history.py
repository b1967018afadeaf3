"""What the Responses adapter sends back of a stored history (issue 30): a reasoning item only with the
item that followed it in its step (item 8), text-only reasoning as ``replay_reasoning`` says (item 7),
and ``previous_response_id`` / ``conversation`` refused (item 11). Each request goes through the
official SDK to the replay server, which records the body it got."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from providers.helpers import (
    assistant,
    collect,
    openai_http,
    r_text_stream,
    reasoning,
    request,
    text,
    tool_call,
    user,
)
from providers.replay import ReplayServer, Reply
from turnwire.types import ModelSettings
from turnwire_client.v1 import message_pb2
from turnwire_server.providers.openai_common import ReplayReasoningSetting
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider

SIGNED = {"openai": {"item_id": "rs_1"}}
TEXT_ONLY = {"openai": {"item_id": "rs_t", "text_field": "content"}}


async def _sent(
    replay: ReplayServer,
    *messages: message_pb2.Message,
    model: str = "gpt-5.1",
    replay_reasoning: ReplayReasoningSetting = "auto",
    settings: ModelSettings | None = None,
) -> list[dict[str, Any]]:
    """The ``input`` the adapter sends for ``messages``."""
    client = openai.AsyncOpenAI(
        api_key="test-key", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    provider = OpenAIResponsesProvider("r", client, retry_delay=0.01, replay_reasoning=replay_reasoning)
    replay.enqueue(Reply.sse(r_text_stream("ok")))
    try:
        result = await collect(
            provider, request(*messages, model=model, settings=settings or ModelSettings())
        )
    finally:
        await provider.aclose()
    assert result.error is None, result.error
    items: list[dict[str, Any]] = replay.requests[-1].json["input"]
    return items


def _kinds(items: list[dict[str, Any]]) -> list[str]:
    return [item.get("type") or item["role"] for item in items]


async def test_a_reasoning_item_with_nothing_after_it_in_its_step_is_left_out(replay: ReplayServer) -> None:
    """Stored before the fix: step 1 reasoning → call, step 2 reasoning alone (the step failed)."""
    history = [
        user("Weather?"),
        assistant(
            [
                reasoning("Call it.", b"enc-1", metadata=SIGNED),
                tool_call("c1", "get_weather", {}, output="sun"),
            ],
            [reasoning("Now answer.", b"enc-2", metadata={"openai": {"item_id": "rs_2"}})],
        ),
        user("Still there?"),
    ]
    items = await _sent(replay, *history)
    assert _kinds(items) == ["user", "reasoning", "function_call", "function_call_output", "user"]
    assert items[1]["id"] == "rs_1"  # the one a call followed goes back, with its encrypted content
    assert items[1]["encrypted_content"] == "enc-1"


async def test_a_reasoning_item_followed_by_blank_text_only_is_left_out(replay: ReplayServer) -> None:
    history = [
        user("Hi"),
        assistant([reasoning("Greet.", b"enc", metadata=SIGNED), text("  ")]),
        user("Hello?"),
    ]
    assert _kinds(await _sent(replay, *history)) == ["user", "user"]


async def test_reasoning_before_text_goes_back_with_it(replay: ReplayServer) -> None:
    history = [
        user("Hi"),
        assistant([reasoning("Greet.", b"enc", metadata=SIGNED), text("Hello!")]),
        user("And?"),
    ]
    assert _kinds(await _sent(replay, *history)) == ["user", "reasoning", "assistant", "user"]


def _tool_turn_and_plain_turn() -> list[message_pb2.Message]:
    """A user turn that called a tool, then one that did not; all reasoning text-only."""
    return [
        user("Weather in Paris?"),
        assistant(
            [
                reasoning("Call the tool.", metadata=TEXT_ONLY),
                tool_call("c1", "get_weather", {}, output="sun"),
            ],
            [reasoning("Answer now.", metadata=TEXT_ONLY), text("Sunny.")],
        ),
        user("Thanks!"),
        assistant([reasoning("Be polite.", metadata=TEXT_ONLY), text("You're welcome.")]),
        user("Bye"),
    ]


@pytest.mark.parametrize(
    ("model", "setting", "sent"),
    [
        # auto: DeepSeek's family gets a tool turn's reasoning back, other models none.
        ("deepseek-v4-flash", "auto", ["Call the tool.", "Answer now."]),
        ("gpt-4.1", "auto", []),
        ("gpt-4.1", "tool_turns", ["Call the tool.", "Answer now."]),
        ("gpt-4.1", "always", ["Call the tool.", "Answer now.", "Be polite."]),
        ("deepseek-v4-flash", "never", []),
    ],
)
async def test_text_only_reasoning_goes_back_as_replay_reasoning_says(
    replay: ReplayServer, model: str, setting: ReplayReasoningSetting, sent: list[str]
) -> None:
    items = await _sent(replay, *_tool_turn_and_plain_turn(), model=model, replay_reasoning=setting)
    reasoning_items = [item for item in items if item.get("type") == "reasoning"]
    assert [item["content"][0]["text"] for item in reasoning_items] == sent
    for item in reasoning_items:  # the field it came in, as the SDK's ResponseReasoningItemParam has it
        assert item == {
            "type": "reasoning",
            "id": "rs_t",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": item["content"][0]["text"]}],
        }
    assert _kinds([i for i in items if i.get("type") != "reasoning"]) == [
        "user",
        "function_call",
        "function_call_output",
        "assistant",
        "user",
        "assistant",
        "user",
    ]


async def test_thinking_turned_off_sends_no_reasoning_text_back(replay: ReplayServer) -> None:
    """DeepSeek's Responses switch: ``reasoning: {effort: none}`` disables thinking mode."""
    options = {"r": {"reasoning": {"effort": "none"}}}
    items = await _sent(
        replay,
        *_tool_turn_and_plain_turn(),
        model="deepseek-v4-flash",
        settings=ModelSettings(provider_options=options),
    )
    assert "reasoning" not in _kinds(items)


async def test_reasoning_of_another_api_never_goes_back(replay: ReplayServer) -> None:
    history = [
        user("Weather?"),
        assistant(
            [
                reasoning("Thinking.", b"sig", metadata={"anthropic": {"type": "thinking"}}),
                tool_call("c1", "t", {}),
            ],
            [reasoning("No metadata."), text("Done.")],
        ),
        user("Ok"),
    ]
    items = await _sent(replay, *history, model="deepseek-v4-flash", replay_reasoning="always")
    assert "reasoning" not in _kinds(items)


@pytest.mark.parametrize("option", ["previous_response_id", "conversation"])
async def test_options_that_would_send_items_twice_are_refused(
    replay: ReplayServer, responses_provider: OpenAIResponsesProvider, option: str
) -> None:
    settings = ModelSettings(provider_options={"openai-responses": {option: "resp_123"}})
    result = await collect(responses_provider, request(user("hi"), settings=settings))
    error = result.error
    assert error is not None
    assert (error.type, error.code, error.retryable, error.status) == (
        "invalid_request_error",
        "unsupported_provider_option",
        False,
        0,
    )
    assert f"provider_options {option} is not supported" in error.message
    assert "remove it" in error.message
    assert replay.requests == []  # nothing was sent


async def test_a_null_previous_response_id_is_no_option(
    replay: ReplayServer, responses_provider: OpenAIResponsesProvider
) -> None:
    replay.enqueue(Reply.sse(r_text_stream("ok")))
    settings = ModelSettings(provider_options={"openai-responses": {"previous_response_id": None}})
    result = await collect(responses_provider, request(user("hi"), settings=settings))
    assert result.error is None and result.text == "ok"
