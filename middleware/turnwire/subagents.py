"""Sub-agents in the hook contract: where a sub-agent's turn sits (docs/subagents.md).

A sub-agent is a model with its own system prompt, tools and middleware, declared in the
config's ``subagents:`` and offered to the model as a tool. A call of it runs a child turn on a
child conversation; that turn's hooks see ``TurnContext.entry == "subagent"`` and
``TurnContext.subagent_path``: the :class:`SubagentCall`\\ s from the top-level turn down to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from turnwire.tools import ToolExecution


@dataclass(frozen=True, slots=True)
class SubagentCall:
    """One sub-agent call: the calling turn's tool call ``tool_call_id`` ran sub-agent
    ``subagent`` as turn ``request_id`` on the child conversation ``conversation_id`` (the store
    key: the tenant's prefix included when authentication is on). The wire form is the
    ``turnwire.v1.SubagentCall`` message of a ``SubagentEvent``'s path."""

    tool_call_id: str
    subagent: str
    conversation_id: str
    request_id: str


class SubagentRunner(Protocol):
    """What runs sub-agents in this process: the sidecar's engine installs one at start
    (:func:`install_runner`); user code calls :func:`call_subagent`."""

    async def run(
        self, name: str, prompt: str, *, conversation_id: str, request_id: str, call_id: str
    ) -> Any:
        """Run sub-agent ``name`` (see :func:`call_subagent`)."""
        ...


_runner: SubagentRunner | None = None


def install_runner(runner: SubagentRunner | None) -> None:
    """Make ``runner`` the process's sub-agent runner (the sidecar does this at start; None
    removes it)."""
    global _runner  # noqa: PLW0603 - one engine per process: its runner is process-wide
    _runner = runner


class SubagentsUnavailable(RuntimeError):
    """:func:`call_subagent` was called outside a sidecar process (no engine installed a runner):
    a remote tool host or hook server, or a plain script."""


async def call_subagent(
    name: str, prompt: str, *, conversation_id: str, request_id: str, call_id: str
) -> Any:
    """Run the configured sub-agent ``name`` on ``prompt`` from a hook or an in-process tool of
    turn ``request_id`` on ``conversation_id`` (take both from the hook's context or the
    :class:`~turnwire.tools.ToolExecution`), and return its answer: its final text, or its
    structured output as a JSON value (docs/subagents.md, "From hooks and tools").

    ``call_id`` names this call within the turn (a tool's ``tool_call_id``, or a name of your
    own): the child conversation is derived from the conversation, the turn and it, so use a new
    one per call. While turn ``request_id`` runs in this process the child's events are nested in
    its stream with ``call_id`` as the path's ``tool_call_id``, and the child runs one level
    deeper than the turn, under its principal and budgets.

    Raises :class:`SubagentsUnavailable` outside a sidecar process, and
    :class:`~turnwire.tools.ToolError` when ``name`` is no configured sub-agent or the child does
    not complete (its message says how it ended).
    """
    runner = _runner
    if runner is None:
        raise SubagentsUnavailable(
            "no sub-agents in this process: call_subagent works in hooks and tools the sidecar runs "
            "in-process (turnwire serve)"
        )
    return await runner.run(
        name, prompt, conversation_id=conversation_id, request_id=request_id, call_id=call_id
    )


async def call_subagent_from_tool(name: str, prompt: str, execution: ToolExecution) -> Any:
    """:func:`call_subagent` from a tool: the ids are ``execution``'s, the call id its
    ``tool_call_id`` and ``name`` (one call of each sub-agent per tool call)."""
    return await call_subagent(
        name,
        prompt,
        conversation_id=execution.conversation_id,
        request_id=execution.request_id,
        call_id=f"{execution.tool_call_id}.{name}",
    )
