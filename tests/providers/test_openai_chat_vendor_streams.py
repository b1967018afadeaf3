"""The Chat Completions adapter with what vendors beyond OpenAI send (issue 30, items 1, 4, 5, 6):
content as a list of parts, usage in vendor fields, reasoning inline in ``<think>`` tags (an opt-in
per provider entry), tool names split across deltas. The wire cases of each are in
``test_openai_chat_wire_cases.py``; these are the rules around them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import openai
import orjson
import pytest

from providers.helpers import (
    Stored,
    c_call,
    c_chunk,
    chat_sse,
    collect,
    openai_http,
    request,
    user,
)
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ToolDefinition
from turnwire_server.providers.openai_chat import OpenAIChatProvider

WEATHER = ToolDefinition("get_weather", "Weather", {"type": "object", "properties": {"city": {}}})
THINK = "<think>\nThe user asks for 2+2. That is 4.\n</think>\n\n2 + 2 = 4."


@pytest.fixture
async def think_provider(replay: ReplayServer) -> AsyncIterator[OpenAIChatProvider]:
    """An entry that reads ``<think>`` tags (``inline_reasoning_tag: think``)."""
    client = openai.AsyncOpenAI(
        api_key="k", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    provider = OpenAIChatProvider("vllm", client, retry_delay=0.01, inline_reasoning_tag="think")
    yield provider
    await provider.aclose()


def _texts(*deltas: str, finish: str = "stop") -> bytes:
    return chat_sse(*(c_chunk({"content": d}) for d in deltas), c_chunk({}, finish))


# --- inline <think> tags (item 5) ------------------------------------------------------------


async def test_think_tags_stay_text_unless_the_entry_opts_in(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(Reply.sse(_texts(THINK)))
    result = await collect(chat_provider, request())
    assert (result.text, result.reasoning) == (THINK, "")


async def test_think_tags_split_at_any_character(
    replay: ReplayServer, think_provider: OpenAIChatProvider
) -> None:
    """The stream cut in two at every position, and one character per delta: always the same parts."""
    splits = [(THINK[:i], THINK[i:]) for i in range(1, len(THINK))] + [tuple(THINK)]
    for deltas in splits:
        replay.enqueue(Reply.sse(_texts(*deltas)))
        result = await collect(think_provider, request())
        assert result.error is None
        assert (result.reasoning, result.text) == ("The user asks for 2+2. That is 4.", "2 + 2 = 4."), deltas
        kinds = [
            type(c).__name__ for c in result.chunks if not isinstance(c, base.ReasoningDelta | base.TextDelta)
        ]
        assert kinds == ["ReasoningStart", "ReasoningEnd", "TextStart", "TextEnd", "FinishStep"]


async def test_think_tags_around_a_tool_call_and_several_segments(
    replay: ReplayServer, think_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"content": "<think>First I look it up.</think>Checking. <think>Paris"}),
                c_chunk({"content": ", then.</think> <thi"}),
                c_chunk({"tool_calls": [c_call(0, "call_1", "get_weather", '{"city": "Paris"}')]}),
                c_chunk({}, "tool_calls"),
            )
        )
    )
    result = await collect(think_provider, request(tools=[WEATHER]))
    stored = Stored().step(result.chunks, {"call_1": {"sky": "clear"}}).build()
    kinds = [p.WhichOneof("kind") for p in stored.parts]
    assert kinds == ["step_start", "reasoning", "text", "reasoning", "text", "tool_call"]
    assert [p.reasoning.text or p.text.text for p in stored.parts[1:5]] == [
        "First I look it up.",
        "Checking.",
        "Paris, then.",
        "<thi",  # a tag's beginning that never finished is text, released before the call
    ]
    assert result.calls[0].input == {"city": "Paris"}


async def test_output_may_begin_inside_the_reasoning(replay: ReplayServer) -> None:
    """DeepSeek-R1's and QwQ's templates open the tag in the prompt: only the closing tag streams."""
    client = openai.AsyncOpenAI(
        api_key="k", base_url=f"{replay.url}/v1", max_retries=0, http_client=openai_http()
    )
    provider = OpenAIChatProvider(
        "vllm", client, inline_reasoning_tag="think", inline_reasoning_starts_inside=True
    )
    replay.enqueue(
        Reply.sse(_texts("Okay, 2+2.\n</th", "ink>\n\nIt is 4.")), Reply.sse(_texts("Still thinking"))
    )
    first = await collect(provider, request())
    unfinished = await collect(provider, request())  # cut off inside the reasoning: no answer
    await provider.aclose()
    assert (first.reasoning, first.text) == ("Okay, 2+2.", "It is 4.")
    assert (unfinished.reasoning, unfinished.text) == ("Still thinking", "")


async def test_structured_output_is_checked_without_the_reasoning(
    replay: ReplayServer, think_provider: OpenAIChatProvider
) -> None:
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    replay.enqueue(Reply.sse(_texts("<think>Sum it.</think>", '{"answer": 4}')))
    result = await collect(think_provider, request(output_schema=schema))
    assert result.error is None and result.text == '{"answer": 4}'


async def test_a_whole_response_with_think_tags(
    replay: ReplayServer, think_provider: OpenAIChatProvider
) -> None:
    body = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "qwen3",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": THINK}, "finish_reason": "stop"}
        ],
    }
    replay.enqueue(Reply(headers={"content-type": "application/json"}, body=orjson.dumps(body)))
    result = await collect(think_provider, request())
    assert (result.reasoning, result.text) == ("The user asks for 2+2. That is 4.", "2 + 2 = 4.")


def test_a_bad_tag_is_refused_when_the_provider_is_built() -> None:
    client = openai.AsyncOpenAI(api_key="k", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match="not a tag name"):
        OpenAIChatProvider("vllm", client, inline_reasoning_tag="<think>")


# --- content as a list of parts (item 1) ----------------------------------------------------------


async def test_a_whole_response_with_content_parts(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    """Magistral's non-streamed answer to a streaming request: the same parts as its stream."""
    content = [
        {"type": "thinking", "thinking": [{"type": "text", "text": "Add them."}]},
        {"type": "reference", "reference_ids": [1]},
        {"type": "text", "text": "42."},
    ]
    body = {
        "id": "x",
        "object": "chat.completion",
        "model": "magistral-small-2509",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11},
    }
    replay.enqueue(Reply(headers={"content-type": "application/json"}, body=orjson.dumps(body)))
    result = await collect(chat_provider, request())
    assert (result.reasoning, result.text, result.finish.usage.total_tokens) == ("Add them.", "42.", 11)


