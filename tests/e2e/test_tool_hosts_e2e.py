"""Tool hosts (ToolExecutorService) through a real ``turnwire serve`` and a real host process.

docs/tools.md; docs/semantics.md §2 (precedence), §3 (streaming tools), §5 (cancellation,
nesting), §6 (approvals), §11 (exact values). The host is ``tests/support/tool_host.py``; it
records what its handlers saw (started, finished, cancelled, the parent request id).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from support.sidecar import SidecarFactory, SidecarProcess, free_port
from support.tool_host import ToolHostProcess
from support.waiting import wait_until

from turnwire_client import TurnResult, TurnwireClient, collect
from turnwire_server.engine.ids import tool_idempotency_key

A, B = 123456789012345678901234567890, 9007199254740993  # past 2**64 and 2**53

SCRIPTS: dict[str, Any] = {
    name: [{"tool_calls": [call]}, {"text": "after"}]
    for name, call in {
        "big": {"name": "add_big", "raw_input": f'{{"a": {A}, "b": {B}}}'},
        "count": {"name": "count", "input": {"to": 3}},
        "wait": {"name": "wait"},
        "deadline": {"name": "quick_deadline"},
        "fail": {"name": "fail", "input": {"reason": "no luck today"}},
        "weather": {"name": "get_weather", "input": {"city": "Oslo"}},
        "guarded": {"name": "guarded"},
        "callback": {"name": "callback", "input": {"conversation_id": "nested"}},
        "again": {"name": "added_after_restart"},
    }.items()
}


def config(*hosts: str, **tools: Any) -> dict[str, Any]:
    """A sidecar config with the test scripts and ``hosts`` (addresses) as tool hosts."""
    entries = [{"name": f"host{index}", "address": address} for index, address in enumerate(hosts)]
    return {
        "providers": {"scripted": {"scripts": SCRIPTS}},
        "tools": {"hosts": entries, **tools},
    }


@pytest.fixture
async def hosts(tmp_path: Path) -> AsyncIterator[Callable[..., ToolHostProcess]]:
    """``hosts(port=None, variant=1, sidecar=None)``: a (not started) host; all killed at teardown."""
    made: list[ToolHostProcess] = []

    def make(port: int | None = None, variant: int = 1, sidecar: str | None = None) -> ToolHostProcess:
        host = ToolHostProcess(
            port or free_port(), tmp_path / "host-record.jsonl", variant=variant, sidecar=sidecar
        )
        made.append(host)
        return host

    yield make
    for host in made:
        host.kill()


OneHost = Callable[..., Awaitable[tuple[ToolHostProcess, SidecarProcess]]]


@pytest.fixture
def one_host(sidecar_factory: SidecarFactory, hosts: Callable[..., ToolHostProcess]) -> OneHost:
    """``await one_host(**tools)``: a started host and a started sidecar using it (``tools``: more
    ``tools`` config, e.g. ``require_approval``)."""

    async def start(**tools: Any) -> tuple[ToolHostProcess, SidecarProcess]:
        host = await hosts().start()
        return host, await sidecar_factory(config(host.address, **tools)).start()

    return start


def outputs(result: TurnResult, *, preliminary: bool) -> list[Any]:
    """The JSON values of the turn's (preliminary or final) ToolOutputAvailable events."""
    return [
        json.loads(event.tool_output_available.output_json)
        for event in result.events
        if event.WhichOneof("event") == "tool_output_available"
        and event.tool_output_available.preliminary == preliminary
    ]


def errors(result: TurnResult) -> list[str]:
    """The error texts of the turn's ToolOutputError events."""
    return [
        e.tool_output_error.error_text for e in result.events if e.WhichOneof("event") == "tool_output_error"
    ]


async def chat(sidecar: SidecarProcess, script: str, conversation: str = "c", **kwargs: Any) -> TurnResult:
    async with TurnwireClient(sidecar.target) as client:
        return await collect(client.chat(conversation, "go", model=f"scripted:{script}", **kwargs))


async def test_a_host_tool_runs_with_exact_big_integers_both_ways(one_host: OneHost) -> None:
    host, sidecar = await one_host()
    result = await chat(sidecar, "big")
    assert result.ok and result.text == "after"
    final = [
        e.tool_output_available.output_json
        for e in result.events
        if e.WhichOneof("event") == "tool_output_available"
    ]
    assert final == [f'{{"sum":{A + B}}}']  # the exact text, no float on the way
    (started,) = host.events("started", "add_big")
    assert json.loads(started["input_json"]) == {"a": A, "b": B}
    assert started["parent"] == result.request_id == started["request_id"]
    assert result.message is not None
    assert started["idempotency_key"] == tool_idempotency_key("c", result.message.id, started["tool_call_id"])


async def test_a_streaming_host_tool_sends_preliminary_results_on_the_chat_stream(one_host: OneHost) -> None:
    _host, sidecar = await one_host()
    result = await chat(sidecar, "count")
    assert result.ok
    # Each yield is preliminary, the final value last (as a Python streaming tool's, §3).
    assert outputs(result, preliminary=True) == [{"i": 1}, {"i": 2}, {"done": 3}]
    assert outputs(result, preliminary=False) == [{"done": 3}]


async def test_a_host_error_is_a_tool_error_and_the_turn_goes_on(one_host: OneHost) -> None:
    _host, sidecar = await one_host()
    result = await chat(sidecar, "fail")
    assert result.ok and result.text == "after"
    assert errors(result) == ["no luck today"]


