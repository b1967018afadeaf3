"""The Anthropic Messages adapter: what it sends (recorded by the replay server) and what it streams."""

from __future__ import annotations

from typing import Any

import pytest

from providers.helpers import (
    Stored,
    a_block,
    a_blocks,
    a_delta,
    a_end,
    a_json,
    a_start,
    a_stop,
    a_text,
    a_text_stream,
    anthropic_sse,
    assistant,
    collect,
    image,
    reasoning,
    request,
    system,
    text,
    tool_call,
    user,
)
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ModelSettings, ToolDefinition
from turnwire_client.v1 import message_pb2
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.anthropic_request import OUTPUT_TOOL, convert_messages
from turnwire_server.providers.convert import EMPTY_USER_TEXT, TRUNCATED_TOOL_CALL_ERROR

WEATHER = ToolDefinition(
    "get_weather",
    "Current weather for a city",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = ToolDefinition("get_time", "", {"type": "object", "properties": {}})


async def test_text_only(replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider) -> None:
    replay.enqueue(Reply.sse(a_text_stream("Hello there.")))
    result = await collect(anthropic_provider, request(user("hi")))
    kinds = [type(c).__name__ for c in result.chunks]
    assert kinds == ["TextStart", "TextDelta", "TextEnd", "FinishStep"]
    assert result.text == "Hello there."
    finish = result.finish
    assert (finish.finish_reason, finish.raw_finish_reason) == ("stop", "end_turn")
    assert (finish.response_id, finish.response_model) == ("msg_1", "claude-test")
    assert (finish.usage.input_tokens, finish.usage.output_tokens, finish.usage.total_tokens) == (10, 5, 15)
    # Usage as it was reported: message_start's input, then message_delta's cumulative total.
    assert [(u.input_tokens, u.output_tokens) for u in result.usage_updates] == [(10, 1), (10, 5)]
    sent = replay.requests[0]
    assert (sent.method, sent.path) == ("POST", "/v1/messages")
    assert sent.headers["authorization"] == "Bearer test-key"
    assert sent.headers["anthropic-version"] == "2026-10-21"
    assert sent.json == {
        "model": "m",
        "max_tokens": 8192,
        "messages": [{"role": "user", "content": "hi"}],  # one text block as its string shorthand
        "system": "You are terse.",
        "stream": True,
    }


async def test_one_tool_call(replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider) -> None:
    replay.enqueue(
        Reply.sse(
            anthropic_sse(
                a_start(),
                a_block(0, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
                a_json(0, ""),
                a_json(0, '{"ci'),
                a_json(0, 'ty": "Oslo"}'),
                a_stop(0),
                *a_end("tool_use"),
            )
        )
    )
    result = await collect(anthropic_provider, request(user("weather?"), tools=[WEATHER]))
    assert [type(c).__name__ for c in result.chunks] == [
        "ToolInputStart",
        "ToolInputDelta",
        "ToolInputDelta",
        "ToolCall",
        "FinishStep",
    ]
    assert result.calls == [
        base.ToolCall("toolu_1", "get_weather", {"city": "Oslo"}, raw_input='{"city": "Oslo"}')
    ]
    assert result.finish.finish_reason == "tool-calls"
    assert replay.requests[0].json["tools"] == [
        {
            "name": "get_weather",
            "input_schema": dict(WEATHER.input_schema),
            "description": WEATHER.description,
        }
    ]
    assert replay.requests[0].json["tool_choice"] == {"type": "auto"}


async def test_no_argument_tool(replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider) -> None:
    block = {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}}
    replay.enqueue(Reply.sse(anthropic_sse(a_start(), a_block(0, block), a_stop(0), *a_end("tool_use"))))
    result = await collect(anthropic_provider, request(tools=[CLOCK]))
    assert result.calls == [base.ToolCall("toolu_2", "get_time", {}, raw_input="{}")]


async def test_max_tokens_mid_tool_call_is_never_runnable(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    replay.enqueue(
        Reply.sse(
            anthropic_sse(
                a_start(),
                a_block(0, {"type": "tool_use", "id": "toolu_1", "name": "write_file", "input": {}}),
                a_json(0, '{"path": "a.md", "content": "# Title\\n\\nSome'),
                a_stop(0),
                *a_end("max_tokens", 64),
            )
        )
    )
    result = await collect(anthropic_provider, request())
    (call,) = result.calls
    assert call.input is None and call.error == TRUNCATED_TOOL_CALL_ERROR
    assert call.raw_input == '{"path": "a.md", "content": "# Title\\n\\nSome'
    assert (result.finish.finish_reason, result.finish.raw_finish_reason) == ("length", "max_tokens")


async def test_complete_call_before_the_limit_is_not_run_either(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    replay.enqueue(
        Reply.sse(
            anthropic_sse(
                a_start(),
                a_block(0, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
                a_json(0, '{"city": "Oslo"}'),
                a_stop(0),
                a_block(1, {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {}}),
                a_json(1, '{"city": "Ber'),
                *a_end("max_tokens"),
            )
        )
    )
    result = await collect(anthropic_provider, request(tools=[WEATHER]))
    assert [c.error for c in result.calls] == [TRUNCATED_TOOL_CALL_ERROR] * 2
    assert result.finish.finish_reason == "length"


THINKING_CASE = "anthropic_thinking_signature_then_tool_use.sse"
SIGNATURE = (
    "EpYCCkYICxgCKkC7Qk1VbZr3a9Xc2fE4hJ6kL8mN0pR2tV4xZ6bD8fH0jL2nP4rT6vX8zB0dF2hJ4lN6pR8tV0xZ2bD4fH6jL8n"
    "EgzK9mQ3rW7tY1uI5oP9aSGgxHk4lJ8nM2qR6vY0cF3iK7oDAXJ5u"
)


async def test_thinking_round_trips_with_its_signature(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    stat = ToolDefinition("stat_file", "", {"type": "object", "properties": {"path": {"type": "string"}}})
    replay.enqueue(Reply.sse(THINKING_CASE), Reply.sse(a_text_stream("It is 2.5 MB.")))
    question = user("How big is reports/q3.pdf in MB?")
    first = await collect(anthropic_provider, request(question, tools=[stat]))
    stored = Stored().step(first.chunks, {"toolu_01Dk3fJ6hL9gK2jM5nB8vC1x": {"bytes": 2621440}}).build()
    second = await collect(anthropic_provider, request(question, stored, tools=[stat], step_number=1))
    assert second.text == "It is 2.5 MB."
    messages = replay.requests[1].json["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {
            "type": "thinking",
            "thinking": "The user wants the file size in megabytes. "
            "I should stat the file first, then convert bytes to MB.",
            "signature": SIGNATURE,
        },
        {"type": "text", "text": "Let me look up that file."},
        {
            "type": "tool_use",
            "id": "toolu_01Dk3fJ6hL9gK2jM5nB8vC1x",
            "name": "stat_file",
            "input": {"path": "reports/q3.pdf"},
        },
    ]
    assert messages[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01Dk3fJ6hL9gK2jM5nB8vC1x",
            "content": '{"bytes":2621440}',
        }
    ]


async def test_redacted_thinking_round_trips_opaque(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    data = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpP"
    replay.enqueue(
        Reply.sse(
            anthropic_sse(
                a_start(),
                a_block(0, {"type": "redacted_thinking", "data": data}),
                a_stop(0),
                a_block(1, {"type": "text", "text": ""}),
                a_text(1, "Done."),
                a_stop(1),
                *a_end(),
            )
        ),
        Reply.sse(a_text_stream()),
    )
    first = await collect(anthropic_provider, request())
    (end,) = first.of(base.ReasoningEnd)
    assert end.redacted and end.signature == data.encode()
    stored = Stored().step(first.chunks).build()
    await collect(anthropic_provider, request(user("hi"), stored, user("again")))
    assistant_turn = replay.requests[1].json["messages"][1]
    assert assistant_turn["content"] == [
        {"type": "redacted_thinking", "data": data},
        {"type": "text", "text": "Done."},
    ]


async def test_transcript_rules(replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider) -> None:
    """Merged same-role turns, tool_result first, no empty text, foreign reasoning dropped, all part kinds."""
    pdf = message_pb2.FilePart(media_type="application/pdf", data=b"%PDF-1.7", filename="q3.pdf")
    notes = message_pb2.FilePart(media_type="text/plain", data=b"line one")
    by_url = message_pb2.FilePart(media_type="image/jpeg", url="https://example.com/cat.jpg")
    history = [
        system("Answer in English."),
        user("Look:", image(b"PNG"), pdf, notes, by_url),
        user(""),  # an empty Chat message still counts
        assistant(
            [
                reasoning("foreign", b"sig", metadata={"openai": {"item_id": "rs_1"}}),
                text(""),
                text("   "),
                text("Checking."),
                tool_call("t1", "get_weather", {"city": "Oslo", "days": 3}, output={"temp": 3}),
                tool_call("t2", "get_weather", {"city": "Rome"}, error="timeout"),
                tool_call("t3", "get_weather", {"city": "Paris"}),  # no result: interrupted
            ],
            [text("Oslo is cold.")],
        ),
        user("Thanks"),
    ]
    replay.enqueue(Reply.sse(a_text_stream()))
    await collect(anthropic_provider, request(*history, tools=[WEATHER]))
    body = replay.requests[0].json
    assert body["system"] == "You are terse.\n\nAnswer in English."
    messages = body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    assert messages[0]["content"] == [
        {"type": "text", "text": "Look:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "UE5H"}},
        {
            "type": "document",
            "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjc="},
            "title": "q3.pdf",
        },
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "line one"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
        {"type": "text", "text": EMPTY_USER_TEXT},
    ]
    assert messages[1]["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo", "days": 3}},
        {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {"city": "Rome"}},
        {"type": "tool_use", "id": "t3", "name": "get_weather", "input": {"city": "Paris"}},
    ]
    assert messages[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "t1", "content": '{"temp":3}'},
        {"type": "tool_result", "tool_use_id": "t2", "content": "timeout", "is_error": True},
        {
            "type": "tool_result",
            "tool_use_id": "t3",
            "is_error": True,
            "content": "The tool call was interrupted before a result was recorded.",
        },
    ]
    assert messages[3]["content"] == "Oslo is cold."
    assert messages[4]["content"] == "Thanks"


async def test_tool_results_come_before_user_text_in_a_merged_turn(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    history = [user("go"), assistant([tool_call("t1", "get_time", {}, output="12:00")]), user("and now?")]
    replay.enqueue(Reply.sse(a_text_stream()))
    await collect(anthropic_provider, request(*history, tools=[CLOCK]))
    last = replay.requests[0].json["messages"][-1]
    assert last == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "12:00"},
            {"type": "text", "text": "and now?"},
        ],
    }


