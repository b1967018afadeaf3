"""One turn with a tool call, identical on every provider, end to end.

A real ``turnwire serve`` process is configured with all four provider types: the
offline ``scripted`` model and the three official-SDK adapters (Anthropic Messages,
OpenAI Chat Completions, OpenAI Responses), each adapter pointed (``base_url``) at
its own replay server in this process. A replay server answers successive requests
from a queue of recorded streams in that API's exact wire format and records every
request it receives.

For each provider the Python client runs "What's the weather in Paris?": request 1
streams a call of ``get_weather`` with ``{"city": "Paris"}``; the sidecar runs the
demo tool; request 2 streams a final answer that states the tool's result. The test
asserts the same normalized outcome for all four (event kinds, tool call, finish
reasons, usage, stored transcript) and, for the real providers, that request 2
carried the tool result in that API's own shape.

A second test starts a conversation on the scripted model and continues it on each
real provider through the per-turn ``model`` override: the provider must receive a
transcript its API accepts.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from google.protobuf import json_format
from providers.helpers import a_blocks
from providers.replay import Recorded, ReplayServer, Reply
from support.sidecar import SidecarProcess, running_sidecar

from turnwire.tools import ToolExecution
from turnwire_client import TurnResult, TurnwireClient, Usage, collect
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.tools.loading import load_tools

SYSTEM_PROMPT = "You are the Turnwire end-to-end weather assistant."
QUESTION = "What's the weather in Paris?"
KEYS = {
    "E2E_ANTHROPIC_KEY": "sk-ant-e2e-dummy",
    "E2E_CHAT_KEY": "sk-e2e-chat-dummy",
    "E2E_RESPONSES_KEY": "sk-e2e-responses-dummy",
}

_TOOLS = load_tools(True, [])
WEATHER_TOOL = _TOOLS["get_weather"]
WEATHER_SCHEMA = dict(WEATHER_TOOL.input_schema)


async def _weather_in_paris() -> dict[str, Any]:
    result = await WEATHER_TOOL.execute(
        {"city": "Paris"}, ToolExecution("call", "conversation", "request", 0)
    )
    assert isinstance(result, dict), result  # the demo tool answers with one JSON object
    return result


WEATHER = asyncio.run(_weather_in_paris())
"""What the demo tool returns for Paris (deterministic offline data)."""

PREAMBLE = "I'll check the weather in Paris."
ANSWER = f"It's {WEATHER['condition']} in Paris right now, {WEATHER['temperature_c']} °C."

# Step usage each recording reports, normalized: (input, output, total, cached input).
STEP_USAGE = [(412, 38, 450, 0), (470, 29, 499, 256)]

_ids = itertools.count(1)


# --- recorded streams, each in its API's wire format ---------------------------------------------


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _event(name: str, data: dict[str, Any] | str) -> str:
    return f"event: {name}\ndata: {data if isinstance(data, str) else _json(data)}\n\n"


def _pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


ANTHROPIC_CALL_ID = "toolu_01A09q90qw90lq917835lq9"


def anthropic_stream(message_id: str, blocks: list[dict[str, Any]], usage: tuple[int, ...]) -> bytes:
    """An Anthropic Messages stream: ``message_start``, a ``ping``, the blocks, ``message_delta``,
    ``message_stop``. A block is ``{"text": …}`` or ``{"tool_use": (id, name, [json fragments])}``.
    The prompt is reported split into fresh and cache-read tokens, as the API does."""
    input_total, output_tokens, _, cached = usage
    start_usage = {
        "input_tokens": input_total - cached,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
        "output_tokens": 1,
        "service_tier": "standard",
    }
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5-20250929",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    out = [_event("message_start", {"type": "message_start", "message": message})]
    stop_reason = "end_turn"
    for index, block in enumerate(blocks):
        start: dict[str, Any]
        if "text" in block:
            start = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": piece} for piece in _pieces(block["text"], 12)]
        else:
            call_id, name, fragments = block["tool_use"]
            start = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": f} for f in ["", *fragments]]
            stop_reason = "tool_use"
        out.append(
            _event(
                "content_block_start", {"type": "content_block_start", "index": index, "content_block": start}
            )
        )
        if index == 0:
            out.append(_event("ping", '{"type": "ping"}'))
        for delta in deltas:
            out.append(
                _event("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
            )
        out.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
    message_delta = {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": {"output_tokens": output_tokens},
    }
    out.append(_event("message_delta", message_delta))
    out.append(_event("message_stop", {"type": "message_stop"}))
    return "".join(out).encode()


CHAT_CALL_ID = "call_q8RJ3vTn5sWk2mPz9LxY4bGe"


def chat_stream(
    completion_id: str, text: str, calls: list[tuple[str, str, list[str]]], usage: tuple[int, ...]
) -> bytes:
    """A Chat Completions stream: ``chat.completion.chunk`` lines (role, content, tool call fragments,
    finish reason), the usage chunk with ``choices: []``, then ``[DONE]``."""
    base = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": 1764424800,
        "model": "gpt-4.1-2025-04-14",
        "service_tier": "default",
        "system_fingerprint": "fp_7c3a91e0d4",
    }

    def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return f"data: {_json({**base, 'choices': [choice], 'usage': None})}\n\n"

    out = [chunk({"role": "assistant", "content": "", "refusal": None})]
    out += [chunk({"content": piece}) for piece in _pieces(text, 12)]
    for index, (call_id, name, fragments) in enumerate(calls):
        opening = {
            "index": index,
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": ""},
        }
        out.append(chunk({"tool_calls": [opening]}))
        out += [chunk({"tool_calls": [{"index": index, "function": {"arguments": f}}]}) for f in fragments]
    out.append(chunk({}, "tool_calls" if calls else "stop"))
    input_tokens, output_tokens, total, cached = usage
    usage_body = {
        "prompt_tokens": input_tokens,
        "completion_tokens": output_tokens,
        "total_tokens": total,
        "prompt_tokens_details": {"cached_tokens": cached, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }
    out.append(f"data: {_json({**base, 'choices': [], 'usage': usage_body})}\n\n")
    out.append("data: [DONE]\n\n")
    return "".join(out).encode()


RESPONSES_CALL_ID = "call_Vb3nK8pQ2xR7tY5mW1zL9cHd"


def responses_stream(
    response_id: str, text: str, calls: list[tuple[str, str, list[str]]], usage: tuple[int, ...]
) -> bytes:
    """A Responses stream of typed events (``response.created`` … ``response.completed``): a message
    item with its ``output_text`` deltas, then one ``function_call`` item per call."""
    sequence = itertools.count()
    out: list[str] = []

    def emit(kind: str, **fields: Any) -> None:
        out.append(_event(kind, {"type": kind, "sequence_number": next(sequence), **fields}))

    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": 1764425400,
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "instructions": SYSTEM_PROMPT,
        "model": "gpt-4.1-mini-2025-04-14",
        "output": [],
        "parallel_tool_calls": True,
        "store": False,
        "tool_choice": "auto",
        "usage": None,
    }
    emit("response.created", response=response)
    emit("response.in_progress", response=response)
    output: list[dict[str, Any]] = []
    message_id = f"msg_{response_id[5:]}"
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "status": "in_progress",
        "content": [],
        "role": "assistant",
    }
    emit("response.output_item.added", output_index=0, item=message)
    part = {"type": "output_text", "annotations": [], "logprobs": [], "text": ""}
    emit("response.content_part.added", item_id=message_id, output_index=0, content_index=0, part=part)
    for piece in _pieces(text, 12):
        emit(
            "response.output_text.delta",
            item_id=message_id,
            output_index=0,
            content_index=0,
            delta=piece,
            logprobs=[],
        )
    emit(
        "response.output_text.done",
        item_id=message_id,
        output_index=0,
        content_index=0,
        text=text,
        logprobs=[],
    )
    part = {**part, "text": text}
    emit("response.content_part.done", item_id=message_id, output_index=0, content_index=0, part=part)
    message = {**message, "status": "completed", "content": [part]}
    emit("response.output_item.done", output_index=0, item=message)
    output.append(message)
    for offset, (call_id, name, fragments) in enumerate(calls, start=1):
        item_id = f"fc_{response_id[5:]}{offset}"
        item = {
            "id": item_id,
            "type": "function_call",
            "status": "in_progress",
            "arguments": "",
            "call_id": call_id,
            "name": name,
        }
        emit("response.output_item.added", output_index=offset, item=item)
        for fragment in fragments:
            emit(
                "response.function_call_arguments.delta", item_id=item_id, output_index=offset, delta=fragment
            )
        arguments = "".join(fragments)
        emit(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=offset,
            name=name,
            arguments=arguments,
        )
        item = {**item, "status": "completed", "arguments": arguments}
        emit("response.output_item.done", output_index=offset, item=item)
        output.append(item)
    input_tokens, output_tokens, total, cached = usage
    final_usage = {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": total,
    }
    emit(
        "response.completed",
        response={**response, "status": "completed", "output": output, "usage": final_usage},
    )
    return "".join(out).encode()


WEATHER_ARGS = ['{"city":', ' "Pa', 'ris"}']
"""The call's input, split mid-token the way the APIs stream it."""


