"""MCP tool servers through a real ``turnwire serve``: stdio and streamable HTTP.

The server is ``tests/support/mcp_tools.py`` (the ``mcp`` SDK's ``MCPServer``). docs/tools.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from support.sidecar import SidecarFactory, SidecarProcess, free_port
from support.waiting import wait_until

from turnwire_client import TurnResult, TurnwireClient, collect
from turnwire_server.engine.ids import tool_idempotency_key

SERVER = Path(__file__).parent.parent / "support" / "mcp_tools.py"
A, B = 123456789012345678901234567890, 9007199254740993

SCRIPTS: dict[str, Any] = {
    name: [{"tool_calls": [call]}, {"text": "after"}]
    for name, call in {
        "big": {"name": "add_big", "raw_input": f'{{"a": {A}, "b": {B}}}'},
        "refuse": {"name": "refuse", "input": {"reason": "not today"}},
        "wait": {"name": "wait"},
        "exit": {"name": "exit_now"},
        "pid": {"name": "pid"},
        "key": {"name": "idempotency_key"},
    }.items()
}


def config(entry: dict[str, Any]) -> dict[str, Any]:
    return {"providers": {"scripted": {"scripts": SCRIPTS}}, "tools": {"mcp": [{"name": "tiny", **entry}]}}


def stdio(record: Path) -> dict[str, Any]:
    return {"command": sys.executable, "args": [str(SERVER), str(record)]}


async def chat(sidecar: SidecarProcess, script: str, conversation: str = "c") -> TurnResult:
    async with TurnwireClient(sidecar.target) as client:
        return await collect(client.chat(conversation, "go", model=f"scripted:{script}"))


def final_outputs(result: TurnResult) -> list[str]:
    return [
        e.tool_output_available.output_json
        for e in result.events
        if e.WhichOneof("event") == "tool_output_available" and not e.tool_output_available.preliminary
    ]


def errors(result: TurnResult) -> list[str]:
    return [
        e.tool_output_error.error_text for e in result.events if e.WhichOneof("event") == "tool_output_error"
    ]


async def test_stdio_tools_are_listed_and_called_and_is_error_is_a_tool_error(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sidecar_factory(config(stdio(tmp_path / "record"))).start()
    result = await chat(sidecar, "big")
    assert result.ok and result.text == "after"
    assert final_outputs(result) == [f'{{"sum":{A + B}}}']  # exact both ways
    refused = await chat(sidecar, "refuse", conversation="refuse")
    assert refused.ok and refused.text == "after"
    (error,) = errors(refused)
    assert "not today" in error


async def test_the_calls_idempotency_key_reaches_the_mcp_server_in_meta(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sidecar_factory(config(stdio(tmp_path / "record"))).start()
    result = await chat(sidecar, "key", conversation="keyed")
    assert result.ok, result.error
    (call,) = [
        e.tool_input_available for e in result.events if e.WhichOneof("event") == "tool_input_available"
    ]
    (output,) = final_outputs(result)
    assert result.message is not None
    assert json.loads(output) == {
        "result": tool_idempotency_key("keyed", result.message.id, call.tool_call_id)
    }


async def test_cancelling_the_turn_cancels_the_mcp_call(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    record = tmp_path / "record"
    sidecar = await sidecar_factory(config(stdio(record))).start()
    async with TurnwireClient(sidecar.target) as client:
        stream = client.chat("c", "go", model="scripted:wait")
        async for event in stream:
            if event.WhichOneof("event") == "tool_input_available":
                await wait_until(
                    lambda: record.exists() and "started" in record.read_text(), what="the call runs"
                )
                assert stream.cancel()
                break
    await wait_until(lambda: "cancelled" in record.read_text(), what="the MCP server cancelled the handler")


async def test_a_stdio_server_that_dies_gives_a_tool_error_and_is_started_again(
    sidecar_factory: SidecarFactory, tmp_path: Path
) -> None:
    sidecar = await sidecar_factory(config(stdio(tmp_path / "record"))).start()
    first_pid = json.loads(final_outputs(await chat(sidecar, "pid"))[0])
    died = await chat(sidecar, "exit", conversation="exit")
    assert died.ok and died.text == "after"  # the turn went on
    (error,) = errors(died)
    assert "MCP server 'tiny'" in error

    async def new_pid() -> Any:
        outputs = final_outputs(await chat(sidecar, "pid", conversation="again"))
        return outputs and json.loads(outputs[0]) != first_pid

    await wait_until(new_pid, timeout=20, interval=0.2, what="the MCP server runs again in a new process")


@pytest.fixture
def http_server_url(tmp_path: Path) -> Iterator[str]:
    """The URL of the test MCP server run over streamable HTTP (killed at teardown)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, str(SERVER), str(tmp_path / "record"), "--http", str(port)])
    try:
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        server.kill()
        server.wait()


async def test_streamable_http_tools_are_listed_and_called(
    sidecar_factory: SidecarFactory, http_server_url: str
) -> None:
    async def up() -> bool:
        try:
            async with httpx2.AsyncClient() as http:
                await http.get(http_server_url, timeout=1)
        except httpx2.TransportError:
            return False
        return True

    await wait_until(up, timeout=20, interval=0.1, what="the MCP HTTP server listens")
    sidecar = await sidecar_factory(config({"url": http_server_url, "headers": {"X-Test": "1"}})).start()
    result = await chat(sidecar, "big")
    assert final_outputs(result) == [f'{{"sum":{A + B}}}']
