"""The ``subagents:`` configuration and what start-up checks of it (docs/subagents.md), the
child conversation's derived id, the sub-agent path a recovery reads back, and what a remote
hook server is told of it."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest

from turnwire.hooks import TurnContext
from turnwire.subagents import SubagentCall
from turnwire.tools import ToolError
from turnwire_client.v1 import event_pb2, hooks_pb2
from turnwire_server.api.tenancy import Tenancy
from turnwire_server.assembly import build_providers, load_middlewares
from turnwire_server.config import ConfigError, load_settings
from turnwire_server.engine.detached_subagents import DetachedResults
from turnwire_server.engine.request import TurnRequest
from turnwire_server.engine.subagents import child_conversation_id, is_child
from turnwire_server.engine.turn_spec import parse_spec, spec_json
from turnwire_server.remote_hooks.convert import before_turn_request
from turnwire_server.subagent_loading import SubagentConfigError, build_subagents
from turnwire_server.tools.demo import DEMO_TOOLS

ENTRY = {"name": "researcher", "description": "Researches."}


def settings_with(*entries: dict[str, Any]) -> Any:
    return load_settings(subagents=list(entries))


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([ENTRY, ENTRY], "'researcher' is given twice"),
        ([{**ENTRY, "name": "has space"}], "subagents.0.name"),
        ([{**ENTRY, "model": "nocolon"}], "must be provider:model"),
        ([{"name": "x"}], "subagents.0.description"),
        ([{**ENTRY, "max_steps": 0}], "subagents.0.max_steps"),
        ([{**ENTRY, "temperature": 1}], "subagents.0.temperature"),
    ],
)
def test_bad_entries_are_refused_with_the_field_named(entries: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        settings_with(*entries)


async def build(*entries: dict[str, Any]) -> Any:
    settings = settings_with(*entries)
    providers = build_providers(settings)
    try:
        return await build_subagents(
            settings, providers, {t.name: t for t in DEMO_TOOLS}, load_middlewares, DetachedResults()
        )
    finally:
        await providers.aclose()


async def test_a_subagent_is_offered_as_a_tool_beside_the_server_tools() -> None:
    subagents = await build({**ENTRY, "tools": ["calculator", "researcher"], "max_steps": 2})
    tools = subagents.all_tools
    assert "researcher" in tools and "calculator" in tools
    assert tools["researcher"].input_schema["required"] == ["prompt"]
    chain, own_tools = subagents.home("researcher")
    assert sorted(own_tools) == ["calculator", "researcher"]
    assert "subagent:researcher" in [m.name for m in chain.middlewares]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({**ENTRY, "name": "calculator"}, "name is also a tool's"),
        ({**ENTRY, "model": "nowhere:model"}, r"subagents\[0\] \(researcher\)\.model"),
        ({**ENTRY, "middleware": [{"remote": {"address": "127.0.0.1:1"}}]}, "only in-process entries"),
        ({**ENTRY, "output": {"type": "string"}}, r"\.output must be a JSON Schema of an object"),
        (  # the sub-agent's own chain, named as its entry's, not as the top-level middleware's
            {**ENTRY, "middleware": ["nowhere_module:Hook"]},
            r"^subagents\[0\] \(researcher\)\.middleware\[0\] nowhere_module:Hook: No module named",
        ),
    ],
)
async def test_start_up_refuses_what_cannot_run(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(SubagentConfigError, match=message):
        await build(entry)


def test_the_child_conversation_id_is_derived_from_the_parents() -> None:
    digest = hashlib.sha256(b"r1\0call_0_0").hexdigest()[:16]
    assert child_conversation_id("acme/c1", "r1", "call_0_0") == f"acme/c1:sub-{digest}"
    assert is_child(f"c1:sub-{digest}") and not is_child("c1")
    # The tenant's prefix does not count against the client's 128 characters; the id does.
    assert child_conversation_id("t/" + "c" * 107, "r", "x").startswith("t/")
    with pytest.raises(ToolError, match="at most 107 characters"):
        child_conversation_id("c" * 108, "r", "x")


def test_a_recovery_reads_the_subagent_path_back() -> None:
    path = (SubagentCall("call_0_0", "researcher", "c1:sub-0123456789abcdef", "tw-r-1"),)
    request = TurnRequest(
        conversation_id=path[0].conversation_id,
        request_id="tw-r-1",
        messages=[],
        body={},
        model="scripted:demo",
        continuation=False,
        response_type=object,
        entry="subagent",
        subagent_path=path,
    )
    assert parse_spec(spec_json(request)).subagent_path == path
    assert (
        parse_spec(spec_json(TurnRequest("c", "r", [], {}, "scripted:demo", False, object))).subagent_path
        == ()
    )


def test_a_remote_hook_server_sees_the_entry_path_and_the_subagent_path() -> None:
    call = SubagentCall("call_0_0", "researcher", "c1:sub-0123456789abcdef", "tw-r-1")
    ctx = TurnContext(
        conversation_id=call.conversation_id,
        request_id=call.request_id,
        system="",
        messages=[],
        tools={},
        model="scripted:demo",
        continuation=False,
        body={},
        entry="subagent",
        subagent_path=(call,),
    )
    request = before_turn_request(ctx, hooks_pb2.TurnInfo(), include_messages=False)
    assert request.entry == "subagent"
    assert [(c.tool_call_id, c.subagent, c.conversation_id, c.request_id) for c in request.subagent_path] == [
        ("call_0_0", "researcher", "c1:sub-0123456789abcdef", "tw-r-1")
    ]


def test_nested_ids_lose_the_tenants_prefix_on_the_way_out() -> None:
    event = event_pb2.TurnEvent(conversation_id="acme/c1", request_id="acme/r1", sequence_number=3)
    nested = event.subagent_event
    nested.path.add(
        tool_call_id="call_0_0", subagent="x", conversation_id="acme/c1:sub-0", request_id="acme/tw-r-1"
    )
    nested.event.conversation_id = "acme/c1:sub-0"
    nested.event.turn_end.error.message = "turn acme/tw-r-1 failed"
    Tenancy("acme").unscope(event)
    assert (nested.path[0].conversation_id, nested.path[0].request_id) == ("c1:sub-0", "tw-r-1")
    assert (nested.event.conversation_id, nested.event.turn_end.error.message) == (
        "c1:sub-0",
        "turn tw-r-1 failed",
    )