def test_a_turn_of_one_text_block_is_sent_as_its_string() -> None:
    """The Messages API takes a string ``content`` as exactly one text block: one object per turn
    instead of three for the SDK to copy and encode. Any other content stays a list."""
    history = [
        user("What is the weather?"),
        assistant([text("Sunny.")]),
        user("And with a picture?", image(b"PNG")),
        assistant([reasoning("hm", b"sig", metadata={"anthropic": {}}), text("A cat.")]),
        user("thanks"),
    ]
    _, turns = convert_messages(history, [])
    assert turns[0] == {"role": "user", "content": "What is the weather?"}
    assert turns[1] == {"role": "assistant", "content": "Sunny."}
    assert [b["type"] for b in turns[2]["content"]] == ["text", "image"]
    assert [b["type"] for b in turns[3]["content"]] == ["thinking", "text"]
    assert turns[4] == {"role": "user", "content": "thanks"}


def test_an_empty_user_message_is_sent_as_the_placeholder_string() -> None:
    _, turns = convert_messages([user("")], [])
    assert turns == [{"role": "user", "content": EMPTY_USER_TEXT}]


def test_a_string_turn_merged_with_blocks_becomes_a_list_and_the_kept_turn_stays_a_string() -> None:
    """Merging copies: the kept (shared) turn of the first message is never changed."""
    first, second = user("Look:"), user("this", image(b"PNG"))
    first.id, second.id = "m1", "m2"
    for _ in range(2):
        _, turns = convert_messages([first, second], [])
        assert turns == [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look:"},
                    {"type": "text", "text": "this"},
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": "UE5H"},
                    },
                ],
            }
        ]
    assert convert_messages([first], [])[1] == [{"role": "user", "content": "Look:"}]
    _, turns = convert_messages([user("one"), user("two")], [])
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}
    ]


