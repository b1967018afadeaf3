"""Reasoning sent back on Chat Completions (issue 30, item 7): DeepSeek's thinking mode answers 400
("The reasoning_content in the thinking mode must be passed back to the API.") when an assistant
message of a user turn that called tools lacks ``reasoning_content``
(https://api-docs.deepseek.com/guides/thinking_mode). The provider entry's ``replay_reasoning``
decides (``auto``: by model family); the rule is applied when the history is read, so messages
stored before it existed are sent right too."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from providers.helpers import assistant, reasoning, request, text, tool_call, user
from turnwire.types import ModelSettings
from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CacheBudget
from turnwire_server.providers import openai_chat_request
from turnwire_server.providers.convert import PrefixStates
from turnwire_server.providers.openai_chat_request import build_request
from turnwire_server.providers.openai_common import ReplayReasoning, replay_reasoning_for


def _tool_turn() -> message_pb2.Message:
    """A user turn that called a tool: reasoning + call, then reasoning + the answer."""
    return assistant(
        [reasoning("Need the weather."), tool_call("c1", "get_weather", {"city": "Paris"}, output="sunny")],
        [reasoning("It is sunny."), text("Sunny in Paris.")],
    )


def _history() -> list[message_pb2.Message]:
    return [
        user("Weather in Paris?"),
        _tool_turn(),
        user("Thanks! And 2+2?"),
        assistant([reasoning("Easy."), text("4.")]),
        user("Bye."),
    ]


def _assistants(model: str, history: list[message_pb2.Message], **kwargs: Any) -> list[dict[str, Any]]:
    body, _ = build_request(
        request(*history, model=model, **kwargs.pop("request", {})),
        provider="deepseek",
        max_tokens_param="max_tokens",
        include_usage=True,
        **kwargs,
    )
    return [m for m in body["messages"] if m["role"] == "assistant"]


def test_a_tool_turn_sends_its_reasoning_back_to_deepseek() -> None:
    sent = _assistants("deepseek-reasoner", _history())
    assert [m.get("reasoning_content") for m in sent] == ["Need the weather.", "It is sunny.", None]
    assert sent[0]["tool_calls"][0]["id"] == "c1" and sent[1]["content"] == "Sunny in Paris."


def test_a_tool_call_without_reasoning_still_carries_the_field() -> None:
    history = [user("Time?"), assistant([tool_call("c1", "get_time", {}, output="12:00")], [text("Noon.")])]
    sent = _assistants("deepseek-v4-flash", history)
    assert [m.get("reasoning_content") for m in sent] == ["", ""]


@pytest.mark.parametrize(
    ("model", "setting", "options", "expected"),
    [
        ("deepseek-reasoner", "auto", {}, "tool_turns"),
        ("deepseek-chat", "auto", {"thinking": {"type": "enabled"}}, "tool_turns"),
        ("deepseek/deepseek-r1", "auto", {}, "tool_turns"),  # a vendor prefix (OpenRouter)
        ("deepseek-ai/DeepSeek-V3.2", "auto", {}, "tool_turns"),
        ("kimi-k2-thinking", "auto", {}, "tool_turns"),
        ("kimi-k2.5", "auto", {}, "tool_turns"),
        ("deepseek-v4-pro", "auto", {"thinking": {"type": "disabled"}}, None),
        ("gpt-4.1", "auto", {}, None),
        ("moonshot-v1-8k", "auto", {}, None),
        ("deepseek-reasoner", "never", {}, None),
        ("gpt-4.1", "tool_turns", {}, "tool_turns"),
        ("llama3.1", "always", {}, "always"),
    ],
)
def test_which_requests_send_reasoning_back(
    model: str, setting: Any, options: dict[str, Any], expected: str | None
) -> None:
    assert replay_reasoning_for(setting, model, options) == expected


def test_other_models_get_no_reasoning() -> None:
    assert all("reasoning_content" not in m for m in _assistants("gpt-4.1", _history()))
    options = ModelSettings(provider_options={"deepseek": {"thinking": {"type": "disabled"}}})
    sent = _assistants("deepseek-v4-pro", _history(), request={"settings": options})
    assert all("reasoning_content" not in m for m in sent)


def test_always_sends_every_assistant_messages_reasoning() -> None:
    sent = _assistants("llama3.1", _history(), replay_reasoning="always")
    assert [m.get("reasoning_content") for m in sent] == ["Need the weather.", "It is sunny.", "Easy."]


def test_a_continued_reply_that_calls_a_tool_gets_the_turns_reasoning() -> None:
    """ContinueLastTurn stored a second assistant message; the tool call comes in the second, so the
    first one's reasoning (already converted) goes back too, merged into one Chat message."""
    history = [
        user("Weather?"),
        assistant([reasoning("Start."), text("Let me")]),
        assistant(
            [reasoning("Look it up."), text(" check."), tool_call("c1", "get_weather", {}, output="sun")]
        ),
    ]
    sent = _assistants("deepseek-reasoner", history)
    assert sent == [
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Start.\n\nLook it up.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}
            ],
        }
    ]


def test_reasoning_of_a_step_cut_short_goes_with_the_next_step() -> None:
    history = [
        user("Weather?"),
        assistant([reasoning("Half a thought")], [reasoning("Again."), tool_call("c1", "w", {}, output="x")]),
    ]
    sent = _assistants("deepseek-reasoner", history)
    assert [m.get("reasoning_content") for m in sent] == ["Half a thought\n\nAgain."]


def test_redacted_reasoning_is_not_sent() -> None:
    history = [
        user("Weather?"),
        assistant([reasoning("", b"opaque", redacted=True), tool_call("c1", "w", {}, output="x")]),
    ]
    assert [m.get("reasoning_content") for m in _assistants("deepseek-reasoner", history)] == [""]


def _afresh(history: list[message_pb2.Message], replay: Any) -> list[dict[str, Any]]:
    original, prefixes = openai_chat_request._converted, openai_chat_request._prefixes
    openai_chat_request._converted = openai_chat_request._convert_message
    openai_chat_request._prefixes = PrefixStates("off", budget=CacheBudget(0))
    try:
        return openai_chat_request.convert_messages("sys", history, [], replay_reasoning=replay)
    finally:
        openai_chat_request._converted, openai_chat_request._prefixes = original, prefixes


@pytest.mark.parametrize("replay", ["tool_turns", "always", None])
def test_requests_going_on_from_kept_state_equal_ones_converted_afresh(replay: Any) -> None:
    """Each request's state is kept (issue 17): a request that goes on from an earlier one's messages
    (the tool loop's next step, a continued reply that then calls a tool) sends what a conversion
    of the whole history sends."""
    history = [
        user("Weather?"),
        assistant([reasoning("Start."), text("Let me")]),
        assistant([reasoning("Look."), tool_call("c1", "w", {}, output="sun")]),
        user("Thanks"),
        *_history(),
    ]
    for end in range(1, len(history) + 1):
        prefix = history[:end]
        kept = openai_chat_request.convert_messages("sys", prefix, [], replay_reasoning=replay)
        assert kept == _afresh([copy.deepcopy(m) for m in prefix], replay), end
    # The same messages with another setting are not mixed up with the kept state.
    other: ReplayReasoning = "always" if replay != "always" else None
    assert openai_chat_request.convert_messages("sys", history, [], replay_reasoning=other) == _afresh(
        history, other
    )
