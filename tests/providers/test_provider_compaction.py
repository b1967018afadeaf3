"""Context-overflow recovery through the official SDKs (docs/semantics.md §9): the engine runs on
the real Anthropic, OpenAI Chat and OpenAI Responses adapters against the replay server.

- An overflow arriving as an HTTP 400 (Anthropic ``prompt is too long``, OpenAI
  ``context_length_exceeded``) and as an in-stream error event (Responses ``error`` event,
  ``shared/cases/providers/sse/openai_responses_error_event_context_length_exceeded.sse``) is
  classified ``context_overflow`` by the default classifier, compacted (the summary asked of
  the same provider), and the turn runs again and completes.
- The compacted history each adapter then sends is well-formed for its API, checked on the
  request body the server received: every tool call is answered by exactly one result right
  after it, no result without its call, and the dropped outputs show the placeholder.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from providers.helpers import a_text_stream, c_text_stream, r_text_stream
from providers.replay import ReplayServer, Reply
from turnwire.compaction import CompactionConfig, DropOldestToolOutputs, SummarizeOlder
from turnwire.providers import Provider
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.api.status import status_of
from turnwire_server.engine import EngineSettings, TurnEngine, TurnRequest
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store import TurnRecord
from turnwire_server.store.sqlite import SqliteStore

CONV = "conv-overflow"
BIG = "lorem ipsum dolor sit amet " * 40

ANTHROPIC_OVERFLOW = {
    "type": "error",
    "error": {
        "type": "invalid_request_error",
        "message": "prompt is too long: 200251 tokens > 200000 maximum",
    },
}
OPENAI_OVERFLOW = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages resulted in "
        "131000 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}

TEXT_STREAMS: dict[str, Callable[[str], bytes]] = {
    "anthropic": a_text_stream,
    "openai": c_text_stream,
    "openai-responses": r_text_stream,
}


@dataclasses.dataclass
class Rig:
    engine: TurnEngine
    store: SqliteStore
    name: str


@pytest.fixture
async def rig(
    request: pytest.FixtureRequest, adapters: dict[str, Provider], tmp_path: Path
) -> AsyncIterator[Callable[..., Any]]:
    opened: list[tuple[TurnEngine, SqliteStore]] = []

    async def build(fixture: str, config: CompactionConfig) -> Rig:
        provider = adapters[fixture]
        store = SqliteStore(tmp_path / f"{fixture}.db")
        await store.open()
        engine = TurnEngine(
            store=store,
            providers=ProviderRegistry({provider.name: provider}),
            tools={},
            chain=MiddlewareChain([]),  # the default ErrorClassifier only
            settings=EngineSettings(default_model=f"{provider.name}:m", compaction=config),
            error_status=status_of,
        )
        opened.append((engine, store))
        return Rig(engine, store, provider.name)

    yield build
    for engine, store in opened:
        await engine.drain(1.0)
        await store.close()


def _message(
    message_id: str, role: message_pb2.Role.ValueType, *parts: message_pb2.Part
) -> message_pb2.Message:
    return message_pb2.Message(id=message_id, role=role, parts=list(parts))


def _text(value: str) -> message_pb2.Part:
    return message_pb2.Part(text=message_pb2.TextPart(text=value))


def _call(call_id: str, output: str) -> message_pb2.Part:
    call = message_pb2.ToolCallPart(
        tool_call_id=call_id,
        tool_name="lookup",
        input_json='{"q":"x"}',
        output_json=f'"{output}"',
        state=message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
    )
    return message_pb2.Part(tool_call=call)


async def seed(store: SqliteStore, exchanges: int, *, tools: bool) -> None:
    """``exchanges`` stored turns; with ``tools`` each reply called ``lookup`` twice in two steps."""
    for n in range(exchanges):
        user = _message(f"u{n}", message_pb2.ROLE_USER, _text(f"question {n} {BIG}"))
        step = message_pb2.Part(step_start=message_pb2.StepStartPart())
        parts = (
            [step, _call(f"c{n}a", f"out-{n}-a {BIG}"), step, _call(f"c{n}b", f"out-{n}-b {BIG}"), step]
            if tools
            else []
        )
        reply = _message(f"a{n}", message_pb2.ROLE_ASSISTANT, *parts, _text(f"answer {n} {BIG}"))
        turn = TurnRecord(
            request_id=f"r{n}",
            conversation_id=CONV,
            assistant_message_id=reply.id,
            continuation=False,
            model="m",
            state="running",
            start_time=dt.datetime.now(dt.UTC),
        )
        await store.start_turn(turn, [user])
        await store.finish_turn(dataclasses.replace(turn, state="completed"), reply)


async def run(rig: Rig, text: str = "and now?") -> list[event_pb2.TurnEvent]:
    question = _message("q", message_pb2.ROLE_USER, _text(text))
    handle = await rig.engine.start(
        TurnRequest(
            conversation_id=CONV,
            request_id="r-now",
            messages=[question],
            body={},
            model=f"{rig.name}:m",
            continuation=False,
            response_type=chat_service_pb2.ChatResponse,
        )
    )
    return [response.event async for response in handle]


def _kinds(events: list[event_pb2.TurnEvent]) -> list[str]:
    return [e.WhichOneof("event") or "" for e in events]


# --------------------------------------------------------------------------- well-formed histories


def check_anthropic(body: dict[str, Any]) -> list[str]:
    """Every ``tool_use`` answered by a ``tool_result`` in the next (user) message, none orphaned;
    roles alternate. Returns the tool_result contents."""
    messages = body["messages"]
    results: list[str] = []
    for i, message in enumerate(messages):
        if i:
            assert message["role"] != messages[i - 1]["role"], "roles must alternate"
        content = message["content"] if isinstance(message["content"], list) else []
        uses = [b["id"] for b in content if b.get("type") == "tool_use"]
        answered = [b["tool_use_id"] for b in content if b.get("type") == "tool_result"]
        if answered:
            before = messages[i - 1]["content"]
            assert sorted(answered) == sorted(b["id"] for b in before if b.get("type") == "tool_use")
            results += [str(b.get("content")) for b in content if b.get("type") == "tool_result"]
        if uses:
            after = messages[i + 1]["content"]
            assert sorted(uses) == sorted(b["tool_use_id"] for b in after if b.get("type") == "tool_result")
    return results


def check_chat(body: dict[str, Any]) -> list[str]:
    """Every assistant ``tool_calls`` followed by one ``tool`` message per id, none orphaned."""
    messages = body["messages"]
    results: list[str] = []
    pending: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in pending, "a tool result without its call"
            pending.remove(message["tool_call_id"])
            results.append(str(message["content"]))
            continue
        assert not pending, f"calls {pending} without results"
        pending = [c["id"] for c in message.get("tool_calls") or []]
    assert not pending
    return results


def check_responses(body: dict[str, Any]) -> list[str]:
    """Every ``function_call`` has exactly one ``function_call_output`` after it, and no output
    lacks its call."""
    calls: list[str] = []
    results: list[str] = []
    for item in body["input"]:
        if item.get("type") == "function_call":
            calls.append(item["call_id"])
        elif item.get("type") == "function_call_output":
            assert item["call_id"] in calls, "an output without its call"
            calls.remove(item["call_id"])
            results.append(str(item["output"]))
    assert not calls, f"calls {calls} without outputs"
    return results


CHECKS = {"anthropic": check_anthropic, "openai": check_chat, "openai-responses": check_responses}


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize(
    ("fixture", "overflow"),
    [
        ("anthropic_provider", Reply.error(400, ANTHROPIC_OVERFLOW)),
        ("chat_provider", Reply.error(400, OPENAI_OVERFLOW)),
        ("responses_provider", Reply.error(400, OPENAI_OVERFLOW)),
        ("responses_provider", Reply.sse("openai_responses_error_event_context_length_exceeded.sse")),
    ],
    ids=[
        "anthropic-http-400",
        "openai-chat-http-400",
        "openai-responses-http-400",
        "openai-responses-in-stream",
    ],
)
async def test_an_overflow_from_the_real_sdk_is_compacted_and_the_turn_completes(
    rig: Callable[..., Any], replay: ReplayServer, fixture: str, overflow: Reply
) -> None:
    setup = await rig(fixture, CompactionConfig(strategy=SummarizeOlder(), reactive=True))
    await seed(setup.store, 3, tools=True)
    stream = TEXT_STREAMS[setup.name]
    replay.enqueue(overflow, Reply.sse(stream("They asked three questions.")), Reply.sse(stream("Fine.")))
    events = await run(setup)

    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED, events[-1]
    compacted = [e.context_compacted for e in events if e.WhichOneof("event") == "context_compacted"]
    assert [(c.reason, c.shortened) for c in compacted] == [(event_pb2.COMPACTION_REASON_REACTIVE, True)]
    assert _kinds(events).count("attempt_start") == 1
    assert len(replay.requests) == 3  # overflow, summary, the re-run
    summary_request, retried = replay.requests[1].json, replay.requests[2].json
    check = CHECKS[setup.name]
    check(summary_request)
    check(retried)
    sent = str(retried)
    assert "They asked three questions." in sent and "question 0" not in sent and "and now?" in sent


@pytest.mark.parametrize("fixture", ["anthropic_provider", "chat_provider", "responses_provider"])
async def test_a_history_with_dropped_tool_outputs_is_well_formed_for_each_api(
    rig: Callable[..., Any], replay: ReplayServer, fixture: str
) -> None:
    setup = await rig(fixture, CompactionConfig(strategy=DropOldestToolOutputs(), reactive=True))
    await seed(setup.store, 3, tools=True)
    overflow = Reply.error(400, ANTHROPIC_OVERFLOW if setup.name == "anthropic" else OPENAI_OVERFLOW)
    replay.enqueue(overflow, Reply.sse(TEXT_STREAMS[setup.name]("Fine.")))
    events = await run(setup)

    assert events[-1].turn_end.status == event_pb2.TURN_STATUS_COMPLETED, events[-1]
    assert len(replay.requests) == 2
    retried = replay.requests[1].json
    results = CHECKS[setup.name](retried)
    # Every call still has its result; the outputs (oldest first, here all of them, as even
    # that leaves the history above half its size) are the placeholder; the texts stay.
    assert len(results) == 6
    assert all("tool output omitted to fit the context window" in r for r in results), results
    assert "out-0-a" not in str(retried) and "answer 0" in str(retried) and "question 2" in str(retried)


# --------------------------------------------------------------------------- token counting


def _json_reply(body: dict[str, Any]) -> Reply:
    import orjson

    return Reply(headers={"content-type": "application/json"}, body=orjson.dumps(body))


@pytest.mark.parametrize(
    ("fixture", "path", "reply"),
    [
        ("anthropic_provider", "/v1/messages/count_tokens", {"input_tokens": 1234}),
        (
            "responses_provider",
            "/v1/responses/input_tokens",
            {"object": "response.input_tokens", "input_tokens": 1234},
        ),
    ],
)
async def test_provider_token_counting_asks_the_api_and_falls_back_to_the_estimate(
    adapters: dict[str, Provider], replay: ReplayServer, fixture: str, path: str, reply: dict[str, Any]
) -> None:
    from providers.helpers import request, user
    from turnwire.compaction import EstimateTokens, ProviderTokens

    provider = adapters[fixture]
    counter = ProviderTokens()
    asked = request(user("How long is this?"), system="Be brief.")
    replay.enqueue(_json_reply(reply))
    assert await counter.count(asked, provider) == 1234
    sent = replay.requests[-1]
    assert sent.path == path
    assert "How long is this?" in str(sent.json) and "Be brief." in str(sent.json)
    # The API failing (here a 500) never fails a turn: the estimate answers.
    replay.enqueue(Reply.error(500, {"error": {"type": "api_error", "message": "boom"}}))
    assert await counter.count(asked, provider) == await EstimateTokens().count(asked, provider)
    # Chat Completions has no counting API: the estimate, without a request.
    before = len(replay.requests)
    assert await counter.count(asked, adapters["chat_provider"]) == await EstimateTokens().count(asked, None)
    assert len(replay.requests) == before
