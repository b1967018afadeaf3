"""Tool sources in other processes: configuration errors, precedence in the ToolSet, MCP outputs.

docs/tools.md; docs/semantics.md §2 (a later source overrides an earlier tool of the same name).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE
from mcp_types import CallToolResult, ImageContent, TextContent

from turnwire.tools import Tool, ToolError, ToolExecution
from turnwire.values import dumps
from turnwire_server.assembly import StartupError, open_tools
from turnwire_server.config import ConfigError, load_settings
from turnwire_server.tools.listing import listing_problem
from turnwire_server.tools.loading import ApprovalRequired
from turnwire_server.tools.mcp_server import output_of, sse_event_limit
from turnwire_server.tools.tool_set import ToolSet


def _config_error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "turnwire.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    return str(caught.value)


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        (
            "{mcp: [{name: a, command: x, url: 'http://h/mcp'}]}",
            "tools.mcp.0: give exactly one of",
        ),
        ("{mcp: [{name: a}]}", "give exactly one of command (stdio) or url"),
        (
            "{mcp: [{name: a, url: 'ftp://h'}]}",
            "tools.mcp.0.url: 'ftp://h' is not an http(s) URL with a host",
        ),
        ("{mcp: [{name: a, url: 'http://h/mcp', args: [x]}]}", "args, env and cwd are for a stdio server"),
        ("{hosts: [{name: 'a b', address: 'h:1'}]}", "tools.hosts.0.name: must be 1-64"),
        ("{hosts: [{name: a}]}", "tools.hosts.0.address: Field required"),
        (
            "{hosts: [{name: a, address: 'h:1', tls: {cert_file: c.pem}}]}",
            "cert_file and key_file go together",
        ),
        ("{hosts: [{name: a, address: 'h:1', timeout_seconds: 0}]}", "tools.hosts.0.timeout_seconds"),
        ("{hosts: [{name: a, address: 'h:1'}], mcp: [{name: a, command: x}]}", "repeated: a"),
        ("{hosts: [{name: a, adress: 'h:1'}]}", "tools.hosts.0.adress: unknown field"),
    ],
)
def test_invalid_source_entries_name_the_field(tmp_path: Path, tools: str, expected: str) -> None:
    assert expected in _config_error(tmp_path, f"tools: {tools}\n")


async def test_a_require_approval_name_no_source_lists_stops_start_up() -> None:
    settings = load_settings(None, tools={"require_approval": ["nope"]})
    with pytest.raises(StartupError, match=r"require_approval names 'nope', which is no loaded tool"):
        await open_tools(settings)


async def test_an_unreachable_host_does_not_stop_start_up_and_lends_its_require_approval_name(
    tmp_path: Path,
) -> None:
    settings = load_settings(
        None,
        tools={
            "hosts": [{"name": "gone", "address": "127.0.0.1:1", "startup_timeout_seconds": 1}],
            "require_approval": ["later"],
        },
    )
    tools = await open_tools(settings)
    try:
        assert "get_weather" in tools and "later" not in tools
    finally:
        await tools.aclose()


async def test_an_unreadable_tls_file_stops_start_up(tmp_path: Path) -> None:
    tls = {"ca_file": str(tmp_path / "missing.pem")}
    settings = load_settings(None, tools={"hosts": [{"name": "h", "address": "127.0.0.1:1", "tls": tls}]})
    with pytest.raises(StartupError, match=r"tools.hosts: 'h': tls.ca_file: cannot read"):
        await open_tools(settings)


class _Named:
    def __init__(self, name: str, origin: str) -> None:
        self.name, self.description, self.origin = name, origin, origin
        self.input_schema: Mapping[str, Any] = {"type": "object"}

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any:
        return self.origin


class _Source:
    kind = "tool host"

    def __init__(self, name: str, *tools: str) -> None:
        self.name = name
        self.tools: dict[str, Tool] = {tool: _Named(tool, name) for tool in tools}

    async def start(self) -> bool:
        return True

    async def aclose(self) -> None:
        return None


def test_later_sources_override_earlier_ones_and_require_approval_applies_to_all() -> None:
    tool_set = ToolSet({"a": _Named("a", "local"), "b": _Named("b", "local")}, require_approval=["c"])
    first, second = _Source("first", "b", "c"), _Source("second", "c", "d")
    tool_set.sources.extend([first, second])
    tool_set.refresh()
    assert [getattr(tool_set[name], "origin", None) for name in ("a", "b", "d")] == [
        "local",
        "first",
        "second",
    ]
    assert getattr(tool_set["c"], "needs_approval", False) is True
    approved = tool_set["c"]
    assert isinstance(approved, ApprovalRequired) and isinstance(approved.tool, _Named)
    assert approved.tool.origin == "second"
    second.tools.pop("c")  # re-listed without it: the earlier source's tool shows again
    tool_set.refresh()
    approved = tool_set["c"]
    assert isinstance(approved, ApprovalRequired) and isinstance(approved.tool, _Named)
    assert approved.tool.origin == "first"


def test_listed_tools_need_provider_valid_names_and_object_schemas() -> None:
    assert listing_problem("ok_name-1", {"type": "object"}) is None
    assert "is not 1-64 of" in str(listing_problem("has.dot", {"type": "object"}))
    assert "must be a JSON Schema of an object" in str(listing_problem("x", {"type": "string"}))


def test_mcp_results_become_tool_outputs() -> None:
    text = TextContent(type="text", text="plain")
    assert output_of(CallToolResult(content=[text]), "t", "s") == "plain"
    assert output_of(CallToolResult(content=[text], structured_content={"n": 2**70}), "t", "s") == {
        "n": 2**70
    }
    image = ImageContent(type="image", data="AAAA", mime_type="image/png")
    blocks = output_of(CallToolResult(content=[text, image]), "t", "s")
    assert blocks == [
        {"type": "text", "text": "plain"},
        {"type": "image", "data": "AAAA", "mimeType": "image/png"},
    ]
    with pytest.raises(ToolError, match=r"^boom$"):
        output_of(CallToolResult(content=[TextContent(type="text", text="boom")], is_error=True), "t", "s")
    with pytest.raises(ToolError, match="tool 't' failed"):
        output_of(CallToolResult(content=[], is_error=True), "t", "s")


def test_the_sse_event_limit_holds_any_result_the_sidecar_would_keep() -> None:
    """A result comes in one SSE event as a text block (the output's JSON, escaped once more) and as
    ``structuredContent``: at the bounds of ``limits.max_tool_output_bytes``, with every character
    needing an escape, it still fits; never below the SDK's 1 MiB."""
    for limit in (1024, 1 << 20, 3 << 20):
        output = {"k": '"' * (limit // 2 - 8)}
        text = dumps(output)
        assert limit - 32 <= len(text.encode()) <= limit
        result = CallToolResult(content=[TextContent(type="text", text=text)], structured_content=output)
        event = f"event: message\ndata: {result.model_dump_json(by_alias=True, exclude_none=True)}\n\n"
        assert len(event.encode()) <= sse_event_limit(limit)
    assert sse_event_limit(1024) == DEFAULT_MAX_SSE_EVENT_SIZE
