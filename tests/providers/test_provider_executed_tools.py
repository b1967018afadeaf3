"""Issue 31a: tools the provider runs itself, and Responses built-ins the application runs.

Streams in each API's real wire format (tests/providers/cases_extra/sse) are replayed through the
official SDKs (tests/providers/replay.py); the message the engine would store (``Stored``) is then
sent back and the next request checked against the API's rules. Sources: Anthropic server tools
(https://platform.claude.com/docs/en/agents-and-tools/tool-use/web-search-tool, ``web-fetch-tool``,
``code-execution-tool``, ``mcp-connector``, ``tool-search-tool``) and the Responses output items of
the ``openai`` SDK (``types/responses/response_output_item.py``,
``response_input_item_param.py``; https://platform.openai.com/docs/guides/tools).
"""

from __future__ import annotations

from pathlib import Path

from providers.helpers import Stored, a_blocks, collect, request, user
from providers.replay import ReplayServer, Reply
from turnwire import types as base
from turnwire.types import ModelSettings
from turnwire.values import dumps, loads
from turnwire_client.v1 import message_pb2
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.openai_chat import OpenAIChatProvider
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider

EXTRA = Path(__file__).resolve().parent / "cases_extra" / "sse"
SEARCH_ID, FETCH_ID = "srvtoolu_01WsQ8rT5yU2iO9pA3sD6fG1", "srvtoolu_01WfH4jK7lZ0xC3vB6nM9qW2"
MCP_ID, CODE_ID = "mcptoolu_01Mc5vB8nM1qW4eR7tY0uI3o", "srvtoolu_01Ce2xZ5cV8bN1mQ4wE7rT0y"
TOOL_SEARCH_ID = "srvtoolu_01Ts9oP2aS5dF8gH1jK4lZ7x"


def _case(name: str) -> Reply:
    return Reply.sse((EXTRA / name).read_bytes())


def _calls(message: message_pb2.Message) -> list[message_pb2.ToolCallPart]:
    return [p.tool_call for p in message.parts if p.WhichOneof("kind") == "tool_call"]


