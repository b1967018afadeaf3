"""A test-only middleware that writes what the tool hooks and the step and response hooks were
given, as JSON lines, to the file ``body["record_to"]`` names: loaded by a real server process as
``support.step_records:RecordToolHooks`` (``PYTHONPATH`` from ``support.hooks.pythonpath_env``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from turnwire.hooks import (
    ChatResponseContext,
    Middleware,
    StepFinishContext,
    ToolCallContext,
    ToolCallDecision,
    TurnConfig,
    TurnContext,
)
from turnwire_client.v1 import message_pb2


def _call(call: message_pb2.ToolCallPart) -> dict[str, Any]:
    return {
        "id": call.tool_call_id,
        "name": call.tool_name,
        "state": message_pb2.ToolCallState.Name(call.state),
        "provider_executed": call.provider_executed,
        "client_executed": call.client_executed,
    }


class RecordToolHooks(Middleware):
    """One line per ``before_tool_call``, ``on_step_finish`` and ``on_chat_response`` of a turn whose
    body has ``record_to`` (a file path): the hook's name and the calls it was shown."""

    def __init__(self) -> None:
        """No options."""
        super().__init__()
        self._paths: dict[str, Path] = {}

    def _write(self, request_id: str, record: dict[str, Any]) -> None:
        path = self._paths.get(request_id)
        if path is not None:
            with path.open("a") as out:
                out.write(json.dumps(record) + "\n")

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Remember where this turn's records go."""
        if ctx.body.get("record_to"):
            self._paths[ctx.request_id] = Path(str(ctx.body["record_to"]))
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """Record the call offered."""
        self._write(ctx.request_id, {"hook": "before_tool_call", "name": ctx.tool_name})
        return None

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """Record the step's calls, results, warnings and provider metadata."""
        self._write(
            ctx.request_id,
            {
                "hook": "on_step_finish",
                "tool_calls": [_call(c) for c in ctx.tool_calls],
                "tool_results": [c.tool_call_id for c in ctx.tool_results],
                "warnings": list(ctx.warnings),
                "provider_metadata": dict(ctx.provider_metadata or {}),
            },
        )

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Record the stored message's calls; forget the turn."""
        calls = [_call(p.tool_call) for p in ctx.message.parts if p.WhichOneof("kind") == "tool_call"]
        message = json_format.MessageToDict(ctx.message)
        self._write(
            ctx.request_id, {"hook": "on_chat_response", "tool_calls": calls, "parts": len(message["parts"])}
        )
        self._paths.pop(ctx.request_id, None)