# --- the four cases ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One provider: how to reach it, what it streams, and what is provider-specific in the outcome."""

    name: str  # the providers: entry (= its type)
    model: str  # the model id the turn runs with
    call_id: str
    raw_finish: tuple[str, str]
    response_ids: tuple[str, str]
    response_model: str
    replies: tuple[bytes, ...] = ()  # the recorded streams, in request order (none: offline)
    path: str = ""  # the HTTP path the SDK posts to

    @property
    def remote(self) -> bool:
        return bool(self.replies)


CASES = [
    Case(
        name="scripted",
        model="scripted:demo",
        call_id="call_0_0",
        raw_finish=("tool-calls", "stop"),
        response_ids=("scripted-0", "scripted-1"),
        response_model="scripted:demo",
    ),
    Case(
        name="anthropic",
        model="anthropic:claude-sonnet-4-5",
        call_id=ANTHROPIC_CALL_ID,
        raw_finish=("tool_use", "end_turn"),
        response_ids=("msg_01XFDUDYJgAACzvnptvVoYEL", "msg_01Rr7AkVFmBCwXeD8nqN9cKp"),
        response_model="claude-sonnet-4-5-20250929",
        replies=(
            anthropic_stream(
                "msg_01XFDUDYJgAACzvnptvVoYEL",
                [{"text": PREAMBLE}, {"tool_use": (ANTHROPIC_CALL_ID, "get_weather", WEATHER_ARGS)}],
                STEP_USAGE[0],
            ),
            anthropic_stream("msg_01Rr7AkVFmBCwXeD8nqN9cKp", [{"text": ANSWER}], STEP_USAGE[1]),
        ),
        path="/v1/messages",
    ),
    Case(
        name="openai",
        model="openai:gpt-4.1",
        call_id=CHAT_CALL_ID,
        raw_finish=("tool_calls", "stop"),
        response_ids=("chatcmpl-CbR7tK2mQw9XzL4vN8pS1eYhU3aF", "chatcmpl-CbR7uZ5nLp2WqT8xK3vB6dYiR9sE"),
        response_model="gpt-4.1-2025-04-14",
        replies=(
            chat_stream(
                "chatcmpl-CbR7tK2mQw9XzL4vN8pS1eYhU3aF",
                PREAMBLE,
                [(CHAT_CALL_ID, "get_weather", WEATHER_ARGS)],
                STEP_USAGE[0],
            ),
            chat_stream("chatcmpl-CbR7uZ5nLp2WqT8xK3vB6dYiR9sE", ANSWER, [], STEP_USAGE[1]),
        ),
        path="/v1/chat/completions",
    ),
    Case(
        name="openai-responses",
        model="openai-responses:gpt-4.1-mini",
        call_id=RESPONSES_CALL_ID,
        raw_finish=("completed", "completed"),
        response_ids=(
            "resp_0a7c4e9b2d1f6a3c0068f2b1d4e5a6b7",
            "resp_0b8d5f0c3e2a7b4d1079a3c2e5f6b7c8",
        ),
        response_model="gpt-4.1-mini-2025-04-14",
        replies=(
            responses_stream(
                "resp_0a7c4e9b2d1f6a3c0068f2b1d4e5a6b7",
                PREAMBLE,
                [(RESPONSES_CALL_ID, "get_weather", WEATHER_ARGS)],
                STEP_USAGE[0],
            ),
            responses_stream("resp_0b8d5f0c3e2a7b4d1079a3c2e5f6b7c8", ANSWER, [], STEP_USAGE[1]),
        ),
        path="/v1/responses",
    ),
]
REMOTE = [case for case in CASES if case.remote]