async def test_content_parts_keep_their_order_in_one_delta(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    parts = [
        {"type": "text", "text": "Short answer: "},
        {
            "type": "thinking",
            "thinking": [
                {"type": "text", "text": "Is it right?"},
                {"type": "reference", "reference_ids": [2]},
            ],
        },
        {"type": "text", "text": "yes."},
    ]
    replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": parts}), c_chunk({}, "stop"))))
    result = await collect(chat_provider, request())
    stored = Stored().step(result.chunks).build()
    assert [(p.WhichOneof("kind"), p.text.text or p.reasoning.text) for p in stored.parts[1:]] == [
        ("text", "Short answer: "),
        ("reasoning", "Is it right?"),
        ("text", "yes."),
    ]


# --- tool names split across deltas (item 6) ---------------------------------------------------


@pytest.mark.parametrize(
    ("fragments", "name"),
    [
        ([c_call(0, "call_1", "echo_"), c_call(0, name="tool", arguments='{"x": 1}')], "echo_tool"),
        ([c_call(0, "call_1", "echo_tool"), c_call(0, "call_1", "echo_tool", '{"x": 1}')], "echo_tool"),
        # Once the arguments started, a name fragment is a repeat whatever it says.
        (
            [c_call(0, "call_1", "echo_tool", '{"x":'), c_call(0, name="echo_tool", arguments=" 1}")],
            "echo_tool",
        ),
        ([c_call(0, "call_1", "echo_tool", '{"x":'), c_call(0, name="tool", arguments=" 1}")], "echo_tool"),
        # A name after nameless arguments is the name.
        ([c_call(0, "call_1", arguments='{"x":'), c_call(0, name="echo_tool", arguments=" 1}")], "echo_tool"),
        # Split, and never followed by arguments: complete at the step's end.
        ([c_call(0, "call_1", "echo"), c_call(0, name="_tool")], "echo_tool"),
    ],
)
async def test_a_tool_name_in_pieces(
    fragments: list[dict[str, Any]], name: str, replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    chunks = [c_chunk({"tool_calls": [f]}) for f in fragments]
    replay.enqueue(Reply.sse(chat_sse(*chunks, c_chunk({}, "tool_calls"))))
    result = await collect(chat_provider, request())
    assert [(c.tool_name, c.error) for c in result.calls] == [(name, None)]
    assert [s.tool_name for s in result.of(base.ToolInputStart)] == [name]


# --- usage (item 4) ----------------------------------------------------------------------------------


async def test_usage_reported_before_a_failure_still_counts(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    usage = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    failure = {"error": {"message": "upstream went away", "code": 502}}
    replay.enqueue(
        Reply.sse(
            chat_sse(c_chunk({"content": "Hi"}, usage=usage), c_chunk(empty=True) | failure, done=False)
        )
    )
    result = await collect(chat_provider, request())
    assert result.error is not None
    assert result.usage_updates == [base.Usage(input_tokens=12, output_tokens=3, total_tokens=15)]


async def test_deepseek_cache_hits_are_cached_input(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    usage = {"prompt_tokens": 64, "completion_tokens": 2, "total_tokens": 66, "prompt_cache_hit_tokens": 48}
    replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": "ok"}), c_chunk({}, "stop", usage=usage))))
    result = await collect(chat_provider, request())
    assert result.finish.usage.cached_input_tokens == 48


async def test_usage_of_a_stream_without_usage_stays_zero(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    nulls = {"usage": None, "x_groq": {"id": "req_1"}}
    replay.enqueue(Reply.sse(chat_sse(c_chunk({"content": "ok"}) | nulls, c_chunk({}, "stop") | nulls)))
    result = await collect(chat_provider, request(user("hi")))
    assert (result.finish.usage, result.usage_updates) == (base.Usage(), [])


# --- the entry's settings -----------------------------------------------------------------------


def test_the_entry_settings_reach_the_provider() -> None:
    from pydantic import TypeAdapter

    from turnwire_server.providers.settings import ProviderSettings, build_provider

    entry = TypeAdapter(ProviderSettings).validate_python(
        {
            "type": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "api_key_env": None,
            "inline_reasoning_tag": "think",
            "inline_reasoning_starts_inside": True,
            "replay_reasoning": "always",
        }
    )
    provider = build_provider("vllm", entry, environ={})
    assert isinstance(provider, OpenAIChatProvider)
    assert (
        provider.inline_reasoning_tag,
        provider.inline_reasoning_starts_inside,
        provider.replay_reasoning,
    ) == (
        "think",
        True,
        "always",
    )


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            {"inline_reasoning_tag": "<think>"},
            "providers.vllm.inline_reasoning_tag: '<think>' is not a tag name: give the name without",
        ),
        ({"replay_reasoning": "yes"}, "providers.vllm.replay_reasoning"),
    ],
)
def test_a_bad_setting_says_what_to_fix(tmp_path: Any, entry: dict[str, Any], message: str) -> None:
    import yaml

    from turnwire_server.config import ConfigError, load_settings

    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"providers": {"vllm": {"type": "openai", "api_key_env": None, **entry}}}))
    with pytest.raises(ConfigError) as raised:
        load_settings(path)
    assert message in str(raised.value)


async def test_a_delta_that_ends_the_reasoning_and_begins_the_answer(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    """vLLM's reasoning parsers send the last reasoning and the first answer text in one delta."""
    replay.enqueue(
        Reply.sse(
            chat_sse(
                c_chunk({"reasoning_content": "Think"}),
                c_chunk({"reasoning_content": " more.", "content": "The"}),
                c_chunk({"content": " answer."}),
                c_chunk({}, "stop"),
            )
        )
    )
    result = await collect(chat_provider, request())
    stored = Stored().step(result.chunks).build()
    assert [(p.WhichOneof("kind"), p.text.text or p.reasoning.text) for p in stored.parts[1:]] == [
        ("reasoning", "Think more."),
        ("text", "The answer."),
    ]