async def test_anthropic_server_tools_are_provider_executed_calls_with_their_results(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    replay.enqueue(_case("anthropic_web_search_and_fetch_results.sse"))
    result = await collect(anthropic_provider, request(user("What changed in example-lib 3.2?")))

    assert not result.calls, "a server tool is never the application's call"
    assert [(c.tool_call_id, c.tool_name, c.input) for c in result.executed] == [
        (SEARCH_ID, "web_search", {"query": "example-lib 3.2 changelog"}),
        (FETCH_ID, "web_fetch", {"url": "https://example.org/example-lib/changelog"}),
    ]
    starts = [c for c in result.of(base.ToolInputStart) if c.provider_executed]
    assert [c.tool_call_id for c in starts] == [SEARCH_ID, FETCH_ID]
    deltas = "".join(c.delta for c in result.of(base.ToolInputDelta) if c.tool_call_id == SEARCH_ID)
    assert loads(deltas) == {"query": "example-lib 3.2 changelog"}, "a server call's input streams"
    search, fetch = result.of(base.ToolResult)
    assert search.tool_call_id == SEARCH_ID and search.error is None
    assert search.output[0]["url"] == "https://example.org/example-lib/changelog"
    assert fetch.output["content"]["source"]["data"].startswith("3.2: streaming export")
    assert result.finish.finish_reason == "stop"

    stored = Stored().step(result.chunks).build()
    calls = _calls(stored)
    assert [(c.provider_executed, c.state) for c in calls] == [
        (True, message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE)
    ] * 2
    assert loads(calls[0].output_json)[0]["encrypted_content"].startswith("EpMCCioIAhgB")

    # The next request: both pairs go back in place, as the API gave them.
    replay.enqueue(_case("anthropic_pause_turn_continued.sse"))
    await collect(anthropic_provider, request(user("What changed?"), stored, user("And 3.1?")))
    turn = replay.requests[1].json["messages"][1]
    blocks = a_blocks(turn)
    assert [b["type"] for b in blocks] == [
        "text",
        "server_tool_use",
        "web_search_tool_result",
        "server_tool_use",
        "web_fetch_tool_result",
        "text",
    ]
    assert blocks[1] == {
        "type": "server_tool_use",
        "id": SEARCH_ID,
        "name": "web_search",
        "input": {"query": "example-lib 3.2 changelog"},
    }
    given = [
        event["content_block"]
        for line in (EXTRA / "anthropic_web_search_and_fetch_results.sse").read_text().splitlines()
        if line.startswith("data: ") and (event := loads(line[6:]))["type"] == "content_block_start"
    ]
    assert [blocks[2], blocks[4]] == [given[2], given[4]], "the result blocks go back as they came"


async def test_anthropic_mcp_code_execution_errors_and_tool_search(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider
) -> None:
    replay.enqueue(_case("anthropic_mcp_code_execution_error_tool_search.sse"))
    result = await collect(anthropic_provider, request(user("Is #4211 fixed?")))

    assert [(c.tool_name, c.input) for c in result.executed] == [
        ("get_issue", {"number": 4211}),
        ("bash_code_execution", {"command": "python export_bench.py"}),
        ("tool_search_tool_regex", {"pattern": "export"}),
    ]
    mcp, code, search = result.of(base.ToolResult)
    assert mcp.error is None and mcp.output == [
        {"type": "text", "text": "#4211 Export stalls on large files (open)"}
    ]
    assert code.error == "execution_time_exceeded"
    assert search.output["tool_references"] == [{"type": "tool_reference", "tool_name": "export_file"}]

    stored = Stored().step(result.chunks).build()
    states = [c.state for c in _calls(stored)]
    assert states == [
        message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
        message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
        message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
    ]
    replay.enqueue(_case("anthropic_pause_turn_continued.sse"))
    await collect(anthropic_provider, request(user("Is #4211 fixed?"), stored, user("Thanks.")))
    blocks = a_blocks(replay.requests[1].json["messages"][1])
    assert [b["type"] for b in blocks] == [
        "mcp_tool_use",
        "mcp_tool_result",
        "server_tool_use",
        "bash_code_execution_tool_result",
        "server_tool_use",
        "tool_search_tool_result",
        "text",
    ]
    assert blocks[0]["server_name"] == "tracker" and blocks[0]["input"] == {"number": 4211}
    assert blocks[3]["content"] == {
        "type": "bash_code_execution_tool_result_error",
        "error_code": "execution_time_exceeded",
    }
    assert not any(
        b["type"] == "tool_result" for t in replay.requests[1].json["messages"] for b in a_blocks(t)
    )


async def test_anthropic_provider_executed_calls_are_not_sent_to_openai(
    replay: ReplayServer, anthropic_provider: AnthropicMessagesProvider, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(_case("anthropic_web_search_and_fetch_results.sse"))
    result = await collect(anthropic_provider, request(user("What changed?")))
    stored = Stored().step(result.chunks).build()
    replay.enqueue(
        Reply.sse(b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n')
    )
    await collect(chat_provider, request(user("What changed?"), stored, user("More?")))
    raw = replay.requests[1].body
    assert SEARCH_ID.encode() not in raw and b"web_search" not in raw
    assert b"Version 3.2 adds streaming export." in raw


async def test_responses_built_ins_are_provider_executed_calls(
    replay: ReplayServer, responses_provider: OpenAIResponsesProvider
) -> None:
    replay.enqueue(_case("openai_responses_built_in_tools.sse"))
    result = await collect(responses_provider, request(user("How large can an export be?")))

    assert not result.calls
    assert [(c.tool_call_id, c.tool_name, c.input) for c in result.executed] == [
        ("ws_0aB1", "web_search", {"action": {"type": "search", "query": "example-lib 3.2 changelog"}}),
        ("fs_0cD2", "file_search", {"queries": ["export limits"]}),
        ("ci_0eF3", "code_interpreter", {"code": "print(2**10)", "container_id": "cntr_0gH4"}),
        ("mcp_0iJ5", "get_issue", {"number": 4211}),
        ("ig_0kL6", "image_generation", {}),
    ]
    outputs = {r.tool_call_id: r.output for r in result.of(base.ToolResult)}
    assert outputs["fs_0cD2"]["results"][0]["text"] == "Exports stop at 2 GiB."
    assert outputs["ci_0eF3"]["outputs"] == [{"type": "logs", "logs": "1024\n"}]
    assert outputs["mcp_0iJ5"] == "#4211 Export stalls on large files (open)"
    assert "result" not in outputs["ig_0kL6"], "the image is a file part, not the call's result"
    assert outputs["ig_0kL6"]["revised_prompt"] == "A bar chart of export times"
    assert result.finish.finish_reason == "stop", "OpenAI ran them: nothing for the application to do"
    metadata = result.finish.provider_metadata
    assert metadata is not None
    assert metadata["openai"]["phases"] == [{"item_id": "msg_0mN7", "phase": "final_answer"}]
    assert metadata["openai"]["logprobs"] == [{"token": "Exports", "logprob": -0.01, "top_logprobs": []}]

    stored = Stored().step(result.chunks).build()
    assert all(c.provider_executed for c in _calls(stored))

    # store false (the default): the API cannot resolve them, so they stay out, with a warning.
    replay.enqueue(_case("openai_responses_built_in_tools.sse"))
    second = await collect(responses_provider, request(user("How large?"), stored, user("Why?")))
    items = replay.requests[1].json["input"]
    assert [i.get("type", i.get("role")) for i in items] == ["user", "assistant", "user"]
    assert any("not sent back when store is false" in w for w in second.finish.warnings)

    # store true: by reference, in place.
    replay.enqueue(_case("openai_responses_built_in_tools.sse"))
    stored_options = ModelSettings(provider_options={"openai-responses": {"store": True}})
    await collect(
        responses_provider, request(user("How large?"), stored, user("Why?"), settings=stored_options)
    )
    items = replay.requests[2].json["input"]
    assert [i.get("id") for i in items if i.get("type") == "item_reference"] == [
        "ws_0aB1",
        "fs_0cD2",
        "ci_0eF3",
        "mcp_0iJ5",
        "ig_0kL6",
    ]


async def test_responses_client_run_built_ins_are_calls_the_application_answers(
    replay: ReplayServer, responses_provider: OpenAIResponsesProvider
) -> None:
    replay.enqueue(_case("openai_responses_client_run_built_ins.sse"))
    result = await collect(responses_provider, request(user("Raise the export chunk size.")))

    assert not result.executed
    assert [(c.tool_call_id, c.tool_name, c.client_executed) for c in result.calls] == [
        ("call_Sh1x", "shell", True),
        ("call_Ls2y", "local_shell", True),
        ("call_Ap3z", "apply_patch", True),
        ("call_Ct4w", "sql", True),
    ]
    assert result.calls[0].input == {
        "action": {"commands": ["ls -1 src"], "timeout_ms": 10000, "max_output_length": 4096}
    }
    assert result.calls[3].input == {"input": "SELECT count(*) FROM exports"}
    assert result.finish.finish_reason == "tool-calls", "not a silent stop"

    answers = {
        "call_Sh1x": "export.py\nimport.py\n",
        "call_Ls2y": "On branch main",
        "call_Ap3z": "Done",
        "call_Ct4w": {"count": 12},
    }
    stored = Stored().step(result.chunks, answers).build()
    replay.enqueue(_case("openai_responses_client_run_built_ins.sse"))
    await collect(responses_provider, request(user("Raise it."), stored))
    items = replay.requests[1].json["input"][1:]
    assert items == [
        {
            "type": "shell_call",
            "call_id": "call_Sh1x",
            "action": {"commands": ["ls -1 src"], "timeout_ms": 10000, "max_output_length": 4096},
            "status": "completed",
        },
        {
            "type": "local_shell_call",
            "id": "lsh_0bB2",
            "call_id": "call_Ls2y",
            "action": {"type": "exec", "command": ["git", "status"], "env": {}, "timeout_ms": 5000},
            "status": "completed",
        },
        {
            "type": "apply_patch_call",
            "call_id": "call_Ap3z",
            "operation": {
                "type": "update_file",
                "path": "src/export.py",
                "diff": "@@\n-CHUNK = 1\n+CHUNK = 64\n",
            },
            "status": "completed",
        },
        {
            "type": "custom_tool_call",
            "call_id": "call_Ct4w",
            "name": "sql",
            "input": "SELECT count(*) FROM exports",
        },
        {
            "type": "shell_call_output",
            "call_id": "call_Sh1x",
            "output": [
                {
                    "stdout": "export.py\nimport.py\n",
                    "stderr": "",
                    "outcome": {"type": "exit", "exit_code": 0},
                }
            ],
        },
        {"type": "local_shell_call_output", "id": "call_Ls2y", "output": "On branch main"},
        {"type": "apply_patch_call_output", "call_id": "call_Ap3z", "status": "completed", "output": "Done"},
        {"type": "custom_tool_call_output", "call_id": "call_Ct4w", "output": '{"count":12}'},
    ]


async def test_client_run_built_ins_go_to_other_apis_as_function_calls(
    replay: ReplayServer, responses_provider: OpenAIResponsesProvider, chat_provider: OpenAIChatProvider
) -> None:
    replay.enqueue(_case("openai_responses_client_run_built_ins.sse"))
    result = await collect(responses_provider, request(user("Raise it.")))
    stored = Stored().step(result.chunks, {c.tool_call_id: "ok" for c in result.calls}).build()
    replay.enqueue(
        Reply.sse(b'data: {"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"stop"}]}\n\n')
    )
    await collect(chat_provider, request(user("Raise it."), stored))
    messages = replay.requests[1].json["messages"]
    calls = messages[-5]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["shell", "local_shell", "apply_patch", "sql"]
    assert [m["role"] for m in messages[-4:]] == ["tool"] * 4


async def test_chat_logprobs_asked_for_are_kept_in_the_steps_metadata(
    replay: ReplayServer, chat_provider: OpenAIChatProvider
) -> None:
    """``logprobs: true`` (https://platform.openai.com/docs/api-reference/chat/create#logprobs): each
    chunk's ``choices[0].logprobs.content`` is kept, in order, under ``openai.logprobs``."""

    def chunk(content: str, token: float, finish: str | None = None) -> bytes:
        logprobs = {"content": [{"token": content, "logprob": token, "bytes": list(content.encode())}]}
        choice = {"index": 0, "delta": {"content": content}, "logprobs": logprobs, "finish_reason": finish}
        body = {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "gpt-4.1",
            "choices": [choice],
        }
        return b"data: " + dumps(body).encode() + b"\n\n"

    replay.enqueue(Reply.sse(chunk("Hi", -0.1) + chunk(" there", -0.7, "stop") + b"data: [DONE]\n\n"))
    options = ModelSettings(provider_options={"openai": {"logprobs": True}})
    result = await collect(chat_provider, request(user("hi"), settings=options))
    assert replay.requests[0].json["logprobs"] is True
    metadata = result.finish.provider_metadata
    assert metadata is not None
    assert [(p["token"], p["logprob"]) for p in metadata["openai"]["logprobs"]] == [
        ("Hi", -0.1),
        (" there", -0.7),
    ]
