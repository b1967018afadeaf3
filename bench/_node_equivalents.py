"""The Node.js example's hooks and ``lookup_order`` tool (clients/node-example/lib/), in Python,
for ``remote_hooks.py``: the in-process baseline its remote numbers are compared with.

Same hooks subscribed (those the example's createHooks writes), same work: the body into the system
prompt, the tool policy, a journal entry per call kept in memory.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from pydantic import BaseModel

from turnwire import hooks
from turnwire.tools import ToolExecution, tool


class NodeExampleHooks(hooks.Middleware):
    """What clients/node-example/lib/hooks.mjs does, in process."""

    def __init__(self) -> None:
        super().__init__()
        self.journal: list[dict[str, Any]] = []
        self.chunks: Counter[str] = Counter()
        # ToolCallContext has no body (a remote hook gets it in every call's TurnInfo).
        self.bodies: dict[str, dict[str, Any]] = {}

    async def before_turn(self, ctx: hooks.TurnContext) -> hooks.TurnConfig | None:
        self.journal.append({"rpc": "BeforeTurn", "request_id": ctx.request_id})
        self.bodies[ctx.request_id] = dict(ctx.body)
        if not ctx.body:
            return None
        return hooks.TurnConfig(system=f"{ctx.system}\n\nAbout this request: {json.dumps(ctx.body)}")

    async def before_step(self, ctx: hooks.StepContext) -> hooks.StepConfig | None:
        self.journal.append({"rpc": "BeforeStep", "request_id": ctx.request_id})
        return None

    async def before_tool_call(self, ctx: hooks.ToolCallContext) -> hooks.ToolCallDecision | None:
        self.journal.append({"rpc": "BeforeToolCall", "request_id": ctx.request_id})
        body = self.bodies.get(ctx.request_id, {})
        if ctx.tool_name == "refund_order" and body.get("role") != "admin":
            return hooks.ToolCallDecision.block("Refunds need an admin: tell the user to contact support.")
        if body.get("dry_run") is True and ctx.tool_name in ("pack_order", "refund_order"):
            output = {"dry_run": True, "would_call": ctx.tool_name, "input": ctx.input}
            return hooks.ToolCallDecision.substitute(output)
        order_id = ctx.input.get("order_id")
        if ctx.tool_name == "lookup_order" and isinstance(order_id, str):
            normalized = order_id.strip().upper()
            if normalized != order_id:
                return hooks.ToolCallDecision.allow(input={**ctx.input, "order_id": normalized})
        return None

    async def after_tool_call(self, ctx: hooks.ToolCallResultContext) -> None:
        self.journal.append({"rpc": "AfterToolCall", "request_id": ctx.request_id})

    async def on_step_finish(self, ctx: hooks.StepFinishContext) -> None:
        self.journal.append({"rpc": "OnStepFinish", "request_id": ctx.request_id})

    async def on_chunk(self, ctx: hooks.ChunkContext) -> None:
        self.chunks[type(ctx.chunk).__name__] += 1

    async def on_chat_response(self, ctx: hooks.ChatResponseContext) -> None:
        self.bodies.pop(ctx.request_id, None)
        self.journal.append({"rpc": "OnChatResponse", "request_id": ctx.request_id, "status": ctx.status})


class OrderInput(BaseModel):
    order_id: str


@tool(OrderInput)
async def lookup_order(input: OrderInput, execution: ToolExecution) -> dict[str, Any]:
    """The status of an order."""
    return {"order_id": input.order_id, "status": "shipped", "carrier": "DHL"}


TOOLS = [lookup_order]