def test_a_user_turn_of_tool_results_and_text_stays_a_list_results_first() -> None:
    history = [
        user("go"),
        assistant([text("Checking."), tool_call("t1", "get_time", {}, output="12:00")]),
        user("and now?"),
    ]
    for _ in range(2):  # the second time from kept conversions
        _, turns = convert_messages(history, [])
        assert turns[0] == {"role": "user", "content": "go"}
        assert turns[2] == {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "12:00"},
                {"type": "text", "text": "and now?"},
            ],
        }
    assert convert_messages(history[2:], [])[1] == [{"role": "user", "content": "and now?"}]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ("get_time", {"type": "tool", "name": "get_time"}),
    ],
)
async def test_tool_choice(
    choice: str, expected: dict[str, Any], replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    replay.enqueue(Reply.sse(a_text_stream()))
    await collect(anthropic_provider, request(tools=[WEATHER, CLOCK], tool_choice=choice))
    body = replay.requests[0].json
    assert body["tool_choice"] == expected
    assert [t["name"] for t in body["tools"]] == ["get_weather", "get_time"]


async def test_settings_and_passthrough(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    settings = ModelSettings(
        max_output_tokens=300,
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        seed=7,
        stop_sequences=["END", "  "],
        headers={"x-trace": "abc"},
        timeout_seconds=30,
        provider_options={
            "anthropic": {
                "metadata": {"user_id": "u1"},
                "thinking": {"type": "adaptive"},
                "speed": "fast",
                "context_management": {"edits": []},
            },
            "openai": {"seed": 1},
        },
    )
    replay.enqueue(Reply.sse(a_text_stream()))
    result = await collect(anthropic_provider, request(settings=settings))
    sent = replay.requests[0]
    body = sent.json
    assert body["max_tokens"] == 300
    assert body["stop_sequences"] == ["END"]
    for absent in ("temperature", "top_p", "top_k", "seed"):
        assert absent not in body  # rejected by API version 2026-10-21
    assert body["metadata"] == {"user_id": "u1"}
    assert body["thinking"] == {"type": "adaptive"}
    assert body["speed"] == "fast"
    assert body["context_management"] == {"edits": []}  # not an SDK parameter: sent through extra_body
    assert sent.headers["x-trace"] == "abc"
    assert sent.headers["x-stainless-read-timeout"] == "30"
    warnings = result.finish.warnings
    assert any("temperature" in w for w in warnings) and any("top_k" in w for w in warnings)


@pytest.mark.parametrize(
    ("settings", "kwargs", "message"),
    [
        (ModelSettings(max_output_tokens=0), {}, "max_tokens must be at least 1"),
        (ModelSettings(), {"tool_choice": "nope"}, "not among"),
        (
            ModelSettings(provider_options={"anthropic": {"thinking": {"type": "adaptive"}}}),
            {"tool_choice": "required"},
            "thinking",
        ),
        (
            ModelSettings(
                max_output_tokens=2000,
                provider_options={"anthropic": {"thinking": {"type": "enabled", "budget_tokens": 4000}}},
            ),
            {},
            "budget_tokens",
        ),
    ],
)
async def test_requests_the_api_would_reject_are_not_sent(
    settings: ModelSettings,
    kwargs: dict[str, Any],
    message: str,
    replay: ReplayServer,
    anthropic_provider: AnthropicMessagesProvider,
) -> None:
    result = await collect(anthropic_provider, request(settings=settings, tools=[WEATHER], **kwargs))
    assert result.error is not None and message in result.error.message
    assert (result.error.status, result.error.retryable) == (0, False)
    assert replay.requests == []


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}},
    "required": ["city", "temp_c"],
    "additionalProperties": False,
}


