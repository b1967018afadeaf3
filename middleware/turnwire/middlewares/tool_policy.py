"""``ToolPolicy``: allow list, deny list and read-only mode for server-executed tool calls.

Options (config ``options:``):

``allow`` (none)
    Tool names the model may run; any other call is blocked. Omitted: every tool.
``deny`` (``[]``)
    Tool names that are always blocked (checked first: deny beats allow).
``read_only`` (``false``)
    Block the tools named in ``write_tools``.
``write_tools`` (``[]``)
    The tools that change something; required (non-empty) when ``read_only`` is true.
``reason`` (none)
    The block reason for read-only mode; ``{name}`` is replaced by the tool's name.
    Default: ``Tool "{name}" is disabled in read-only mode.``

Rule (docs/semantics.md §3, ``ToolCallDecision``, and Think's
``beforeToolCall`` read-only example): a disallowed call is not run; it ends
with ``block(reason)``, so the model sees the reason as the tool's (successful)
result, ``after_tool_call`` gets ``success=True`` and the stored part is
``output-available``. The first block ends the chain (section 4), so
middlewares listed after the policy do not see blocked calls. Each reason names
the rule that blocked the call:

* deny list: ``Tool "<name>" is blocked by the tool policy's deny list.``
* allow list: ``Tool "<name>" is not in the tool policy's allow list.``
* read-only: ``reason`` (see above).

Tools the client executes never reach ``before_tool_call`` (section 6), so the
policy does not see them; use ``active_tools`` to hide tools from the model.
"""

from __future__ import annotations

from collections.abc import Sequence

from turnwire.hooks import Middleware, ToolCallContext, ToolCallDecision

DENIED_TEXT = 'Tool "{name}" is blocked by the tool policy\'s deny list.'
"""Block reason for a tool in ``deny``."""

NOT_ALLOWED_TEXT = 'Tool "{name}" is not in the tool policy\'s allow list.'
"""Block reason for a tool missing from ``allow``."""

READ_ONLY_TEXT = 'Tool "{name}" is disabled in read-only mode.'
"""Default block reason for a write tool in read-only mode."""


def _names(option: str, value: Sequence[str] | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str) or not all(isinstance(name, str) for name in value):
        raise ValueError(f"{option}: must be a list of tool names, got {value!r}")
    return frozenset(value)


class ToolPolicy(Middleware):
    """Blocks tool calls by deny list, allow list and read-only mode (see the module docstring).

    Raises :class:`ValueError` at construction when a list option is not a list
    of names, or ``read_only`` is true with no ``write_tools``.
    """

    def __init__(
        self,
        *,
        allow: Sequence[str] | None = None,
        deny: Sequence[str] = (),
        read_only: bool = False,
        write_tools: Sequence[str] = (),
        reason: str | None = None,
    ) -> None:
        """See the module docstring for the options."""
        super().__init__(allow=allow, deny=deny, read_only=read_only, write_tools=write_tools, reason=reason)
        self.allow: frozenset[str] | None = None if allow is None else _names("allow", allow)
        self.deny = _names("deny", deny)
        self.read_only = bool(read_only)
        self.write_tools = _names("write_tools", write_tools)
        if self.read_only and not self.write_tools:
            raise ValueError("read_only: needs write_tools, the names of the tools to block")
        self.reason = reason if reason is not None else READ_ONLY_TEXT

    def reason_for(self, tool_name: str) -> str | None:
        """The block reason for a call of ``tool_name``, or ``None`` when the policy allows it.

        Rules in order: deny list, allow list, read-only mode.
        """
        if tool_name in self.deny:
            return DENIED_TEXT.format(name=tool_name)
        if self.allow is not None and tool_name not in self.allow:
            return NOT_ALLOWED_TEXT.format(name=tool_name)
        if self.read_only and tool_name in self.write_tools:
            return self.reason.replace("{name}", tool_name)
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """``block(reason)`` when a rule forbids the call, else ``None`` (the chain goes on)."""
        reason = self.reason_for(ctx.tool_name)
        return None if reason is None else ToolCallDecision.block(reason)
