"""Sub-agents in the hook contract: where a sub-agent's turn sits (docs/subagents.md).

A sub-agent is a model with its own system prompt, tools and middleware, declared in the
config's ``subagents:`` and offered to the model as a tool. A call of it runs a child turn on a
child conversation; that turn's hooks see ``TurnContext.entry == "subagent"`` and
``TurnContext.subagent_path``: the :class:`SubagentCall`\\ s from the top-level turn down to it.
"""

from __future__ import annotations

from dataclasses import dataclass


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