# --- the sidecar and its replay servers ----------------------------------------------------------


@dataclass
class Harness:
    sidecar: SidecarProcess
    replays: dict[str, ReplayServer] = field(default_factory=dict)

    def replay(self, case: Case, *streams: bytes) -> ReplayServer:
        """The case's replay server, emptied, with ``streams`` queued for its next requests."""
        server = self.replays[case.name]
        server.replies.clear()
        server.requests.clear()
        server.enqueue(*(Reply.sse(stream) for stream in streams))
        return server


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    replays = {case.name: ReplayServer().start() for case in REMOTE}
    common = {"max_retries": 0, "timeout_seconds": 10}
    config = {
        "default_model": "scripted:demo",
        "system_prompt": SYSTEM_PROMPT,
        "providers": {
            "scripted": {"type": "scripted"},
            "anthropic": {
                "type": "anthropic",
                "api_key_env": "E2E_ANTHROPIC_KEY",
                "base_url": replays["anthropic"].url,
                # The bodies compared here are the API's own shapes; the sidecar's cache breakpoints
                # are tested in test_prompt_cache_e2e.py.
                "prompt_caching": "off",
                **common,
            },
            "openai": {
                "type": "openai",
                "api_key_env": "E2E_CHAT_KEY",
                "base_url": f"{replays['openai'].url}/v1",
                **common,
            },
            "openai-responses": {
                "type": "openai-responses",
                "api_key_env": "E2E_RESPONSES_KEY",
                "base_url": f"{replays['openai-responses'].url}/v1",
                **common,
            },
        },
    }
    try:
        with running_sidecar(tmp_path_factory.mktemp("providers-e2e"), config, KEYS) as sidecar:
            yield Harness(sidecar, replays)
    finally:
        for server in replays.values():
            server.stop()