async def test_a_declared_timeout_ends_the_call_with_a_tool_error_and_cancels_it_on_the_host(
    one_host: OneHost,
) -> None:
    host, sidecar = await one_host()
    result = await chat(sidecar, "deadline")
    assert result.ok and result.text == "after"
    (error,) = errors(result)
    assert error == "tool 'quick_deadline' timed out after 0.3 s"  # as docs/tools.md gives it
    await wait_until(lambda: host.events("cancelled", "quick_deadline"), what="the host saw the cancellation")


async def test_cancelling_the_turn_cancels_the_remote_call(one_host: OneHost) -> None:
    host, sidecar = await one_host()
    async with TurnwireClient(sidecar.target) as client:
        stream = client.chat("c", "go", model="scripted:wait")
        async for event in stream:
            if event.WhichOneof("event") == "tool_input_available":
                await wait_until(lambda: host.events("started", "wait"), what="the host runs the call")
                assert stream.cancel()
                break
    await wait_until(lambda: host.events("cancelled", "wait"), what="the host's handler was cancelled")
    assert not host.events("finished", "wait")


async def test_a_host_that_dies_mid_call_gives_a_tool_error_and_its_tools_work_after_it_comes_back(
    one_host: OneHost, hosts: Callable[..., ToolHostProcess]
) -> None:
    host, sidecar = await one_host()
    async with TurnwireClient(sidecar.target) as client:
        turn = asyncio.ensure_future(collect(client.chat("c", "go", model="scripted:wait")))
        await wait_until(lambda: host.events("started", "wait"), what="the host runs the call")
        host.kill()
        result = await turn
    assert result.ok and result.text == "after"  # the turn went on
    (error,) = errors(result)
    assert "tool host 'host0' is unavailable" in error
    # Restarted (a new instance with one more tool): listed again once the channel reconnects.
    await hosts(port=host.port, variant=2).start()

    async def new_tool_works() -> bool:
        again = await chat(sidecar, "again", conversation="after-restart")
        return outputs(again, preliminary=False) == ["new"]

    await wait_until(new_tool_works, timeout=20, interval=0.2, what="the restarted host's tools are listed")
    assert (await chat(sidecar, "big", conversation="big")).text == "after"


async def test_a_host_down_at_start_up_joins_when_it_comes_up(
    sidecar_factory: SidecarFactory, hosts: Callable[..., ToolHostProcess]
) -> None:
    host = hosts()
    sidecar = await sidecar_factory(config(host.address)).start()  # starts without it
    result = await chat(sidecar, "big")
    assert result.ok
    assert [e for e in result.events if e.WhichOneof("event") == "tool_input_error"]  # not a tool yet
    await host.start()

    async def works() -> bool:
        return outputs(await chat(sidecar, "big", conversation="later"), preliminary=False) == [
            {"sum": A + B}
        ]

    await wait_until(works, timeout=20, interval=0.2, what="the host's tools are listed")


async def test_a_later_source_overrides_an_earlier_tool_of_the_same_name(one_host: OneHost) -> None:
    host, sidecar = await one_host()
    # The host's get_weather replaces the demo tool (server tools, then hosts).
    result = await chat(sidecar, "weather")
    assert outputs(result, preliminary=False) == [{"city": "Oslo", "source": "tool host"}]
    # The request's client tool replaces the host's (client tools come last).
    client_tool = {"name": "get_weather", "description": "mine", "input_schema": {"type": "object"}}
    result = await chat(sidecar, "weather", conversation="client", client_tools=[client_tool])
    assert result.ok and not outputs(result, preliminary=False)
    assert result.message is not None
    (call,) = [p.tool_call for p in result.message.parts if p.WhichOneof("kind") == "tool_call"]
    assert call.client_executed
    assert len(host.events("started", "get_weather")) == 1


async def test_a_later_host_overrides_an_earlier_one(
    sidecar_factory: SidecarFactory, hosts: Callable[..., ToolHostProcess], tmp_path: Path
) -> None:
    first = await hosts().start()
    second = await ToolHostProcess(free_port(), tmp_path / "second.jsonl").start()
    try:
        sidecar = await sidecar_factory(config(first.address, second.address)).start()
        assert (await chat(sidecar, "big")).ok
        assert not first.events("started") and second.events("started", "add_big")
    finally:
        second.kill()


async def test_remote_tools_needing_approval_wait_for_it(one_host: OneHost) -> None:
    host, sidecar = await one_host(require_approval=["add_big"])
    for script, tool, output in (
        ("guarded", "guarded", {"guarded": "ran"}),
        ("big", "add_big", {"sum": A + B}),
    ):
        result = await chat(sidecar, script, conversation=script)
        (request,) = [
            e.tool_approval_request for e in result.events if e.WhichOneof("event") == "tool_approval_request"
        ]
        assert result.ok and not host.events("started", tool)  # ToolSpec.requires_approval / require_approval
        async with TurnwireClient(sidecar.target) as client:
            approved = await collect(client.submit_tool_approvals(script, {request.tool_call_id: True}))
        assert outputs(approved, preliminary=False) == [output]
        assert host.events("started", tool)


async def test_a_remote_tool_calling_a_blocking_chat_on_its_own_conversation_gets_failed_precondition(
    sidecar_factory: SidecarFactory, hosts: Callable[..., ToolHostProcess]
) -> None:
    port = free_port()
    sidecar = sidecar_factory(config(f"127.0.0.1:{port}"))  # its own port is chosen before it starts
    await hosts(port=port, sidecar=sidecar.target).start()
    await sidecar.start()
    result = await chat(sidecar, "callback", conversation="nested")
    assert result.ok and result.text == "after"
    assert outputs(result, preliminary=False) == [{"status": "FAILED_PRECONDITION"}]
