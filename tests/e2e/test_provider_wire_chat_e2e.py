"""Chat Completions streams of vendors beyond OpenAI, end to end (issue 30, items 1, 4, 5, 6, 7): a real
``turnwire serve`` with ``type: openai`` entries pointed at a replay server that plays the wire cases of
``tests/providers/cases_extra/sse/openai_chat_*``. Each test checks what the client streamed, what was
stored (``GetConversation``) and the body of the *next* request the replay server recorded, against
Chat Completions' rules: every ``tool_calls`` entry answered by one ``tool`` message right after it, no
reasoning inside the answer text, and ``reasoning_content`` on a DeepSeek tool turn's assistant messages
(https://api-docs.deepseek.com/guides/thinking_mode).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from providers.helpers import c_chunk, chat_sse
from providers.replay import ReplayServer, Reply
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client import TurnResult, TurnwireClient, collect
from turnwire_client.v1 import message_pb2

CASES = Path(__file__).resolve().parents[1] / "providers" / "cases_extra" / "sse"
SYSTEM = "Be brief."
_ids = itertools.count(1)


def _case(name: str) -> bytes:
    return (CASES / f"openai_chat_{name}.sse").read_bytes()


def _answer(content: str, reasoning: str | None = None) -> bytes:
    delta = {"content": content, **({"reasoning_content": reasoning} if reasoning else {})}
    return chat_sse(c_chunk(delta), c_chunk({}, "stop"))


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SidecarProcess, ReplayServer]]:
    replay = ReplayServer().start()
    entry = {"type": "openai", "base_url": f"{replay.url}/v1", "api_key_env": None, "max_retries": 0}
    config = {
        "default_model": "chat:gpt-test",
        "system_prompt": SYSTEM,
        "providers": {
            "chat": entry,  # replay_reasoning: auto (on for deepseek-* models)
            "think": {**entry, "inline_reasoning_tag": "think"},
        },
    }
    try:
        with running_sidecar(tmp_path_factory.mktemp("provider-wire-chat-e2e"), config) as process:
            yield process, replay
    finally:
        replay.stop()


async def _turns(
    sidecar: tuple[SidecarProcess, ReplayServer], model: str, streams: list[bytes], *texts: str
) -> tuple[list[TurnResult], message_pb2.Message, ReplayServer]:
    """Run one chat turn per text on a new conversation; the last stored assistant message."""
    process, replay = sidecar
    replay.replies.clear()
    replay.requests.clear()
    replay.enqueue(*(Reply.sse(stream) for stream in streams))
    conversation = f"wire-chat-{next(_ids)}"
    async with TurnwireClient(process.target) as client:
        results = [await collect(client.chat(conversation, text, model=model)) for text in texts]
        stored = await client.get_conversation(conversation)
    for result in results:
        assert result.ok, (result.error, process.log_text())
    assistants = [m for m in stored.messages if m.role == message_pb2.ROLE_ASSISTANT]
    assert assistants[-1] == results[-1].message  # the stored message is what the turn ended with
    return results, assistants[0], replay


def _parts(message: message_pb2.Message) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            out.append((kind, part.text.text))
        elif kind == "reasoning":
            out.append((kind, part.reasoning.text))
        elif kind == "tool_call":
            out.append((kind, part.tool_call.tool_name))
    return out


def _streamed(result: TurnResult, kind: str) -> str:
    return "".join(getattr(e, kind).delta for e in result.events if e.WhichOneof("event") == kind)


def _check_pairing(messages: list[dict[str, Any]]) -> None:
    """Chat's rule: an assistant message's tool calls are answered, each by one ``tool`` message,
    right after it; no ``tool`` message answers anything else."""
    for index, message in enumerate(messages):
        calls = [c["id"] for c in message.get("tool_calls") or ()]
        if calls:
            answers = messages[index + 1 : index + 1 + len(calls)]
            assert [(m["role"], m["tool_call_id"]) for m in answers] == [("tool", c) for c in calls]
    tools = [m for m in messages if m["role"] == "tool"]
    assert len(tools) == sum(len(m.get("tool_calls") or ()) for m in messages)


async def test_mistral_content_parts_are_streamed_stored_and_sent_back_as_text(
    sidecar: tuple[SidecarProcess, ReplayServer],
) -> None:
    streams = [_case("mistral_thinking_content_parts"), _answer("Yes.")]
    results, stored, replay = await _turns(
        sidecar, "chat:magistral-medium-2509", streams, "17 + 25?", "Sure?"
    )
    reasoning = "The user wants the sum of 17 and 25. 17 + 25 = 42."
    assert _streamed(results[0], "reasoning_delta") == reasoning
    assert _streamed(results[0], "text_delta") == "17 + 25 = **42**."
    assert _parts(stored) == [("reasoning", reasoning), ("text", "17 + 25 = **42**.")]
    assert results[0].usage.total_tokens == 76
    # Mistral takes no reasoning back: the next request has the answer's text only.
    messages = replay.requests[1].json["messages"]
    assert messages == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "17 + 25?"},
        {"role": "assistant", "content": "17 + 25 = **42**."},
        {"role": "user", "content": "Sure?"},
    ]


@pytest.mark.parametrize(
    ("case", "model", "usage"),
    [
        ("groq_x_groq_usage", "llama-3.3-70b-versatile", (23, 19, 42)),
        ("moonshot_usage_in_choice", "moonshot-v1-8k", (19, 13, 32)),
    ],
)
async def test_usage_in_vendor_fields_counts(
    sidecar: tuple[SidecarProcess, ReplayServer], case: str, model: str, usage: tuple[int, int, int]
) -> None:
    results, stored, _ = await _turns(sidecar, f"chat:{model}", [_case(case)], "Hello")
    total = results[0].usage
    assert (total.input_tokens, total.output_tokens, total.total_tokens) == usage
    finishes = [e.step_finish.usage for e in results[0].events if e.WhichOneof("event") == "step_finish"]
    assert [(u.input_tokens, u.output_tokens) for u in finishes] == [usage[:2]]
    assert _parts(stored) == [("text", results[0].text)]


async def test_inline_think_tags_become_reasoning_that_is_not_sent_back_as_text(
    sidecar: tuple[SidecarProcess, ReplayServer],
) -> None:
    streams = [_case("inline_think_tags_split"), _answer("Right.")]
    results, stored, replay = await _turns(sidecar, "think:Qwen/Qwen3-8B", streams, "2+2?", "Sure?")
    kinds = [e.WhichOneof("event") for e in results[0].events]
    assert kinds.index("reasoning_start") < kinds.index("reasoning_end") < kinds.index("text_start")
    assert _streamed(results[0], "reasoning_delta") == "The user asks for 2+2. That is 4."
    assert _streamed(results[0], "text_delta") == "2 + 2 = 4."
    assert _parts(stored) == [("reasoning", "The user asks for 2+2. That is 4."), ("text", "2 + 2 = 4.")]
    assistant = replay.requests[1].json["messages"][2]
    assert assistant == {"role": "assistant", "content": "2 + 2 = 4."}


async def test_a_tool_name_in_pieces_runs_the_tool_and_pairs_its_result(
    sidecar: tuple[SidecarProcess, ReplayServer],
) -> None:
    streams = [_case("tool_name_split"), _answer("Clear in Paris.")]
    results, stored, replay = await _turns(sidecar, "chat:local-model", streams, "Weather in Paris?")
    starts = [
        e.tool_input_start.tool_name for e in results[0].events if e.WhichOneof("event") == "tool_input_start"
    ]
    assert starts == ["get_weather"]
    (call,) = results[0].tool_calls
    assert (call.tool_name, call.state, call.input) == ("get_weather", "output-available", {"city": "Paris"})
    assert _parts(stored) == [("tool_call", "get_weather"), ("text", "Clear in Paris.")]
    messages = replay.requests[1].json["messages"]
    _check_pairing(messages)
    assert [c["function"]["name"] for c in messages[2]["tool_calls"]] == ["get_weather"]
    assert json.loads(messages[3]["content"]) == call.output
    assert "unknown tool" not in json.dumps(messages).lower()


async def test_deepseek_tool_turns_carry_their_reasoning_in_every_later_request(
    sidecar: tuple[SidecarProcess, ReplayServer],
) -> None:
    first = "The user wants the weather in Paris. I should call get_weather."
    streams = [
        _case("deepseek_reasoner_tool_call"),
        _answer("Clear in Paris.", reasoning="The tool says clear."),
        _answer("You're welcome.", reasoning="Polite."),
        _answer("Bye."),
    ]
    results, stored, replay = await _turns(
        sidecar, "chat:deepseek-reasoner", streams, "Weather in Paris?", "Thanks", "Bye"
    )
    assert _parts(stored) == [
        ("reasoning", first),
        ("tool_call", "get_weather"),
        ("reasoning", "The tool says clear."),
        ("text", "Clear in Paris."),
    ]
    loop = replay.requests[1].json["messages"]  # the tool loop's second step
    _check_pairing(loop)
    assert (
        loop[2]["reasoning_content"] == first
        and loop[2]["tool_calls"][0]["function"]["name"] == "get_weather"
    )
    # The next user turn: the tool turn's messages keep their reasoning; the reply to "Thanks"
    # (no tool call) sends none in the turn after it.
    later = replay.requests[3].json["messages"]
    _check_pairing(later)
    assistants = [m for m in later if m["role"] == "assistant"]
    assert [m.get("reasoning_content") for m in assistants] == [first, "The tool says clear.", None]
    assert [m["role"] for m in later] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    assert results[0].usage.cached_input_tokens == 128  # DeepSeek's prompt cache hits
