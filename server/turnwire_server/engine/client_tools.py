"""Client tools and approval requests in a running turn (docs/semantics.md §2, §6).

A turn's tool set is the server's tools, then the request's client tools: a later source
overrides an earlier one of the same name (:func:`turn_tools`). When the model calls a
client tool, or a server tool that needs approval, the call is held
(:func:`hold_call`): it is not run, no ``before_tool_call``/``after_tool_call`` fires, the
step ends and the turn completes with the call waiting for the client.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from turnwire.tools import Tool, is_client_executed, requires_approval
from turnwire_client.v1 import message_pb2
from turnwire_server.engine.ids import new_approval_id
from turnwire_server.engine.turn_state import TurnWorkingState


def turn_tools(server_tools: Mapping[str, Tool], client_tools: Sequence[Tool]) -> dict[str, Tool]:
    """The tool set a turn starts with: ``server_tools``, then ``client_tools`` (same name: the
    client tool wins)."""
    tools = dict(server_tools)
    tools.update((tool.name, tool) for tool in client_tools)
    return tools


def hold_call(state: TurnWorkingState, tool_call_id: str, tool: Tool, input: Mapping[str, Any]) -> bool:
    """Hold a complete call that the client must answer; True when it was held.

    A client tool's call gets ``client_executed`` and stays ``input-available``. A call of a
    tool that needs approval for ``input`` moves to ``approval-requested`` with a new
    ``approval.id`` and a ``ToolApprovalRequest`` event is sent. Any other call is not held.
    """
    call = state.assistant.tool_call(tool_call_id)
    if is_client_executed(tool):
        call.client_executed = True
        state.checkpoints.progress()
        return True
    if requires_approval(tool, input):
        call.state = message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED
        call.approval.id = new_approval_id(state.request.request_id)
        event = state.writer.new().tool_approval_request
        event.tool_call_id = tool_call_id
        event.tool_name = call.tool_name
        event.approval_id = call.approval.id
        state.checkpoints.progress()
        return True
    return False
