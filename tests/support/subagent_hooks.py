"""Test-only middlewares and a tool for the sub-agent tests, loaded by a real server process as
``support.subagent_hooks:…`` (tests/e2e/test_subagents_e2e.py).

``RecordHooks`` records; ``ReviewFromBody`` (a hook) and ``delegate`` (a tool) run a sub-agent
themselves through the SDK (:func:`turnwire.subagents.call_subagent`).

Every hook it implements appends one JSON line to the file ``path`` names: its ``label`` (which
chain it sits in), the hook, the turn's request id, and for ``before_turn`` the entry path and
the sub-agent path the turn was told (docs/semantics.md §4, docs/subagents.md). It implements
no ``on_chunk``, so the log is the turn's hook order and nothing per chunk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from turnwire.hooks import (
    ChatResponseContext,
    Middleware,
    StepConfig,
    StepContext,
    StepFinishContext,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
)
from turnwire.subagents import call_subagent, call_subagent_from_tool
from turnwire.tools import ToolExecution, tool


class RecordHooks(Middleware):
    """Appends a line per hook call to ``path`` (``label``: the chain's name in the log)."""

    def __init__(self, *, label: str, path: str) -> None:
        """``label`` names the chain; ``path`` is the JSON-lines log it appends to."""
        super().__init__(label=label)
        self.name = label
        self._path = Path(path)

    def _record(self, hook: str, request_id: str, **fields: Any) -> None:
        line = {"label": self.name, "hook": hook, "request_id": request_id, **fields}
        with self._path.open("a", encoding="utf-8") as log:
            log.write(json.dumps(line) + "\n")

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Record the turn's entry path and sub-agent path."""
        path = [[call.subagent, call.conversation_id] for call in ctx.subagent_path]
        self._record(
            "before_turn",
            ctx.request_id,
            entry=ctx.entry,
            path=path,
            conversation_id=ctx.conversation_id,
            system=ctx.system,
        )
        return None

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        """Record the step's start."""
        self._record("before_step", ctx.request_id, step=ctx.step_number, system=ctx.system)
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """Record the call."""
        self._record("before_tool_call", ctx.request_id, tool=ctx.tool_name)
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """Record the call's result."""
        self._record("after_tool_call", ctx.request_id, tool=ctx.tool_name, success=ctx.success)

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """Record the step's end."""
        self._record("on_step_finish", ctx.request_id, step=ctx.step_number)

    async def on_chat_response(self, result: ChatResponseContext) -> None:
        """Record the turn's end."""
        self._record("on_chat_response", result.request_id, status=result.status)


class ReviewFromBody(Middleware):
    """With ``body["review"]``, ``before_turn`` has sub-agent ``checker`` review that text (call
    id ``review``) and puts its answer in the turn's system prompt."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Run the review when asked."""
        text = ctx.body.get("review")
        if not isinstance(text, str):
            return None
        answer = await call_subagent(
            "checker", text, conversation_id=ctx.conversation_id, request_id=ctx.request_id, call_id="review"
        )
        return TurnConfig(system=f"{ctx.system} The reviewer said: {answer}")


class DelegateInput(BaseModel):
    subagent: str
    prompt: str


@tool(DelegateInput)
async def delegate(args: DelegateInput, execution: ToolExecution) -> dict[str, object]:
    """Hand ``prompt`` to sub-agent ``subagent`` and answer with what it said."""
    return {"answer": await call_subagent_from_tool(args.subagent, args.prompt, execution)}


class FollowupModel(Middleware):
    """A turn that delivers a detached sub-agent's answer (``body["subagent_result"]``) runs on
    ``model``, so the test's scripts tell it from the turn that made the call."""

    def __init__(self, *, model: str) -> None:
        """``model``: ``provider:model`` of the delivering turns."""
        super().__init__(model=model)
        self._model = model

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """Switch the model for a delivering turn."""
        return TurnConfig(model=self._model) if "subagent_result" in ctx.body else None
