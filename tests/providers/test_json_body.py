"""Request bodies encoded by the adapters (providers/json_body.py, issue 17): the bytes the SDK
method would send, each transcript message encoded once while it is kept, and the SDK method
still used where an argument is not a plain body field."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from providers.helpers import (
    a_text_stream,
    assistant,
    c_text_stream,
    collect,
    request,
    text,
    tool_call,
    user,
)
from providers.replay import ReplayServer, Reply
from turnwire.types import ModelSettings
from turnwire_server.cache_budget import CacheBudget
from turnwire_server.providers import json_body
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.json_body import JsonBodies
from turnwire_server.providers.openai_chat import OpenAIChatProvider

HISTORY = (
    user("What is the weather in Paris?"),
    assistant([text("Let me look."), tool_call("call_1", "weather", {"city": "Paris"}, output={"c": 21})]),
    user("And in Zürich, \u2603? Answer with one emoji \U0001f600."),
)


async def _sdk_body(provider: Any, replay: ReplayServer, model_request: Any, reply: bytes) -> bytes:
    """The body the SDK's own ``create`` sends for the adapter's prepared arguments."""
    kwargs, extra_body, _ = provider._prepare(model_request)
    replay.enqueue(Reply.sse(reply))
    async with provider._create(provider.client)(stream=True, **kwargs, extra_body=extra_body) as response:
        await response.http_response.aread()
    return replay.requests[-1].body


@pytest.mark.parametrize("api", ["anthropic", "chat"])
async def test_the_posted_body_is_the_json_the_sdk_method_sends(
    api: str,
    replay: ReplayServer,
    anthropic_provider: AnthropicMessagesProvider,
    chat_provider: OpenAIChatProvider,
) -> None:
    provider: Any = anthropic_provider if api == "anthropic" else chat_provider
    reply = a_text_stream() if api == "anthropic" else c_text_stream()
    settings = ModelSettings(max_output_tokens=100, stop_sequences=["END"], temperature=0.5)
    model_request = request(*HISTORY, settings=settings)
    replay.enqueue(Reply.sse(reply))
    result = await collect(provider, model_request)
    assert result.error is None
    posted = replay.requests[0]
    assert posted.headers["content-type"] == "application/json"
    sdk = await _sdk_body(provider, replay, model_request, reply)
    assert posted.json == orjson.loads(sdk) and len(posted.body) == len(sdk)  # keys maybe in another order
    assert posted.json["stream"] is True and "Zürich, \u2603" in posted.body.decode()


async def test_an_argument_the_sdk_sends_elsewhere_goes_through_the_sdk_method(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    """``workspace_id`` is an argument of ``messages.create`` that the SDK sends as a header: a
    request with it is not posted as JSON here but through the SDK method, which puts it there."""
    settings = ModelSettings(provider_options={"anthropic": {"workspace_id": "ws_1", "speed": "fast"}})
    replay.enqueue(Reply.sse(a_text_stream()))
    result = await collect(anthropic_provider, request(settings=settings))
    assert result.error is None
    sent = replay.requests[0]
    assert sent.headers["anthropic-workspace-id"] == "ws_1"
    assert "workspace_id" not in sent.json and sent.json["speed"] == "fast"


def test_a_kept_message_is_encoded_once(monkeypatch: pytest.MonkeyPatch) -> None:
    encoded: list[Any] = []
    real = json_body.dumps

    def counting(value: Any) -> bytes:
        encoded.append(value)
        return real(value)

    monkeypatch.setattr(json_body, "dumps", counting)
    bodies = JsonBodies()
    first = {"role": "user", "content": "hi"}
    second = {"role": "assistant", "content": [{"type": "text", "text": "hello"}]}
    third = {"role": "user", "content": "more"}
    before = bodies.encode({"model": "m", "messages": [first, second]})
    encoded.clear()
    after = bodies.encode({"model": "m", "messages": [first, second, third], "stream": True})
    assert encoded == [{"model": "m"}, {"stream": True}, "messages", third]  # the rest, then the new one
    assert before == b'{"model":"m","messages":[{"role":"user","content":"hi"},' + real(second) + b"]}"
    assert (
        after
        == b'{"model":"m","messages":[' + b",".join(map(real, (first, second, third))) + b'],"stream":true}'
    )
    assert bodies.encode({"messages": []}) == b'{"messages":[]}'
    # Another list from the same first item (an edit replaced the second): its own items, joined.
    edited = {"role": "assistant", "content": "changed"}
    assert (
        bodies.encode({"messages": [first, edited, third]})
        == b'{"messages":[' + b",".join(map(real, (first, edited, third))) + b"]}"
    )
    assert bodies.encode({"messages": [first], "a": [1]}) == b'{"messages":[' + real(first) + b'],"a":[1]}'


def test_kept_encodings_stay_within_their_bound() -> None:
    budget = CacheBudget(4000)
    bodies = JsonBodies(budget=budget)
    items = [{"role": "user", "content": "x" * 90} for _ in range(100)]
    for end in range(1, len(items) + 1):
        bodies.encode({"messages": items[:end]})
        assert budget.counted_bytes <= 4000
    assert 0 < len(budget) <= 10


def test_a_non_finite_number_is_refused_as_the_sdks_refuse_it() -> None:
    with pytest.raises(ValueError, match="JSON compliant"):
        JsonBodies().encode({"messages": [{"role": "user", "content": [{"value": math.nan}]}]})


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["append", "replace", "truncate", "restart"]), st.integers(0, 50), st.text()
        ),
        max_size=40,
    )
)
def test_every_body_decodes_to_what_was_encoded(steps: list[tuple[str, int, str]]) -> None:
    """However the message lists evolve (appended to, an item replaced, cut short, another
    conversation), each body is exactly its content, with small bounds forcing evictions."""
    bodies = JsonBodies(budget=CacheBudget(1200))
    conversations: list[list[dict[str, Any]]] = [[]]
    for op, index, value in steps:
        items = conversations[-1]
        if op == "append" or not items:
            items.append({"role": "user", "content": value})
        elif op == "replace":
            items = conversations[-1] = list(items)
            items[index % len(items)] = {"role": "assistant", "content": value}
        elif op == "truncate":
            conversations[-1] = items[: index % len(items)]
        else:
            conversations.append([{"role": "system", "content": value}])
        body = {"model": value, "messages": conversations[-1], "stream": True}
        assert orjson.loads(bodies.encode(body)) == body
