"""The Chat Completions adapter (OpenAI and OpenAI-compatible servers): requests sent, chunks streamed."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from providers.helpers import (
    Stored,
    assistant,
    c_call,
    c_chunk,
    chat_sse,
    collect,
    image,
    openai_http,
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
from turnwire_server.providers.convert import TRUNCATED_TOOL_CALL_ERROR
from turnwire_server.providers.openai_chat import OpenAIChatProvider

WEATHER = ToolDefinition(
    "get_weather",
    "Weather",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
CLOCK = ToolDefinition("get_time", "", {})
USAGE = {
    "prompt_tokens": 20,
    "completion_tokens": 7,
    "total_tokens": 27,
    "prompt_tokens_details": {"cached_tokens": 8},
    "completion_tokens_details": {"reasoning_tokens": 2},
}


async def test_text_only_with_usage_only_final_chunk(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"role": "assistant", "content": ""}),
                c_chunk({"content": "Hel"}),
                c_chunk({"content": "lo."}),
                c_chunk({}, "stop"),
                c_chunk(usage=USAGE, empty=True),
            )
        )
    )
    result = await collect(chat_provider, request(user("hi")))
    assert [type(c).__name__ for c in result.chunks] == [
        "TextStart",
        "TextDelta",
        "TextDelta",
        "TextEnd",
        "FinishStep",
    ]
    assert result.text == "Hello."
    finish = result.finish
    assert (finish.finish_reason, finish.raw_finish_reason, finish.response_id) == (
        "stop",
        "stop",
        "chatcmpl-1",
    )
    assert finish.usage == base.Usage(
        input_tokens=20, output_tokens=7, total_tokens=27, reasoning_tokens=2, cached_input_tokens=8
    )
    sent = replay.requests[0]
    assert (sent.path, sent.headers["authorization"]) == ("/v1/chat/completions", "Bearer test-key")
    assert sent.json == {
        "model": "m",
        "messages": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def test_one_tool_call(replay: ReplayServer, chat_provider: OpenAIChatProvider) -> None:
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"role": "assistant", "content": None}),
                c_chunk({"tool_calls": [c_call(0, "call_1", "get_weather", "")]}),
                c_chunk({"tool_calls": [c_call(0, arguments='{"city":')]}),
                c_chunk({"tool_calls": [c_call(0, arguments=' "Oslo"}')]}),
                c_chunk({}, "tool_calls"),
            )
        )
    )
    result = await collect(chat_provider, request(tools=[WEATHER]))
    assert [type(c).__name__ for c in result.chunks] == [
        "ToolInputStart",
        "ToolInputDelta",
        "ToolInputDelta",
        "ToolCall",
        "FinishStep",
    ]
    assert result.calls == [
        base.ToolCall("call_1", "get_weather", {"city": "Oslo"}, raw_input='{"city": "Oslo"}')
    ]
    assert result.finish.finish_reason == "tool-calls"
    body = replay.requests[0].json
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": dict(WEATHER.input_schema),
                "description": "Weather",
            },
        }
    ]
    assert body["tool_choice"] == "auto"


async def test_parallel_calls_interleaved_split_mid_token(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    """Index 1 opens first, fragments of both indexes share a chunk, a name arrives after its id,
    and a compatible server omits one id: everything is keyed by index."""
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"tool_calls": [c_call(1, "call_b", "get_time", "{")]}),
                c_chunk({"tool_calls": [c_call(0, "call_a"), c_call(1, arguments='"tz": "Europe/')]}),
                c_chunk(
                    {
                        "tool_calls": [
                            c_call(0, name="get_weather", arguments='{"ci'),
                            c_call(1, arguments='Oslo"}'),
                        ]
                    }
                ),
                c_chunk(
                    {
                        "tool_calls": [
                            c_call(0, arguments='ty": "Oslo"}'),
                            {"index": 2, "function": {"name": "get_time", "arguments": "{}"}},
                        ]
                    }
                ),
                c_chunk({}, "tool_calls"),
            )
        )
    )
    result = await collect(chat_provider, request(tools=[WEATHER, CLOCK]))
    calls = {c.tool_call_id: (c.tool_name, c.input) for c in result.calls}
    assert calls == {
        "call_b": ("get_time", {"tz": "Europe/Oslo"}),
        "call_a": ("get_weather", {"city": "Oslo"}),
        "call_s0_2": ("get_time", {}),
    }
    starts = result.of(base.ToolInputStart)
    assert [s.tool_call_id for s in starts] == ["call_b", "call_a", "call_s0_2"]
    deltas = "".join(d.delta for d in result.of(base.ToolInputDelta) if d.tool_call_id == "call_a")
    assert deltas == '{"city": "Oslo"}'


@pytest.mark.parametrize("arguments", ["", "{}", "  "])
async def test_no_argument_tool(
    arguments: str, replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"tool_calls": [c_call(0, "call_1", "get_time", arguments)]}),
                c_chunk({}, "tool_calls"),
            )
        )
    )
    result = await collect(chat_provider, request(tools=[CLOCK]))
    assert [(c.input, c.error) for c in result.calls] == [({}, None)]


async def test_invalid_arguments_are_an_input_error(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    fenced = '```json\n{"city": "Oslo"}\n```'
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"tool_calls": [c_call(0, "call_1", "get_weather", fenced)]}),
                c_chunk({}, "tool_calls"),
            )
        )
    )
    result = await collect(chat_provider, request(tools=[WEATHER]))
    (call,) = result.calls
    assert call.input is None and call.raw_input == fenced and "not valid JSON" in (call.error or "")
    assert result.finish.finish_reason == "tool-calls"  # the engine may repair it (not truncated)


async def test_length_stop_errors_every_call(replay: ReplayServer, chat_provider: OpenAIChatProvider) -> None:
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"tool_calls": [c_call(0, "call_1", "get_weather", '{"city": "Oslo"}')]}),
                c_chunk({"tool_calls": [c_call(1, "call_2", "get_weather", '{"city": "Ro')]}),
                c_chunk({}, "length"),
            )
        )
    )
    result = await collect(chat_provider, request(tools=[WEATHER]))
    assert [(c.input, c.error) for c in result.calls] == [(None, TRUNCATED_TOOL_CALL_ERROR)] * 2
    assert result.finish.finish_reason == "length"


async def test_compatible_server_omissions(replay: ReplayServer, chat_provider: OpenAIChatProvider) -> None:
    """No id, no usage, reasoning_content deltas, no finish reason, no [DONE]: still one good step."""
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"reasoning_content": "Think."}, chunk_id=None),
                c_chunk({"content": "Answer."}, chunk_id=None),
                c_chunk({}, "stop", chunk_id=None),
                done=False,
            )
        ),
        Reply.sse(chat_sse(c_chunk({"content": "x"}), c_chunk({}, None))),
    )
    result = await collect(chat_provider, request())
    assert result.error is None
    assert (result.reasoning, result.text) == ("Think.", "Answer.")
    assert [type(c).__name__ for c in result.chunks] == [
        "ReasoningStart",
        "ReasoningDelta",
        "ReasoningEnd",
        "TextStart",
        "TextDelta",
        "TextEnd",
        "FinishStep",
    ]
    assert (result.finish.finish_reason, result.finish.usage, result.finish.response_id) == (
        "stop",
        base.Usage(),
        "",
    )
    second = await collect(chat_provider, request())  # [DONE] but no finish reason at all
    assert (
        second.error is None
        and second.finish.finish_reason == "stop"
        and second.finish.raw_finish_reason == ""
    )


async def test_stream_cut_before_a_finish_reason_fails(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": "Partial"}), done=False)))
    result = await collect(chat_provider, request())
    assert result.text == "Partial"
    assert result.error is not None and result.error.type == "incomplete_stream" and result.error.retryable
    assert not result.of(base.FinishStep)


async def test_finish_reason_error_chunk(replay: ReplayServer, chat_provider: OpenAIChatProvider) -> None:
    body = {"error": {"message": "Upstream error", "code": 502}}
    replay.enqueue(
        Reply.sse(chat_sse(c_chunk({"content": "a"}), {**c_chunk({}, "error"), **body}, done=False))
    )
    result = await collect(chat_provider, request())
    assert result.error is not None and (result.error.status, result.error.code) == (0, "502")


async def test_transcript(replay: ReplayServer, chat_provider: OpenAIChatProvider) -> None:
    audio = message_pb2.FilePart(media_type="audio/wav", data=b"RIFF")
    pdf = message_pb2.FilePart(media_type="application/pdf", data=b"%PDF", filename="a.pdf")
    history = [
        system("Be nice."),
        user("See", image(b"PNG"), audio, pdf),
        user(""),
        assistant(
            [
                reasoning("hidden"),
                text("Let me check."),
                tool_call("c1", "get_weather", {"city": "Oslo"}, output={"t": 3}),
                tool_call("c2", "get_weather", {"city": "Rome"}, error="boom"),
            ],
            [tool_call("c3", "get_time", {}, output="12:00")],
            [text("Done.")],
        ),
        user("Thanks"),
    ]
    replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": "ok"}), c_chunk({}, "stop"))))
    await collect(chat_provider, request(*history, tools=[WEATHER, CLOCK]))
    messages = replay.requests[0].json["messages"]
    # Same-role neighbours are merged (docs/semantics.md §11): the two system prompts, and the empty user
    # message into the one before it (its placeholder is only needed when nothing else is there).
    assert messages == [
        {"role": "system", "content": "You are terse.\n\nBe nice."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "See"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,UE5H"}},
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {
                    "type": "file",
                    "file": {"file_data": "data:application/pdf;base64,JVBERg==", "filename": "a.pdf"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"t":3}'},
        {"role": "tool", "tool_call_id": "c2", "content": "boom"},
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "c3", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c3", "content": "12:00"},
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Thanks"},
    ]


async def test_round_trip_of_a_streamed_call(replay: ReplayServer, chat_provider: OpenAIChatProvider) -> None:
    replay.enqueue(
        Reply.sse("openai_parallel_tool_calls_split_args.sse"),
        Reply.sse(chat_sse(c_chunk({"content": "Sunny, 14:00."}), c_chunk({}, "stop"))),
    )
    question = user("Lisbon weather and time?")
    first = await collect(chat_provider, request(question))
    outputs = {"call_Zk4pR8vQ2nW6tY1mB3xC5dLe": {"sky": "sunny"}, "call_Hj7sT2kL9pQ4vX8nM1cR6wYa": "14:00"}
    stored = Stored().step(first.chunks, outputs).build()
    await collect(chat_provider, request(question, stored))
    messages = replay.requests[1].json["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[2]["tool_calls"]] == [m["tool_call_id"] for m in messages[3:]]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("auto", "auto"),
        ("none", "none"),
        ("required", "required"),
        ("get_time", {"type": "function", "function": {"name": "get_time"}}),
    ],
)
async def test_tool_choice(
    choice: str, expected: Any, replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(Reply.sse(chat_sse(c_chunk({}, "stop"))))
    await collect(chat_provider, request(tools=[WEATHER, CLOCK], tool_choice=choice))
    assert replay.requests[0].json["tool_choice"] == expected


async def test_settings_and_passthrough(replay: ReplayServer, chat_provider: OpenAIChatProvider) -> None:
    settings = ModelSettings(
        max_output_tokens=100,
        temperature=0.3,
        top_p=0.8,
        top_k=20,
        presence_penalty=0.1,
        frequency_penalty=0.2,
        stop_sequences=["END"],
        seed=42,
        headers={"x-extra": "1"},
        provider_options={"openai": {"parallel_tool_calls": False, "top_k": 20}, "anthropic": {"x": 1}},
    )
    replay.enqueue(Reply.sse(chat_sse(c_chunk({}, "stop"))))
    result = await collect(chat_provider, request(settings=settings))
    sent = replay.requests[0]
    body = sent.json
    assert {
        k: body[k]
        for k in (
            "max_completion_tokens",
            "temperature",
            "top_p",
            "presence_penalty",
            "frequency_penalty",
            "stop",
            "seed",
            "parallel_tool_calls",
            "top_k",
        )
    } == {
        "max_completion_tokens": 100,
        "temperature": 0.3,
        "top_p": 0.8,
        "presence_penalty": 0.1,
        "frequency_penalty": 0.2,
        "stop": ["END"],
        "seed": 42,
        "parallel_tool_calls": False,
        "top_k": 20,
    }
    assert "x" not in body and sent.headers["x-extra"] == "1"
    assert any("top_k" in w for w in result.finish.warnings)


async def test_reasoning_models_get_no_sampling_settings(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(Reply.sse(chat_sse(c_chunk({}, "stop"))))
    settings = ModelSettings(temperature=0.3, top_p=0.5, seed=1)
    await collect(chat_provider, request(model="o4-mini", settings=settings))
    body = replay.requests[0].json
    assert "temperature" not in body and "top_p" not in body and body["seed"] == 1


async def test_compatible_server_gets_max_tokens(replay: ReplayServer) -> None:
    client = openai.AsyncOpenAI(
        api_key="none", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    provider = OpenAIChatProvider("vllm", client, max_tokens_param="max_tokens", include_usage=False)
    replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": "x"}), c_chunk({}, "stop"))))
    await collect(
        provider,
        request(settings=ModelSettings(max_output_tokens=50, provider_options={"vllm": {"top_k": 5}})),
    )
    await provider.aclose()
    body = replay.requests[0].json
    assert body["max_tokens"] == 50 and body["top_k"] == 5
    assert "max_completion_tokens" not in body and "stream_options" not in body


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}


@pytest.mark.parametrize(
    ("content", "valid"), [('{"answer": 42}', True), ('{"answer": "42"}', False), ("42", False)]
)
async def test_structured_output(
    content: str, valid: bool, replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": content}), c_chunk({}, "stop"))))
    result = await collect(chat_provider, request(output_schema=SCHEMA))
    assert replay.requests[0].json["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": SCHEMA, "strict": False},
    }
    if valid:
        assert result.error is None and result.text == content
    else:
        assert result.error is not None and result.error.type == "structured_output_invalid"


async def test_refusal_with_structured_output_is_content_filter(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(Reply.sse("openai_refusal_delta.sse"))
    result = await collect(chat_provider, request(output_schema=SCHEMA))
    assert result.error is None
    assert result.finish.finish_reason == "content-filter"
    assert result.finish.provider_metadata == {
        "openai": {"refusal": "I'm sorry, but I can't help with that."}
    }