# --- helpers ---------------------------------------------------------------------------------------------


def squeezed_kinds(result: TurnResult) -> list[str]:
    """Event kinds, each run of text or tool input deltas shown once with a ``+``."""
    out: list[str] = []
    for kind, _ in itertools.groupby(str(e.WhichOneof("event")) for e in result.events):
        out.append(f"{kind}+" if kind in ("text_delta", "tool_input_delta") else kind)
    return out


def of_kind(result: TurnResult, kind: str) -> list[Any]:
    return [getattr(e, kind) for e in result.events if e.WhichOneof("event") == kind]


def usage_tuple(usage: message_pb2.Usage | Usage) -> tuple[int, int, int, int]:
    return (usage.input_tokens, usage.output_tokens, usage.total_tokens, usage.cached_input_tokens)


def part_kinds(message: message_pb2.Message) -> list[str]:
    return [str(p.WhichOneof("kind")) for p in message.parts]


def step_texts(message: message_pb2.Message) -> list[str]:
    """The text of each step of an assistant message."""
    texts: list[str] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "step_start":
            texts.append("")
        elif kind == "text":
            texts[-1] += part.text.text
    return texts


def mentions_weather(text: str) -> bool:
    """True when ``text`` states the demo tool's result for Paris."""
    return WEATHER["condition"] in text and f"{WEATHER['temperature_c']} °C" in text


EXPECTED_KINDS = [
    "turn_start",
    "step_start",
    "text_start",
    "text_delta+",
    "text_end",
    "tool_input_start",
    "tool_input_delta+",
    "tool_input_available",
    "tool_output_available",
    "step_finish",
    "step_start",
    "text_start",
    "text_delta+",
    "text_end",
    "step_finish",
    "turn_end",
]


# --- what the APIs received ----------------------------------------------------------------------


