"""Which calls wait for the client (docs/semantics.md §6), in process.

A tool needs approval by ``needs_approval`` on ``PythonTool``/``@tool`` (a bool, or a function of
the call's input) or by the config (``tools.require_approval``). A request's client tool overrides
a server tool of the same name (docs/semantics.md §2: server tools, then client tools).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import BaseModel
from support.engine_harness import EngineFactory, collect, end_of, kinds, of_kind, tool_parts

from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import ClientTool, PythonTool, ToolExecution, requires_approval, tool
from turnwire_client.v1 import message_pb2
from turnwire_server.assembly import StartupError, open_tools
from turnwire_server.config import load_settings
from turnwire_server.tools.loading import load_tools
from turnwire_server.tools.tool_set import ToolSet


class Transfer(BaseModel):
    amount: int


@tool(Transfer, needs_approval=lambda input: input["amount"] > 100)
async def transfer(input: Transfer, execution: ToolExecution) -> dict[str, Any]:
    """Move money."""
    return {"moved": input.amount}


def test_needs_approval_may_depend_on_the_input() -> None:
    assert requires_approval(transfer, {"amount": 500})
    assert not requires_approval(transfer, {"amount": 5})
    assert requires_approval(transfer, {}), "a rule that raises asks for approval"
    plain = PythonTool("plain", "", lambda i, e: None, input_schema={"type": "object"})
    assert not requires_approval(plain, {})


async def test_require_approval_names_loaded_tools() -> None:
    tools = ToolSet(load_tools(True, []), ["calculator"])
    assert requires_approval(tools["calculator"], {})
    assert not requires_approval(tools["get_weather"], {})
    with pytest.raises(StartupError, match="no_such_tool"):
        await open_tools(load_settings(None, tools={"require_approval": ["no_such_tool"]}))


async def test_only_the_call_over_the_limit_waits_for_approval(make_engine: EngineFactory) -> None:
    step = ScriptStep(
        tool_calls=[
            ScriptedToolCall(name="transfer", input={"amount": 5}),
            ScriptedToolCall(name="transfer", input={"amount": 500}),
        ]
    )
    h = await make_engine(scripts={"main": [step, ScriptStep(text="unreachable")]}, tools=[transfer])
    events = await h.run("pay")
    end = end_of(events)
    small, large = tool_parts(end.message)
    assert small.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE, "the small one ran"
    assert large.state == message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED and large.approval.id.startswith(
        "tw-ap-"
    )
    assert [r.tool_call_id for r in of_kind(events, "tool_approval_request")] == [large.tool_call_id]
    assert h.provider.calls == 1, "the turn ends after the step that asked for approval"
    assert kinds(events)[-1] == "turn_end"


async def test_a_client_tool_overrides_a_server_tool_of_the_same_name(make_engine: EngineFactory) -> None:
    step = ScriptStep(tool_calls=[ScriptedToolCall(name="transfer", input={"amount": 1})])
    h = await make_engine(scripts={"main": [step, ScriptStep(text="unreachable")]}, tools=[transfer])
    request = replace(
        h.request("pay"), client_tools=[ClientTool("transfer", "the client's own", {"type": "object"})]
    )
    events = await collect(await h.engine.start(request))
    [call] = tool_parts(end_of(events).message)
    assert call.client_executed and call.state == message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    assert [t.description for t in h.provider.requests[0].tools] == ["the client's own"]
