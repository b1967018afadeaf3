"""An MCP tool's images, audio and embedded resources go back to each API as its own content, never
as base64 in text (``cases_extra/mcp/tool_result_media.json``, issue 31): the result a real MCP
``tools/call`` response gives (read by the ``mcp`` SDK and :func:`output_of`, as an MCP tool call
stores it), then the next request each adapter sends through its official SDK.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp.types import CallToolResult

from providers.helpers import Stored, a_text_stream, c_text_stream, r_text_stream, request, user
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.providers import Provider
from turnwire.types import ToolDefinition
from turnwire_server.tools.mcp_server import output_of

CASE = orjson.loads(
    (Path(__file__).resolve().parent / "cases_extra" / "mcp" / "tool_result_media.json").read_bytes()
)
TOOL = ToolDefinition(CASE["tool_name"], "A chart of a quarter's sales", {"type": "object", "properties": {}})
BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{200,}")  # what an image pasted into text looks like


def _stored_call() -> Any:
    """The assistant message an MCP tool call of the case stores (its output: output_of's)."""
    result = CallToolResult.model_validate(CASE["mcp_response"]["result"])
    output = output_of(result, CASE["tool_name"], "reports")
    chunks: list[base.ModelChunk] = [
        base.ToolInputStart("call_chart_1", CASE["tool_name"]),
        base.ToolCall("call_chart_1", CASE["tool_name"], {}, "{}"),
        base.FinishStep(base.FinishReason.TOOL_CALLS),
    ]
    return Stored().step(chunks, {"call_chart_1": output}).build()


@pytest.mark.parametrize(
    ("fixture", "reply"),
    [
        ("anthropic_provider", a_text_stream),
        ("responses_provider", r_text_stream),
        ("chat_provider", c_text_stream),
    ],
)
async def test_mcp_media_go_back_as_native_content(
    fixture: str, reply: Any, adapters: dict[str, Provider], replay: ReplayServer
) -> None:
    provider = adapters[fixture]
    replay.enqueue(Reply.sse(reply("ok")))
    question = user("Show me the Q3 sales chart.")
    async for _ in provider.stream(request(question, _stored_call(), tools=[TOOL])):
        pass
    body = replay.requests[0].json
    expected = CASE["expected"]
    if fixture == "anthropic_provider":
        results = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
        (tool_result,) = [b for b in results if b["type"] == "tool_result"]
        assert tool_result["content"] == expected["anthropic_tool_result_content"]
        texts = [b["text"] for b in tool_result["content"] if b["type"] == "text"]
    elif fixture == "responses_provider":
        (output,) = [item for item in body["input"] if item.get("type") == "function_call_output"]
        assert output["output"] == expected["responses_function_call_output"]
        texts = [i["text"] for i in output["output"] if i["type"] == "input_text"]
    else:
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "user"]  # the media after the tool message
        assert body["messages"][3]["content"] == expected["chat_tool_content"]
        assert body["messages"][4]["content"] == expected["chat_user_content"]
        texts = [body["messages"][3]["content"]]
    # Never base64 in text: no long base64 run in any text the model reads.
    assert not any(BASE64_RUN.search(text) for text in texts), texts


async def test_a_following_user_message_joins_the_media_message_in_chat(
    chat_provider: Provider, replay: ReplayServer
) -> None:
    """Chat: the next user message after the tool loop merges with the media message (roles must
    alternate for many compatible servers), the media first."""
    replay.enqueue(Reply.sse(c_text_stream("ok")))
    messages = [user("Show me the Q3 sales chart."), _stored_call(), user("Thanks, and Q2?")]
    async for _ in chat_provider.stream(request(*messages, tools=[TOOL])):
        pass
    last = replay.requests[0].json["messages"][-1]
    assert last["role"] == "user"
    assert (
        last["content"][: len(CASE["expected"]["chat_user_content"])] == CASE["expected"]["chat_user_content"]
    )
    assert last["content"][-1] == {"type": "text", "text": "Thanks, and Q2?"}


async def test_results_without_media_go_back_as_before(
    anthropic_provider: Provider, chat_provider: Provider, replay: ReplayServer
) -> None:
    """Text blocks only, or a value that merely looks like a block, stay JSON text; an image block
    whose data is not base64 becomes a placeholder saying so, never pasted."""
    not_base64 = [{"type": "image", "data": "not base64 !", "mimeType": "image/png"}]
    cases: list[tuple[Any, str]] = [
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], ""),
        ({"type": "image"}, ""),
        (not_base64, "[image/png image 1: not valid base64, not sent]"),
    ]
    for output, placeholder in cases:
        chunks: list[base.ModelChunk] = [base.ToolInputStart("c1", "t"), base.ToolCall("c1", "t", {}, "{}")]
        stored = Stored().step(chunks, {"c1": output}).build()
        replay.enqueue(Reply.sse(a_text_stream("ok")), Reply.sse(c_text_stream("ok")))
        for provider in (anthropic_provider, chat_provider):
            async for _ in provider.stream(request(user("q"), stored)):
                pass
        anthropic_body, chat_body = (r.json for r in replay.requests[-2:])
        blocks = [
            b for m in anthropic_body["messages"] if isinstance(m["content"], list) for b in m["content"]
        ]
        (result,) = [b for b in blocks if b["type"] == "tool_result"]
        tool_message = chat_body["messages"][-1]
        if placeholder:
            assert result["content"] == [{"type": "text", "text": placeholder}]
            assert tool_message["content"] == placeholder
        else:
            assert result["content"] == tool_message["content"] == orjson.dumps(output).decode()