def check_anthropic(requests: list[Recorded], case: Case) -> None:
    first, second = (r.json for r in requests)
    for request, body in zip(requests, (first, second), strict=True):
        assert request.path == case.path
        # The key from the configured variable (the anthropic SDK 2.x sends it as a Bearer token).
        assert request.headers["authorization"] == f"Bearer {KEYS['E2E_ANTHROPIC_KEY']}"
        assert request.headers.get("anthropic-version"), "the SDK sends the API version"
        assert body["model"] == "claude-sonnet-4-5"
        assert body["stream"] is True
        assert body["system"] == SYSTEM_PROMPT
        assert body["max_tokens"] == 8192, "the configured default_max_tokens when the turn sets none"
        assert body["tool_choice"] == {"type": "auto"}
        tools = {tool["name"]: tool for tool in body["tools"]}
        assert set(tools) == set(_TOOLS)
        assert tools["get_weather"] == {
            "name": "get_weather",
            "description": WEATHER_TOOL.description,
            "input_schema": WEATHER_SCHEMA,
        }
    assert first["messages"] == [{"role": "user", "content": QUESTION}]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][1]["content"] == [
        {"type": "text", "text": PREAMBLE},
        {"type": "tool_use", "id": case.call_id, "name": "get_weather", "input": {"city": "Paris"}},
    ]
    result = second["messages"][2]["content"][0]
    assert result["type"] == "tool_result"
    assert result["tool_use_id"] == case.call_id
    assert not result.get("is_error")
    assert json.loads(result["content"]) == WEATHER
    check_anthropic_transcript(second)


def check_chat(requests: list[Recorded], case: Case) -> None:
    first, second = (r.json for r in requests)
    for request, body in zip(requests, (first, second), strict=True):
        assert request.path == case.path
        assert request.headers["authorization"] == f"Bearer {KEYS['E2E_CHAT_KEY']}"
        assert body["model"] == "gpt-4.1"
        assert body["stream"] is True
        assert body["stream_options"] == {"include_usage": True}
        assert body["tool_choice"] == "auto"
        tools = {tool["function"]["name"]: tool for tool in body["tools"]}
        assert set(tools) == set(_TOOLS)
        assert tools["get_weather"] == {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": WEATHER_TOOL.description,
                "parameters": WEATHER_SCHEMA,
            },
        }
    system = {"role": "system", "content": SYSTEM_PROMPT}
    assert first["messages"] == [system, {"role": "user", "content": QUESTION}]
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "tool"]
    assistant, tool = second["messages"][2:]
    assert assistant["content"] == PREAMBLE
    (call,) = assistant["tool_calls"]
    assert call["id"] == case.call_id
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    assert tool["tool_call_id"] == case.call_id
    assert json.loads(tool["content"]) == WEATHER
    check_chat_transcript(second)


def check_responses(requests: list[Recorded], case: Case) -> None:
    first, second = (r.json for r in requests)
    for request, body in zip(requests, (first, second), strict=True):
        assert request.path == case.path
        assert request.headers["authorization"] == f"Bearer {KEYS['E2E_RESPONSES_KEY']}"
        assert body["model"] == "gpt-4.1-mini"
        assert body["stream"] is True
        assert body["instructions"] == SYSTEM_PROMPT
        assert body["store"] is False
        assert "include" not in body, "no encrypted reasoning asked of a non-reasoning model"
        assert body["tool_choice"] == "auto"
        tools = {tool["name"]: tool for tool in body["tools"]}
        assert set(tools) == set(_TOOLS)
        assert tools["get_weather"] == {
            "type": "function",
            "name": "get_weather",
            "description": WEATHER_TOOL.description,
            "parameters": WEATHER_SCHEMA,
            "strict": False,
        }
    user = {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}
    assert first["input"] == [user]
    assert second["input"][0] == user
    assert second["input"][1] == {"role": "assistant", "content": PREAMBLE}
    call, output = second["input"][2:]
    assert call["type"] == "function_call"
    assert call["call_id"] == case.call_id
    assert call["name"] == "get_weather"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    assert output["type"] == "function_call_output"
    assert output["call_id"] == case.call_id
    assert json.loads(output["output"]) == WEATHER
    check_responses_transcript(second)


CHECKS: dict[str, Callable[[list[Recorded], Case], None]] = {
    "anthropic": check_anthropic,
    "openai": check_chat,
    "openai-responses": check_responses,
}

_ANTHROPIC_TOOL_ID = re.compile(r"^[a-zA-Z0-9_-]+$")


