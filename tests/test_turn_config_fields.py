"""TurnConfig fields not covered elsewhere: messages, tools (additive), output (docs/semantics.md §3)."""

from __future__ import annotations

from typing import Any

from support.engine_harness import CONV, EngineFactory, end_of, make_tool, text_of, tool_parts

from turnwire.hooks import Middleware, TurnConfig, TurnContext
from turnwire.testing import ScriptedToolCall, ScriptStep
from turnwire.tools import ToolExecution
from turnwire_client.v1 import event_pb2, message_pb2


class Returns(Middleware):
    """before_turn returns a config built from the context."""

    def __init__(self, build: Any) -> None:
        super().__init__()
        self.build = build

    async def before_turn(self, ctx: TurnContext) -> TurnConfig:
        config: TurnConfig = self.build(ctx)
        return config


async def test_messages_replace_what_the_model_sees_but_not_what_is_stored(
    make_engine: EngineFactory,
) -> None:
    def only_last(ctx: TurnContext) -> TurnConfig:
        return TurnConfig(messages=list(ctx.messages)[-1:])

    h = await make_engine(middlewares=[Returns(only_last)])
    await h.run("first")
    await h.run("second")
    sent = h.provider.requests[-1].messages
    assert [text_of(m) for m in sent] == ["second"]
    stored = await h.store.load_messages(CONV)
    assert [text_of(m) for m in stored if m.role == message_pb2.ROLE_USER] == ["first", "second"]


async def test_tools_from_before_turn_are_added_to_the_servers_and_callable(
    make_engine: EngineFactory,
) -> None:
    async def extra(input: dict[str, Any], execution: ToolExecution) -> str:
        return "from the extra tool"

    async def base(input: dict[str, Any], execution: ToolExecution) -> str:
        return "from the base tool"

    added = make_tool("extra", extra)
    h = await make_engine(
        scripts={
            "main": [
                ScriptStep(tool_calls=[ScriptedToolCall(name="extra"), ScriptedToolCall(name="base")]),
                ScriptStep(text="ok"),
            ]
        },
        tools=[make_tool("base", base)],
        middlewares=[Returns(lambda ctx: TurnConfig(tools={"extra": added}))],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert {t.name for t in h.provider.requests[0].tools} == {"base", "extra"}
    outputs = {c.tool_name: c.output.string_value for c in tool_parts(end.message)}
    assert outputs == {"extra": "from the extra tool", "base": "from the base tool"}


async def test_output_schema_reaches_every_step_request(make_engine: EngineFactory) -> None:
    schema = {"type": "object", "properties": {"severity": {"enum": ["low", "high"]}}}
    h = await make_engine(
        scripts={"main": [ScriptStep(text='{"severity": "low"}')]},
        middlewares=[Returns(lambda ctx: TurnConfig(output=schema, active_tools=[]))],
    )
    end = end_of(await h.run())
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    assert dict(h.provider.requests[0].output_schema or {}) == schema
    assert h.provider.requests[0].tools == []
