"""Issue 31 (sources, files, MCP content) end to end: a real ``turnwire serve`` on the official SDKs,
pointed at a replay server speaking each API's wire format, with an MCP server process.

For every ``cases_extra/sse/parts_*`` stream: the client's events carry each source and file, the
stored message (``GetConversation``) is what the turn ended with, with each source's cited text part
marked by its block id, the hooks (``on_step_finish``, ``on_chat_response``) got the same, and the
next request to the API is valid and pastes no file into text. For an MCP tool that returns an image,
audio and resources (``cases_extra/mcp/tool_result_media.json``): the next request of each API carries
them as that API's own content.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from providers.helpers import (
    a_block,
    a_end,
    a_start,
    a_stop,
    a_text_stream,
    anthropic_sse,
    c_call,
    c_chunk,
    c_text_stream,
    chat_sse,
    r_response,
    r_text_stream,
    responses_sse,
)
from providers.replay import ReplayServer, Reply
from support.hooks import pythonpath_env
from support.sidecar import SidecarProcess, running_sidecar

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import message_pb2

PROVIDERS = Path(__file__).resolve().parents[1] / "providers" / "cases_extra"
CASE_NAMES = sorted(path.name.removesuffix(".sse") for path in (PROVIDERS / "sse").glob("parts_*.sse"))
MEDIA = json.loads((PROVIDERS / "mcp" / "tool_result_media.json").read_text())
MCP_SERVER = Path(__file__).resolve().parents[1] / "support" / "mcp_tools.py"
MODELS = {
    "anthropic": "anthropic:claude-test",
    "openai": "openai:gpt-test",
    "openai-responses": "responses:gpt-test",
}
NEXT = {"anthropic": a_text_stream, "openai": c_text_stream, "openai-responses": r_text_stream}
BASE64_RUN = re.compile(rb"[A-Za-z0-9+/]{200,}")
_ids = itertools.count(1)


@pytest.fixture(scope="module")
def replay() -> Iterator[ReplayServer]:
    with ReplayServer() as server:
        yield server


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("parts-hooks") / "hooks.jsonl"


@pytest.fixture(scope="module")
def sidecar(
    tmp_path_factory: pytest.TempPathFactory, replay: ReplayServer, record: Path
) -> Iterator[SidecarProcess]:
    sdk = {"api_key_env": "E2E_PARTS_KEY", "max_retries": 0, "timeout_seconds": 10}
    config = {
        "default_model": MODELS["anthropic"],
        "providers": {
            "anthropic": {"type": "anthropic", "base_url": replay.url, **sdk},
            "openai": {"type": "openai", "base_url": f"{replay.url}/v1", **sdk},
            "responses": {"type": "openai-responses", "base_url": f"{replay.url}/v1", **sdk},
        },
        "tools": {
            "demo": False,
            "mcp": [
                {
                    "name": "reports",
                    "command": sys.executable,
                    "args": [str(MCP_SERVER), str(record) + ".mcp"],
                }
            ],
        },
        "middleware": [{"path": "support.hooks:RecordParts", "options": {"path": str(record)}}],
    }
    env = {"E2E_PARTS_KEY": "sk-dummy", **pythonpath_env()}
    with running_sidecar(tmp_path_factory.mktemp("parts-e2e"), config, env) as process:
        yield process


def _queue(replay: ReplayServer, *streams: bytes) -> None:
    replay.replies.clear()
    replay.requests.clear()
    replay.enqueue(*(Reply.sse(stream) for stream in streams))


def _hook_lines(record: Path, request_id: str) -> dict[str, list[dict[str, Any]]]:
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    out: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        if line["request_id"] == request_id:
            out.setdefault(line["hook"], []).append(line)
    return out


@pytest.mark.parametrize("name", CASE_NAMES)
async def test_sources_and_files_reach_the_client_the_store_the_hooks(
    name: str, sidecar: SidecarProcess, replay: ReplayServer, record: Path
) -> None:
    case = json.loads((PROVIDERS / "sse" / f"{name}.expected.json").read_text())
    adapter = case["adapter"]
    _queue(replay, (PROVIDERS / "sse" / f"{name}.sse").read_bytes(), NEXT[adapter]("ok"))
    conversation = f"parts-{next(_ids)}"
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(client.chat(conversation, "Tell me about it.", model=MODELS[adapter]))
        stored = await client.get_conversation(conversation)
        later = await collect(client.chat(conversation, "Thanks.", model=MODELS[adapter]))
    assert result.ok and later.ok, (result.error, later.error, sidecar.log_text())
    reply = stored.messages[-1]
    assert reply == result.message
    assert result.text == case["expected"]["text"]

    # Events: one per source and file, the same as the stored parts.
    sources = [p.source for p in reply.parts if p.WhichOneof("kind") == "source"]
    files = [p.file for p in reply.parts if p.WhichOneof("kind") == "file"]
    assert [e.source for e in result.events if e.WhichOneof("event") == "source"] == sources
    assert [e.file for e in result.events if e.WhichOneof("event") == "file"] == files
    want = case["expected"]
    assert [s.cited_text for s in sources] == [s["cited_text"] for s in want["sources"]]
    assert [s.url for s in sources] == [s["url"] for s in want["sources"]]
    texts = {p.text.id: p.text.text for p in reply.parts if p.WhichOneof("kind") == "text" and p.text.id}
    assert [texts.get(s.text_id) for s in sources] == [s["text"] for s in want["sources"]]
    assert [(f.media_type, f.size_bytes, f.provider_file_id) for f in files] == [
        (f["media_type"], f["size_bytes"], f["provider_file_id"]) for f in want["files"]
    ]

    # The Python client's plain views.
    assert [(s.cited_text, s.text) for s in result.sources] == [
        (s["cited_text"], s["text"]) for s in want["sources"]
    ]
    assert [f.size_bytes for f in result.files] == [f["size_bytes"] for f in want["files"]]

    # The hooks got the same sources and files.
    hooks = _hook_lines(record, result.request_id)
    as_dicts = [json_format.MessageToDict(s) for s in sources]
    file_dicts = [json_format.MessageToDict(f) for f in files]
    (step,) = hooks["on_step_finish"]
    (response,) = hooks["on_chat_response"]
    assert step["sources"] == response["sources"] == as_dicts
    assert step["files"] == response["files"] == file_dicts

    # The next request: valid for the API, and no file's bytes as text.
    sent = replay.requests[1].body
    assert b"Thanks." in sent
    for file in files:
        if file.data:
            assert base64.b64encode(file.data)[:60] not in sent


def _tool_call_stream(adapter: str) -> bytes:
    """A step of ``adapter`` that calls the MCP tool ``sales_chart`` with no input."""
    if adapter == "anthropic":
        use = {"type": "tool_use", "id": "toolu_01ChartA", "name": "sales_chart", "input": {}}
        return anthropic_sse(a_start(), a_block(0, use), a_stop(0), *a_end("tool_use"))
    if adapter == "openai":
        call = c_call(0, "call_chart_c", "sales_chart", "{}")
        return chat_sse(c_chunk({"role": "assistant", "tool_calls": [call]}), c_chunk({}, "tool_calls"))
    item = {
        "id": "fc_1",
        "type": "function_call",
        "call_id": "call_chart_r",
        "name": "sales_chart",
        "arguments": "",
    }
    return responses_sse(
        {"type": "response.created", "response": r_response()},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {
            "type": "response.function_call_arguments.delta",
            "output_index": 0,
            "item_id": "fc_1",
            "delta": "{}",
        },
        {"type": "response.output_item.done", "output_index": 0, "item": {**item, "arguments": "{}"}},
        {"type": "response.completed", "response": r_response("completed")},
    )


@pytest.mark.parametrize("adapter", ["anthropic", "openai", "openai-responses"])
async def test_mcp_media_go_back_to_each_api_as_its_own_content(
    adapter: str, sidecar: SidecarProcess, replay: ReplayServer
) -> None:
    _queue(replay, _tool_call_stream(adapter), NEXT[adapter]("A red square."))
    conversation = f"mcp-media-{next(_ids)}"
    async with TurnwireClient(sidecar.target) as client:
        result = await collect(
            client.chat(conversation, "Show me the Q3 sales chart.", model=MODELS[adapter])
        )
        stored = await client.get_conversation(conversation)
    assert result.ok, (result.error, sidecar.log_text())
    (call,) = [p.tool_call for p in stored.messages[-1].parts if p.WhichOneof("kind") == "tool_call"]
    assert call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE, call
    # Stored as the server gave it.
    assert json.loads(call.output_json) == MEDIA["mcp_response"]["result"]["content"]

    body = replay.requests[1].json
    expected = MEDIA["expected"]
    if adapter == "anthropic":
        blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
        (tool_result,) = [b for b in blocks if b["type"] == "tool_result"]
        assert tool_result["content"] == expected["anthropic_tool_result_content"]
    elif adapter == "openai-responses":
        (output,) = [i for i in body["input"] if i.get("type") == "function_call_output"]
        assert output["output"] == expected["responses_function_call_output"]
    else:
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "tool", "user"]
        assert body["messages"][3]["content"] == expected["chat_tool_content"]
        assert body["messages"][4]["content"] == expected["chat_user_content"]
        assert not BASE64_RUN.search(body["messages"][3]["content"].encode())