def check_anthropic_transcript(body: dict[str, Any]) -> None:
    """What the Messages API requires of ``messages``: user first and last, roles alternating, no empty
    text, ``tool_use`` ids unique and of ``[a-zA-Z0-9_-]``, every ``tool_use`` answered by ``tool_result``
    blocks that come first in the next user turn; a string ``content`` is one text block."""
    turns = body["messages"]
    ids = [b["id"] for t in turns for b in a_blocks(t) if b["type"] == "tool_use"]
    assert len(set(ids)) == len(ids), f"tool_use ids must be unique: {ids}"
    assert turns[0]["role"] == "user"
    assert turns[-1]["role"] == "user"
    for before, after in itertools.pairwise(turns):
        assert before["role"] != after["role"], f"consecutive {before['role']} turns"
    for index, turn in enumerate(turns):
        blocks = a_blocks(turn)
        assert blocks, f"turn {index} is empty"
        for block in blocks:
            if block["type"] == "text":
                assert block["text"].strip(), f"empty text block in turn {index}"
        calls = [b["id"] for b in blocks if b["type"] == "tool_use"]
        assert all(_ANTHROPIC_TOOL_ID.match(call) for call in calls), calls
        if turn["role"] == "assistant":
            assert calls == [] or blocks[-1]["type"] == "tool_use"
            following = a_blocks(turns[index + 1])
            results = [b["tool_use_id"] for b in following[: len(calls)] if b["type"] == "tool_result"]
            assert results == calls, f"turn {index + 1} must open with the results of {calls}"
        else:
            previous = a_blocks(turns[index - 1]) if index else []
            answered = {b["id"] for b in previous if b["type"] == "tool_use"}
            results = [b["tool_use_id"] for b in blocks if b["type"] == "tool_result"]
            assert set(results) <= answered, f"tool_result for a call not made in turn {index - 1}"


def check_chat_transcript(body: dict[str, Any]) -> None:
    """Chat Completions: every assistant ``tool_calls`` message is followed at once by one ``tool``
    message per call with the matching ``tool_call_id``; no other ``tool`` messages; no empty messages."""
    messages = body["messages"]
    index = 0
    while index < len(messages):
        message = messages[index]
        role = message["role"]
        assert role != "tool", f"tool message {index} follows no assistant tool_calls"
        if role == "assistant":
            assert message.get("content") or message.get("tool_calls"), f"empty assistant message {index}"
            ids = [call["id"] for call in message.get("tool_calls") or ()]
            for call in message.get("tool_calls") or ():
                assert isinstance(json.loads(call["function"]["arguments"]), dict)
            results = messages[index + 1 : index + 1 + len(ids)]
            assert [(m["role"], m["tool_call_id"]) for m in results] == [("tool", i) for i in ids]
            assert all(isinstance(m["content"], str) for m in results)
            index += len(ids)
        else:
            assert message["content"], f"empty {role} message {index}"
        index += 1
    assert messages[-1]["role"] in ("user", "tool")


def check_responses_transcript(body: dict[str, Any]) -> None:
    """Responses: every ``function_call`` has exactly one later ``function_call_output`` with its
    ``call_id``, and every output answers an earlier call; arguments are JSON objects."""
    pending: set[str] = set()
    for item in body["input"]:
        kind = item.get("type", "message")
        if kind == "function_call":
            assert item["call_id"] not in pending
            assert isinstance(json.loads(item["arguments"]), dict)
            pending.add(item["call_id"])
        elif kind == "function_call_output":
            assert item["call_id"] in pending, f"output for unknown call {item['call_id']}"
            assert isinstance(item["output"], str)
            pending.remove(item["call_id"])
        else:
            assert item["role"] in ("user", "assistant", "system", "developer")
            assert item["content"], f"empty {item['role']} item"
    assert not pending, f"calls without output: {pending}"