def _output_stream(fragments: list[str]) -> bytes:
    block = {"type": "tool_use", "id": "toolu_9", "name": OUTPUT_TOOL, "input": {}}
    deltas = [a_json(0, f) for f in fragments]
    return anthropic_sse(a_start(), a_block(0, block), *deltas, a_stop(0), *a_end("tool_use"))


async def test_structured_output_through_a_forced_tool(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    replay.enqueue(Reply.sse(_output_stream(['{"city": "Oslo",', ' "temp_c": -3.5}'])))
    result = await collect(anthropic_provider, request(output_schema=SCHEMA))
    assert result.error is None
    assert result.text == '{"city": "Oslo", "temp_c": -3.5}'
    assert result.calls == []
    assert result.finish.finish_reason == "stop"
    body = replay.requests[0].json
    assert body["tool_choice"] == {"type": "tool", "name": OUTPUT_TOOL}
    assert body["tools"][0]["name"] == OUTPUT_TOOL and body["tools"][0]["input_schema"] == SCHEMA


async def test_structured_output_not_matching_the_schema_fails(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    replay.enqueue(Reply.sse(_output_stream(['{"city": 5}'])))
    result = await collect(anthropic_provider, request(output_schema=SCHEMA))
    assert result.error is not None and result.error.type == "structured_output_invalid"
    assert "'temp_c' is a required property" in result.error.message
    assert "/city: 5 is not of type 'string'" in result.error.message


async def test_structured_output_native_when_thinking(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    answer = anthropic_sse(
        a_start(),
        a_block(0, {"type": "text", "text": ""}),
        a_text(0, '{"city": "Oslo", "temp_c": 1}'),
        a_stop(0),
        *a_end(),
    )
    replay.enqueue(Reply.sse(answer))
    options = {"anthropic": {"thinking": {"type": "adaptive"}}}
    result = await collect(
        anthropic_provider, request(output_schema=SCHEMA, settings=ModelSettings(provider_options=options))
    )
    assert result.error is None and result.finish.finish_reason == "stop"
    body = replay.requests[0].json
    assert body["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    assert "tools" not in body and "tool_choice" not in body


async def test_citations_become_sources(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    citation = {
        "type": "web_search_result_location",
        "url": "https://example.com/a",
        "title": "A",
        "cited_text": "x",
        "encrypted_index": "e",
    }
    replay.enqueue(
        Reply.sse(
            anthropic_sse(
                a_start(),
                a_block(0, {"type": "text", "text": ""}),
                a_delta(0, {"type": "citations_delta", "citation": citation}),
                a_delta(0, {"type": "citations_delta", "citation": citation}),
                a_text(0, "Cited."),
                a_stop(0),
                *a_end(),
            )
        )
    )
    result = await collect(anthropic_provider, request())
    # The same citation twice in one block is one source, with its cited text, tied to the block.
    assert result.of(base.Source) == [
        base.Source(
            "s0-src1",
            url="https://example.com/a",
            title="A",
            cited_text="x",
            text_id="s0-0",
            provider_metadata={"anthropic": {"type": "web_search_result_location", "encrypted_index": "e"}},
        )
    ]


def test_tool_use_ids_are_made_valid_and_unique_for_the_messages_api() -> None:
    """Ids from other providers (the scripted model's per-turn ``call_0_0``, ``functions.get_weather:0``
    from OpenAI-compatible servers) would get a 400; each call and its result get the same stand-in."""
    messages = [
        user("weather?"),
        assistant([tool_call("call_0_0", "get_weather", {"city": "Paris"}, output="sunny")]),
        user("and the time?"),
        assistant([tool_call("call_0_0", "get_time", {}, output="noon")]),
        user("and Oslo?"),
        assistant([tool_call("functions.get_weather:0", "get_weather", {"city": "Oslo"}, output="rain")]),
        user("thanks"),
    ]
    _, turns = convert_messages(messages, [])
    uses = [b["id"] for t in turns for b in a_blocks(t) if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for t in turns for b in a_blocks(t) if b["type"] == "tool_result"]
    assert uses == ["call_0_0", "call_0_0_2", "functions_get_weather_0"]
    assert results == uses
