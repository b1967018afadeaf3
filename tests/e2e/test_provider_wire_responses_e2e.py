"""Issue 30, the Responses items, end to end: a real ``turnwire serve`` with an ``openai-responses``
entry pointed at a replay server that speaks the API's wire format (the official ``openai`` SDK in
the sidecar), checking the stored message (``GetConversation``) and the body of the *next* request
the replay server recorded, against the API's rules.

- Item 2: item ids that change from event to event: the 138-character answer is stored as streamed
  and sent back whole.
- Item 7: DeepSeek's text-only reasoning goes back, before its function call, on every later
  request of that conversation.
- Item 8: after a step that failed right behind its reasoning item, no request carries a reasoning
  item without the item that followed it, and ContinueLastTurn answers the question instead of
  asking the model to continue a reply it cannot see.
- Item 11: ``provider_options.previous_response_id`` is refused with INVALID_ARGUMENT, nothing sent.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import orjson
import pytest
from providers.helpers import r_text_stream
from providers.replay import ReplayServer, Reply
from support.hooks import pythonpath_env
from support.sidecar import SidecarProcess, running_sidecar

from turnwire.providers import CONTINUATION_PROMPT
from turnwire.tools import ToolExecution
from turnwire.values import dumps
from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.tools.loading import load_tools

CASES = Path(__file__).resolve().parents[1] / "providers" / "cases_extra" / "sse"
SYSTEM = "Be brief."
PARIS_WEATHER = dumps(
    asyncio.run(
        load_tools(True, [])["get_weather"].execute({"city": "Paris"}, ToolExecution("c", "conv", "req", 0))
    )
)
_ids = itertools.count(1)


def _case(name: str) -> tuple[bytes, dict[str, Any]]:
    """The stream of a wire case and its expected outcome."""
    expected: dict[str, Any] = orjson.loads((CASES / f"{name}.expected.json").read_bytes())["expected"]
    return (CASES / f"{name}.sse").read_bytes(), expected


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "input_text", "text": text}]}


def _check_reasoning_followed(items: list[dict[str, Any]]) -> None:
    """OpenAI's rule: every reasoning item is followed by an output item (reasoning, a message or a
    function call), never by a user item or the end of the input."""
    for index, item in enumerate(items):
        if item.get("type") == "reasoning":
            after = items[index + 1] if index + 1 < len(items) else {"role": "(end of input)"}
            assert after.get("type") in {"reasoning", "function_call"} or after.get("role") == "assistant", (
                f"reasoning item {index} is followed by {after}"
            )


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    server = ReplayServer().start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory: pytest.TempPathFactory, replay: ReplayServer) -> Iterator[SidecarProcess]:
    config = {
        "default_model": "responses:gpt-4.1-mini",
        "system_prompt": SYSTEM,
        "providers": {
            "responses": {
                "type": "openai-responses",
                "api_key_env": "E2E_R_KEY",
                "base_url": f"{replay.url}/v1",
                "max_retries": 0,
                "timeout_seconds": 10,
            },
        },
        "middleware": [{"path": "support.hooks:ProviderOptionsFromBody"}],
    }
    env = {"E2E_R_KEY": "sk-resp-dummy", **pythonpath_env()}
    with running_sidecar(tmp_path_factory.mktemp("responses-wire-e2e"), config, env) as process:
        yield process


def _serve(replay: ReplayServer, *streams: bytes) -> None:
    replay.replies.clear()
    replay.requests.clear()
    replay.enqueue(*(Reply.sse(stream) for stream in streams))


def _parts(message: message_pb2.Message) -> list[str]:
    return [str(part.WhichOneof("kind")) for part in message.parts]


async def test_item_ids_that_change_per_event_are_stored_and_sent_back_as_streamed(
    sidecar: SidecarProcess, replay: ReplayServer
) -> None:
    stream, expected = _case("openai_responses_item_ids_change_per_event")
    answer = expected["text"]
    _serve(replay, stream, r_text_stream("It is sunny."))
    conversation = f"ids-{next(_ids)}"
    question = "Tell me about the Eiffel Tower, then the weather there."
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, question, model="responses:gpt-4.1-mini"))
        stored = await client.get_conversation(conversation)

    assert result.status == event_pb2.TURN_STATUS_COMPLETED, (result.error, sidecar.log_text())
    kinds = [e.WhichOneof("event") for e in result.events]
    assert kinds.count("text_start") == 2  # one per step: the answer, then "It is sunny."
    streamed = "".join(e.text_delta.delta for e in result.events if e.WhichOneof("event") == "text_delta")
    assert streamed == answer + "It is sunny."
    reply = stored.messages[-1]
    assert reply == result.message
    texts = [p.text.text for p in reply.parts if p.WhichOneof("kind") == "text"]
    assert texts == [answer, "It is sunny."]  # 138 characters stored, not the last delta "."
    assert len(texts[0]) == 138
    # The next request (step 2) sends the answer back whole, with its call and result.
    sent = replay.requests[1].json["input"]
    assert sent == [
        _user(question),
        {"role": "assistant", "content": answer},
        {
            "type": "function_call",
            "call_id": "call_gw_paris",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "call_gw_paris", "output": PARIS_WEATHER},
    ]


async def test_deepseek_reasoning_text_goes_back_in_its_tool_turn_and_later(
    sidecar: SidecarProcess, replay: ReplayServer
) -> None:
    stream, expected = _case("openai_responses_deepseek_reasoning_text_tool_loop")
    _serve(replay, stream, r_text_stream("It is sunny in Paris."), r_text_stream("You're welcome."))
    conversation = f"deepseek-{next(_ids)}"
    model = "responses:deepseek-v4-flash"
    question = "What's the weather in Paris?"
    async with TurnwireClient(sidecar.target) as client:
        first = await collect(client.chat(conversation, question, model=model))
        second = await collect(client.chat(conversation, "Thanks!", model=model))
        stored = await client.get_conversation(conversation)

    assert first.ok and second.ok, (first.error, second.error, sidecar.log_text())
    reply = stored.messages[1]
    assert _parts(reply) == ["step_start", "reasoning", "tool_call", "step_start", "text"]
    assert reply.parts[1].reasoning.text == expected["reasoning"]
    reasoning_item = {
        "type": "reasoning",
        "id": "rs_6a1f0c3e52d44b8e_0",
        "summary": [],
        "content": [{"type": "reasoning_text", "text": expected["reasoning"]}],
    }
    call = {
        "type": "function_call",
        "call_id": "call_00_Vb3kP9sQ2mX7",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    output = {"type": "function_call_output", "call_id": call["call_id"], "output": PARIS_WEATHER}
    # The tool loop's next step, then the next turn: the reasoning goes back before its call both times.
    assert replay.requests[1].json["input"] == [_user(question), reasoning_item, call, output]
    assert replay.requests[2].json["input"] == [
        _user(question),
        reasoning_item,
        call,
        output,
        {"role": "assistant", "content": "It is sunny in Paris."},
        _user("Thanks!"),
    ]


async def test_a_step_that_failed_after_its_reasoning_leaves_every_later_request_valid(
    sidecar: SidecarProcess, replay: ReplayServer
) -> None:
    stream, expected = _case("openai_responses_error_after_reasoning_item")
    _serve(replay, stream, r_text_stream("391."), r_text_stream("Yes."))
    conversation = f"failed-reasoning-{next(_ids)}"
    model = "responses:gpt-5.1"
    async with TurnwireClient(sidecar.target) as client:
        failed = await collect(client.chat(conversation, "What is 17 × 23?", model=model))
        continued = await collect(client.continue_last_turn(conversation, model=model))
        later = await collect(client.chat(conversation, "Are you still there?", model=model))
        stored = await client.get_conversation(conversation)

    assert failed.status == event_pb2.TURN_STATUS_ERROR and failed.error is not None
    assert "server_error" in failed.error.message
    assert continued.ok and later.ok, (continued.error, later.error, sidecar.log_text())
    # The partial reply is stored as streamed: its reasoning, complete with the encrypted content.
    partial = stored.messages[1]
    assert _parts(partial) == ["step_start", "reasoning"]
    assert partial.parts[1].reasoning.text == expected["reasoning"]
    assert partial.parts[1].reasoning.signature
    bodies = [request.json for request in replay.requests]
    assert len(bodies) == 3
    # ContinueLastTurn: nothing of the reply could be sent, so the model answers the question.
    assert bodies[1]["input"] == [_user("What is 17 × 23?")]
    assert CONTINUATION_PROMPT not in orjson.dumps(bodies[1]).decode()
    assert bodies[2]["input"] == [
        _user("What is 17 × 23?"),
        {"role": "assistant", "content": "391."},
        _user("Are you still there?"),
    ]
    for body in bodies:
        _check_reasoning_followed(body["input"])


async def test_previous_response_id_is_refused_with_invalid_argument(
    sidecar: SidecarProcess, replay: ReplayServer
) -> None:
    _serve(replay, r_text_stream("never sent"))
    conversation = f"previous-{next(_ids)}"
    options = {"responses": {"previous_response_id": "resp_0b51e2c7a9d34f6e"}}
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "Hi", body={"provider_options": options}))
        stored = await client.get_conversation(conversation)

    error = result.error
    assert result.status == event_pb2.TURN_STATUS_ERROR and error is not None
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "previous_response_id is not supported" in error.message
    assert "remove it" in error.message
    assert "sk-resp-dummy" not in error.message and replay.url not in error.message
    assert replay.requests == []  # nothing reached the API
    assert [m.role for m in stored.messages] == [message_pb2.ROLE_USER]
