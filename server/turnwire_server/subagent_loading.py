"""Builds the configured sub-agents (``subagents:``, docs/subagents.md) at start.

Checked against what start-up knows: every sub-agent's name is no tool's, its model is one the
providers serve, its ``output`` (when given) is a JSON Schema of an object, its tools are loaded
tools or other sub-agents (a name that a tool host or MCP server not answering yet may list later
is only warned of), and its middleware chain loads and answers ``configure_session``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from turnwire.hooks import Middleware, SessionContext
from turnwire.tools import Tool
from turnwire_server.config import MiddlewareEntry, Settings
from turnwire_server.engine.detached_subagents import DetachedResults
from turnwire_server.engine.subagents import Subagent, Subagents
from turnwire_server.hooks.chain import session_failure
from turnwire_server.providers.json_schema import object_schema_problem
from turnwire_server.providers.registry import ProviderRegistry, UnknownModel

log = logging.getLogger("turnwire.server")


class SubagentConfigError(ValueError):
    """A ``subagents:`` entry cannot run; the message names it and says what to fix."""


async def build_subagents(
    settings: Settings,
    providers: ProviderRegistry,
    tools: Mapping[str, Tool],
    load_middlewares: Callable[[Sequence[MiddlewareEntry]], list[Middleware]],
    detached: DetachedResults,
) -> Subagents:
    """The sub-agents of ``settings`` over the server's ``tools`` (bind the engine to them
    afterwards). ``load_middlewares`` loads a chain as the top-level one is loaded; ``detached``
    delivers the answers of detached sub-agents (bind it to the submissions once they exist). Raises
    :class:`SubagentConfigError`, naming the entry (``subagents[i] (name)``) for a chain that
    does not load too."""
    names = {entry.name for entry in settings.subagents}
    built: list[Subagent] = []
    for index, entry in enumerate(settings.subagents):
        where = f"subagents[{index}] ({entry.name})"
        if entry.name in tools:
            raise SubagentConfigError(f"{where}: name is also a tool's; give the sub-agent another name")
        if entry.model is not None:
            try:
                providers.resolve(entry.model)
            except UnknownModel as error:
                raise SubagentConfigError(f"{where}.model: {error}") from error
        unknown = [name for name in entry.tools if name not in tools and name not in names]
        if unknown:
            log.warning(
                "%s.tools names %s, which no tool source lists (yet); it is offered once listed",
                where,
                ", ".join(map(repr, unknown)),
            )
        if entry.output is not None and (problem := object_schema_problem(entry.output)) is not None:
            raise SubagentConfigError(f"{where}.output {problem}")
        if any(m.remote is not None for m in entry.middleware):
            raise SubagentConfigError(
                f"{where}.middleware: only in-process entries (path:) are supported for a sub-agent"
            )
        try:
            middlewares = load_middlewares(entry.middleware)
        except Exception as error:  # its message starts "middleware[i] PATH": say whose chain
            raise SubagentConfigError(f"{where}.{error}") from error
        subagent = Subagent(
            name=entry.name,
            description=entry.description,
            model=entry.model or "",
            system_prompt=entry.system_prompt or "",
            tools=tuple(entry.tools),
            middlewares=middlewares,
            max_steps=entry.max_steps,
            output=entry.output,
            detached=entry.detached,
        )
        try:
            await subagent.chain.configure_session(
                SessionContext(
                    default_model=entry.model or settings.default_model,
                    system=entry.system_prompt or settings.system_prompt,
                    tools=dict(tools),
                )
            )
        except Exception as error:
            raise SubagentConfigError(f"{where}: {session_failure(error)}") from error
        built.append(subagent)
    return Subagents(built, tools, detached)