# --- the tests -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
async def test_a_tool_call_turn_runs_identically_on_every_provider(harness: Harness, case: Case) -> None:
    replay = harness.replay(case, *case.replies) if case.remote else None
    conversation = f"weather-{case.name}-{next(_ids)}"
    async with TurnwireClient(harness.sidecar.target) as client:
        result = await collect(client.chat(conversation, QUESTION, model=case.model))
        stored = await client.get_conversation(conversation)

    # The event stream.
    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, harness.sidecar.log_text())
    assert squeezed_kinds(result) == EXPECTED_KINDS
    assert of_kind(result, "turn_start")[0].model == case.model
    assert [s.step_number for s in of_kind(result, "step_start")] == [0, 1]
    (started,) = of_kind(result, "tool_input_start")
    (available,) = of_kind(result, "tool_input_available")
    (output,) = of_kind(result, "tool_output_available")
    assert (started.tool_call_id, started.tool_name) == (case.call_id, "get_weather")
    assert (available.tool_call_id, available.tool_name) == (case.call_id, "get_weather")
    streamed_input = "".join(d.input_text_delta for d in of_kind(result, "tool_input_delta"))
    assert json.loads(streamed_input) == {"city": "Paris"}
    assert json_format.MessageToDict(available.input) == {"city": "Paris"}
    assert output.tool_call_id == case.call_id
    assert json_format.MessageToDict(output.output) == WEATHER
    assert not output.preliminary
    finishes = of_kind(result, "step_finish")
    assert [f.finish_reason for f in finishes] == [
        event_pb2.FINISH_REASON_TOOL_CALLS,
        event_pb2.FINISH_REASON_STOP,
    ]
    assert tuple(f.raw_finish_reason for f in finishes) == case.raw_finish
    assert tuple(f.response_id for f in finishes) == case.response_ids
    assert {f.response_model for f in finishes} == {case.response_model}
    assert result.step_count == 2

    # Usage: per step as the provider reported it (normalized), summed on TurnEnd.
    step_usage = [usage_tuple(f.usage) for f in finishes]
    summed = tuple(sum(column) for column in zip(*step_usage, strict=True))
    assert usage_tuple(result.usage) == summed
    assert result.usage.reasoning_tokens == sum(f.usage.reasoning_tokens for f in finishes)
    if case.remote:
        assert step_usage == STEP_USAGE
    else:
        assert all(u[0] > 0 and u[1] > 0 and u[2] == u[0] + u[1] for u in step_usage), step_usage

    # The reply as streamed, as TurnEnd carries it, and as stored.
    message = result.message
    assert message is not None
    assert part_kinds(message) == ["step_start", "text", "tool_call", "step_start", "text"]
    deltas = "".join(d.delta for d in of_kind(result, "text_delta"))
    assert "".join(step_texts(message)) == deltas
    preamble, answer = step_texts(message)
    assert preamble and mentions_weather(answer), answer
    if case.remote:
        assert (preamble, answer) == (PREAMBLE, ANSWER)
    (call,) = result.tool_calls
    assert call.tool_call_id == case.call_id
    assert call.tool_name == "get_weather"
    assert call.state == "output-available"
    assert call.input == {"city": "Paris"}
    assert call.output == WEATHER
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER, message_pb2.ROLE_ASSISTANT]
    assert stored.messages[0].parts[0].text.text == QUESTION
    assert stored.messages[1] == message

    # What the provider received: request 1 the question, request 2 the tool result in its API's shape.
    if replay is not None:
        assert not replay.replies, "both recorded streams were requested"
        assert len(replay.requests) == 2
        CHECKS[case.name](replay.requests, case)


