"""Test-only parts a sidecar process imports (through ``PYTHONPATH``, see
:func:`support.hooks.pythonpath_env`) for the AddMessages end-to-end tests.

- ``add_note``: a tool that calls the sidecar's own ``AddMessages`` from inside the running
  turn, over gRPC, sending the parent request id in the ``turnwire-parent-request-id``
  metadata as a tool server calling back would (docs/semantics.md §5, nesting).
- ``HistoryProbe``: a middleware whose ``before_step`` writes what the model is about to be sent
  to ``history-<request_id>-<step>.json`` in the process's working directory, so a test can
  read what the model saw.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import grpc
from pydantic import BaseModel

from turnwire.hooks import Middleware, StepConfig, StepContext
from turnwire.tools import ToolExecution, tool
from turnwire_client.metadata import PARENT_REQUEST_METADATA
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2


def _own_target() -> str:
    """The sidecar's own address: the ``--listen`` argument of the process this runs in."""
    argv = sys.argv
    return argv[argv.index("--listen") + 1]


class Note(BaseModel):
    """Input of ``add_note``."""

    message_id: str
    text: str


@tool(Note, name="add_note")
async def add_note(input: Note, execution: ToolExecution) -> dict[str, Any]:
    """Add a user note to this conversation's transcript through the sidecar's AddMessages."""
    note = message_pb2.Message(id=input.message_id, role=message_pb2.ROLE_USER)
    note.parts.add().text.text = input.text
    async with grpc.aio.insecure_channel(_own_target()) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        response = await stub.AddMessages(
            chat_service_pb2.AddMessagesRequest(conversation_id=execution.conversation_id, messages=[note]),
            metadata=((PARENT_REQUEST_METADATA, execution.request_id),),
            timeout=10,
        )
    return {"added": response.added_count, "message_count": response.conversation.message_count}


class HistoryProbe(Middleware):
    """``before_step``: record the role and text of every message the model will be sent."""

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        """Write ``[[role, text], …]`` to ``history-<request_id>-<step_number>.json``."""
        seen = [
            [message_pb2.Role.Name(m.role), "".join(p.text.text for p in m.parts if p.HasField("text"))]
            for m in ctx.messages
        ]
        path = Path(f"history-{ctx.request_id}-{ctx.step_number}.json")
        await asyncio.to_thread(path.write_text, json.dumps(seen))
        return None
