"""MCP tool servers (``tools.mcp``), through the official ``mcp`` Python SDK.

:class:`McpServer` is one configured server, over stdio (the sidecar starts ``command`` and talks
over its stdin/stdout) or streamable HTTP (``url``). One task owns the session: it connects, lists
the tools (every page) and then holds the session open, listing again every
``REFRESH_INTERVAL_SECONDS``; when the session fails (the process died, the connection closed, a
listing failed) it is closed and started again after a backoff of 0.5 s doubling to 30 s. The
session is closed, and a stdio process ended, at shutdown. Until the first listing a server
contributes no tools; afterwards its last listing stays while it restarts, and calls of its tools
fail fast with a tool error until it is back.

An :class:`McpTool` call is one ``tools/call``. Its result becomes the tool's output:
``structuredContent`` when the server gives it, else the text of a single text block, else the
content blocks as JSON (``[{"type": "image", ...}, ...]``). ``isError`` results, protocol errors
and transport failures are tool errors whose text the model reads. Cancelling the call (the turn
is cancelled, the tool timeout expires) makes the SDK send ``notifications/cancelled``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx2
import pydantic
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, TextContent

from turnwire.tools import ToolError, ToolExecution
from turnwire_server.tools.listing import OBJECT_SCHEMA, listing_problem
from turnwire_server.tools.settings import McpServerSettings

log = logging.getLogger("turnwire.tools")

REFRESH_INTERVAL_SECONDS = 60.0
"""How often an open session lists its tools again (a failed listing restarts the session)."""

RESTART_DELAYS_SECONDS = (0.5, 30.0)
"""The first and the longest wait before a failed session is started again (doubling)."""

MAX_LIST_PAGES = 100
"""Pages of ``tools/list`` read at most (a server whose cursor never ends cannot hang start-up)."""

HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
"""Streamable HTTP: 30 s to connect and write, 300 s between reads (a response may stream)."""


class McpServer:
    """One MCP server (see the module docstring).

    ``default_timeout_seconds`` bounds a call when the entry sets no ``timeout_seconds``;
    ``on_change`` is called after every successful listing (the tool set merges again).
    """

    kind = "MCP server"

    def __init__(
        self, settings: McpServerSettings, *, default_timeout_seconds: float, on_change: Callable[[], None]
    ) -> None:
        self.name = settings.name
        self.settings = settings
        self.timeout_seconds = settings.timeout_seconds or default_timeout_seconds
        self.client: Client | None = None
        self._tools: dict[str, McpTool] = {}
        self._on_change = on_change
        self._attempted = asyncio.Event()
        self._broken = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def tools(self) -> dict[str, McpTool]:
        """The tools of the last successful listing by name (empty before the first)."""
        return self._tools

    async def start(self) -> bool:
        """Start the session's task and wait for its first listing (``startup_timeout_seconds``);
        True when it worked. A server that fails or is slow is logged, not raised: its tools join
        once it is up."""
        self._task = asyncio.create_task(self._run(), name=f"MCP server {self.name}")
        timeout = self.settings.startup_timeout_seconds
        try:
            await asyncio.wait_for(self._attempted.wait(), timeout)
        except TimeoutError:
            log.warning("MCP server %r: not ready within %g s; its tools join once it is", self.name, timeout)
        return self.client is not None

    def mark_broken(self) -> None:
        """Close the session and start it again (a call found the connection closed)."""
        self._broken.set()

    async def aclose(self) -> None:
        """Close the session (ending a stdio server's process) and stop restarting it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _run(self) -> None:
        first, longest = RESTART_DELAYS_SECONDS
        delay = first
        while True:
            self._broken.clear()
            try:
                async with self._connect() as client:
                    await self._list(client)
                    self.client = client
                    self._attempted.set()
                    delay = first
                    while not self._broken.is_set():
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._broken.wait(), REFRESH_INTERVAL_SECONDS)
                        if not self._broken.is_set():
                            await self._list(client)
                    log.warning("MCP server %r: its connection closed; restarting it", self.name)
            except Exception as error:  # the SDK raises many kinds (and groups of them) for one failure
                log.warning(
                    "MCP server %r failed (%s: %s); starting it again in %g s",
                    self.name,
                    type(error).__name__,
                    error,
                    delay,
                )
            finally:
                self.client = None
                self._attempted.set()
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[Client]:
        settings = self.settings
        async with contextlib.AsyncExitStack() as stack:
            if settings.command is not None:
                parameters = StdioServerParameters(
                    command=settings.command, args=settings.args, env=settings.env or None, cwd=settings.cwd
                )
                transport: Any = stdio_client(parameters)
            else:
                assert settings.url is not None
                http = await stack.enter_async_context(
                    httpx2.AsyncClient(headers=settings.headers, timeout=HTTP_TIMEOUT)
                )
                transport = streamable_http_client(settings.url, http_client=http)
            client = Client(transport, cache=None)
            async with asyncio.timeout(settings.startup_timeout_seconds):
                await stack.enter_async_context(client)
            yield client

    async def _list(self, client: Client) -> None:
        tools: dict[str, McpTool] = {}
        cursor: str | None = None
        async with asyncio.timeout(self.settings.startup_timeout_seconds):
            for _ in range(MAX_LIST_PAGES):
                page = await client.list_tools(cursor=cursor)
                for listed in page.tools:
                    schema = dict(listed.input_schema or OBJECT_SCHEMA)
                    problem = listing_problem(listed.name, schema)
                    if problem is not None:
                        log.warning("MCP server %r: tool %r left out: %s", self.name, listed.name, problem)
                        continue
                    tools[listed.name] = McpTool(self, listed.name, listed.description or "", schema)
                cursor = page.next_cursor
                if cursor is None:
                    break
        changed = tools.keys() != self._tools.keys() or self.client is None
        self._tools = tools
        if changed:
            log.info("MCP server %r: %d tool(s): %s", self.name, len(tools), ", ".join(tools) or "none")
        self._on_change()

    def __repr__(self) -> str:
        return f"McpServer({self.name!r})"