@pytest.mark.parametrize("case", REMOTE, ids=[case.name for case in REMOTE])
async def test_a_conversation_started_on_scripted_continues_on_a_real_provider(
    harness: Harness, case: Case
) -> None:
    follow_up = "Thanks! Do I need a coat?"
    reply = "Yes: take a warm coat."
    stream = {
        "anthropic": lambda: anthropic_stream("msg_01Coat", [{"text": reply}], (300, 9, 309, 0)),
        "openai": lambda: chat_stream("chatcmpl-coat", reply, [], (300, 9, 309, 0)),
        "openai-responses": lambda: responses_stream("resp_coat0000", reply, [], (300, 9, 309, 0)),
    }[case.name]()
    replay = harness.replay(case, stream)
    conversation = f"switch-{case.name}-{next(_ids)}"
    async with TurnwireClient(harness.sidecar.target) as client:
        first = await collect(client.chat(conversation, QUESTION))  # the default model: scripted:demo
        second = await collect(client.chat(conversation, follow_up, model=case.model))
        stored = await client.get_conversation(conversation)

    assert first.ok and second.ok, (first.error, second.error, harness.sidecar.log_text())
    assert of_kind(first, "turn_start")[0].model == "scripted:demo"
    assert of_kind(second, "turn_start")[0].model == case.model
    (scripted_call,) = first.tool_calls
    assert second.text == reply
    assert [m.role for m in stored.messages] == [
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
        message_pb2.ROLE_USER,
        message_pb2.ROLE_ASSISTANT,
    ]

    (request,) = replay.requests
    body = request.json
    scripted_preamble, scripted_answer = step_texts(first.message or message_pb2.Message())
    call_id = scripted_call.tool_call_id
    if case.name == "anthropic":
        check_anthropic_transcript(body)
        turns = body["messages"]
        assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
        assert [b["type"] for b in turns[1]["content"]] == ["text", "tool_use"]
        assert turns[1]["content"][1] == {
            "type": "tool_use",
            "id": call_id,
            "name": "get_weather",
            "input": {"city": "Paris"},
        }
        assert turns[2]["content"][0]["tool_use_id"] == call_id
        assert json.loads(turns[2]["content"][0]["content"]) == WEATHER
        assert turns[3]["content"] == scripted_answer
        assert turns[4]["content"] == follow_up
    elif case.name == "openai":
        check_chat_transcript(body)
        messages = body["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "user"]
        assert messages[2]["content"] == scripted_preamble
        assert messages[2]["tool_calls"][0]["id"] == call_id
        assert messages[3]["tool_call_id"] == call_id
        assert json.loads(messages[3]["content"]) == WEATHER
        assert messages[4] == {"role": "assistant", "content": scripted_answer}
        assert messages[5] == {"role": "user", "content": follow_up}
    else:
        check_responses_transcript(body)
        items = body["input"]
        assert [i.get("type") or i["role"] for i in items] == [
            "user",
            "assistant",
            "function_call",
            "function_call_output",
            "assistant",
            "user",
        ]
        assert items[2]["call_id"] == items[3]["call_id"] == call_id
        assert json.loads(items[3]["output"]) == WEATHER
        assert items[4] == {"role": "assistant", "content": scripted_answer}
        assert items[5] == {"role": "user", "content": [{"type": "input_text", "text": follow_up}]}


KIMI_STYLE_CALL_ID = "functions.get_weather:0"
"""Tool call ids as some OpenAI-compatible servers make them (Kimi K2 on vLLM, for one)."""


@pytest.mark.parametrize("source", ["scripted-twice", "openai-compatible-ids"])
async def test_tool_call_ids_from_earlier_turns_are_valid_for_anthropic(
    harness: Harness, source: str
) -> None:
    """The Messages API rejects (HTTP 400) a ``tool_use`` id that is not ``^[a-zA-Z0-9_-]+$`` or that
    appears twice in ``messages``. Earlier turns on other providers can leave both: the scripted model
    numbers its calls ``call_<step>_<index>`` afresh in every turn, and OpenAI-compatible servers may
    use ids such as ``functions.get_weather:0``."""
    anthropic = next(case for case in REMOTE if case.name == "anthropic")
    chat = next(case for case in REMOTE if case.name == "openai")
    conversation = f"ids-{source}-{next(_ids)}"
    async with TurnwireClient(harness.sidecar.target) as client:
        earlier: list[TurnResult] = []
        if source == "scripted-twice":
            earlier.append(await collect(client.chat(conversation, QUESTION)))
            earlier.append(await collect(client.chat(conversation, "And what is 12 * 7?")))
        else:
            harness.replay(
                chat,
                chat_stream(
                    "chatcmpl-k1", PREAMBLE, [(KIMI_STYLE_CALL_ID, "get_weather", WEATHER_ARGS)], (1, 1, 2, 0)
                ),
                chat_stream("chatcmpl-k2", ANSWER, [], (1, 1, 2, 0)),
            )
            earlier.append(await collect(client.chat(conversation, QUESTION, model=chat.model)))
        replay = harness.replay(anthropic, anthropic_stream("msg_01Ids", [{"text": "Noted."}], (9, 2, 11, 0)))
        last = await collect(client.chat(conversation, "Thanks.", model=anthropic.model))

    assert all(turn.ok and turn.tool_calls for turn in earlier), [t.error for t in earlier]
    stored_ids = [call.tool_call_id for turn in earlier for call in turn.tool_calls]
    (request,) = replay.requests
    turns = request.json["messages"]
    sent_ids = [b["id"] for t in turns for b in a_blocks(t) if b["type"] == "tool_use"]
    assert len(sent_ids) == len(stored_ids)
    assert len(set(sent_ids)) == len(sent_ids), f"duplicate tool_use ids sent: {sent_ids}"
    check_anthropic_transcript(request.json)
    assert last.ok, last.error
