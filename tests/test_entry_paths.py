"""Every entry path fires the same hooks in the same order (docs/semantics.md §1).

Chat, SaveMessages (with messages and with none) and ContinueLastTurn all run
the same pipeline: a turn with one tool call produces the same hook log on
each, and only ``continuation`` differs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from support.engine_harness import CONV, EngineFactory, Harness, end_of, make_tool

from turnwire.hooks import (
    ChatResponseContext,
    Middleware,
    StepContext,
    StepFinishContext,
    ToolCallContext,
    ToolCallResultContext,
    TurnContext,
)
from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import ToolExecution
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

SCRIPT = {
    "main": [
        ScriptStep(text="Looking.", tool_calls=[ScriptedToolCall(name="lookup", input={"q": "x"})]),
        ScriptStep(text="Found it."),
    ]
}

EXPECTED = [
    ("A", "before_turn"),
    ("B", "before_turn"),
    ("A", "before_step", 0),
    ("B", "before_step", 0),
    ("A", "before_tool_call", "lookup"),
    ("B", "before_tool_call", "lookup"),
    ("B", "after_tool_call", "lookup"),
    ("A", "after_tool_call", "lookup"),
    ("B", "on_step_finish", 0),
    ("A", "on_step_finish", 0),
    ("A", "before_step", 1),
    ("B", "before_step", 1),
    ("B", "on_step_finish", 1),
    ("A", "on_step_finish", 1),
    ("B", "on_chat_response", "completed"),
    ("A", "on_chat_response", "completed"),
]


class Log(Middleware):
    """Records hook calls (without on_chunk, which the chain tests cover per chunk)."""

    def __init__(self, name: str, log: list[tuple[Any, ...]]) -> None:
        self.name = name
        super().__init__()
        self.log = log
        self.continuation: list[bool] = []

    async def before_turn(self, ctx: TurnContext) -> None:
        self.log.append((self.name, "before_turn"))
        self.continuation.append(ctx.continuation)

    async def before_step(self, ctx: StepContext) -> None:
        self.log.append((self.name, "before_step", ctx.step_number))

    async def before_tool_call(self, ctx: ToolCallContext) -> None:
        self.log.append((self.name, "before_tool_call", ctx.tool_name))

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        self.log.append((self.name, "after_tool_call", ctx.tool_name))

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        self.log.append((self.name, "on_step_finish", ctx.step_number))

    async def on_chat_response(self, result: ChatResponseContext) -> None:
        self.log.append((self.name, "on_chat_response", result.status))


async def _found(input: dict[str, Any], execution: ToolExecution) -> str:
    return "found"


async def _prepare(make_engine: EngineFactory) -> tuple[Harness, list[tuple[Any, ...]], Log]:
    log: list[tuple[Any, ...]] = []
    first = Log("A", log)
    h = await make_engine(
        scripts=SCRIPT, tools=[make_tool("lookup", _found)], middlewares=[first, Log("B", log)]
    )
    return h, log, first


@pytest.mark.parametrize("path", ["chat", "save_messages", "save_messages_empty", "continue_last_turn"])
async def test_every_entry_path_fires_the_same_hooks_in_the_same_order(
    make_engine: EngineFactory, path: str
) -> None:
    h, log, first = await _prepare(make_engine)
    if path != "chat":
        # An earlier turn gives SaveMessages([]) and ContinueLastTurn a history ending with
        # an assistant message; its hooks are not part of what this test compares.
        assert end_of(await h.run("earlier")).status == event_pb2.TURN_STATUS_COMPLETED
        log.clear()
        first.continuation.clear()
    # Each RPC's servicer builds the TurnRequest with its own response type.
    if path == "chat":
        request = h.request("hello")
    elif path == "save_messages":
        request = replace(h.request("hello"), response_type=chat_service_pb2.SaveMessagesResponse)
    elif path == "save_messages_empty":
        request = replace(h.request(None), response_type=chat_service_pb2.SaveMessagesResponse)
    else:
        request = replace(
            h.request(None, continuation=True), response_type=chat_service_pb2.ContinueLastTurnResponse
        )
    responses = [response async for response in await h.engine.start(request)]
    assert all(type(r) is request.response_type for r in responses)
    events = [r.event for r in responses]
    end = end_of(events)
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert log == EXPECTED
    assert first.continuation == [path == "continue_last_turn"]
    stored = await h.store.load_messages(CONV)
    assert stored[-1].id == end.message.id
    assert stored[-1].role == message_pb2.ROLE_ASSISTANT