class McpTool:
    """A tool of an :class:`McpServer` (see the module docstring); a ``turnwire.tools.Tool``.

    ``timeout_seconds`` is the server entry's ``timeout_seconds``, else the sidecar's tool timeout.
    Raises :class:`~turnwire.tools.ToolError` for an ``isError`` result (the text of its content),
    an MCP error, a transport failure (the session is then restarted) and a server that is not
    connected.
    """

    streaming = False

    def __init__(self, server: McpServer, name: str, description: str, input_schema: dict[str, Any]) -> None:
        self.server = server
        self.name = name
        self.description = description
        self.input_schema: Mapping[str, Any] = input_schema
        self.timeout_seconds = server.timeout_seconds

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any:
        """Call the tool on its server (see the class docstring)."""
        server = self.server
        client = server.client
        if client is None:
            raise ToolError(f"MCP server {server.name!r} is not connected (it is starting or restarting)")
        try:
            result = await client.call_tool(self.name, input)
        except MCPError as error:
            if error.code == CONNECTION_CLOSED:
                server.mark_broken()
            raise ToolError(f"MCP server {server.name!r}: {error.message}") from None
        except pydantic.ValidationError as error:
            raise ToolError(f"MCP server {server.name!r} sent an invalid result: {error}") from None
        except Exception as error:  # a transport failure: start the session again
            server.mark_broken()
            raise ToolError(
                f"MCP server {server.name!r} failed during the call: {type(error).__name__}: {error}"
            ) from None
        return output_of(result, self.name, server.name)

    def __repr__(self) -> str:
        return f"McpTool({self.name!r}, server={self.server.name!r})"


def output_of(result: CallToolResult, tool: str, server: str) -> Any:
    """The tool output of an MCP ``tools/call`` result (see the module docstring). Raises
    :class:`~turnwire.tools.ToolError` with the content's text for an ``isError`` result."""
    if result.is_error:
        text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
        raise ToolError(text or f"tool {tool!r} failed (MCP server {server!r})")
    if result.structured_content is not None:
        return result.structured_content
    if len(result.content) == 1 and isinstance(result.content[0], TextContent):
        return result.content[0].text
    return [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]
