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

Streamable HTTP sessions: a server that restarted (or dropped the session) answers the old
``Mcp-Session-Id`` with HTTP 404, and the client must then initialize a new session
(https://modelcontextprotocol.io/specification/2025-06-18/basic/transports#session-management).
A call that meets that 404 starts the new session at once (no backoff) and is sent once more on it:
the server refused it before running it, so sending it again cannot run it twice. One result arrives
as one SSE event that carries it twice (the text block and ``structuredContent``), so the SDK's
event size limit (1 MiB by default) is raised to :func:`sse_event_limit` of the sidecar's
``limits.max_tool_output_bytes``: every result the sidecar would keep fits.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx2
import pydantic
from mcp import Client, StdioServerParameters, stdio_client
from mcp.client.streamable_http import DEFAULT_MAX_SSE_EVENT_SIZE, MCP_SESSION_ID, streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult, TextContent

from turnwire.tools import ToolError, ToolExecution
from turnwire_server.event_waits import set_within
from turnwire_server.tools.listing import OBJECT_SCHEMA, listing_problem
from turnwire_server.tools.settings import McpServerSettings

log = logging.getLogger("turnwire.tools")

IDEMPOTENCY_META = "dev.turnwire/idempotency-key"
"""The ``_meta`` key of a ``tools/call`` that carries the call's idempotency key (MCP's ``_meta``
keys take a reverse-DNS prefix; a server may ignore it: docs/tools.md, "Idempotency keys")."""

REFRESH_INTERVAL_SECONDS = 60.0
"""How often an open session lists its tools again (a failed listing restarts the session)."""

RESTART_DELAYS_SECONDS = (0.5, 30.0)
"""The first and the longest wait before a failed session is started again (doubling)."""

MAX_LIST_PAGES = 100
"""Pages of ``tools/list`` read at most (a server whose cursor never ends cannot hang start-up)."""

HTTP_TIMEOUT = httpx2.Timeout(30.0, read=300.0)
"""Streamable HTTP: 30 s to connect and write, 300 s between reads (a response may stream)."""


def sse_event_limit(max_result_bytes: int) -> int:
    """Bytes one SSE event of a streamable HTTP session may hold, for results of up to
    ``max_result_bytes`` bytes of JSON (``limits.max_tool_output_bytes``): four times that (the
    result comes as a text block, JSON-escaped once more, and as ``structuredContent``) plus 64 KiB
    for the envelope, never below the SDK's default (1 MiB)."""
    return max(DEFAULT_MAX_SSE_EVENT_SIZE, 4 * max_result_bytes + (64 << 10))


@dataclass(slots=True)
class McpSession:
    """One open session: the SDK ``client`` and ``expired``, set when the server answered a request
    carrying this session's ``Mcp-Session-Id`` with 404 (it no longer knows the session)."""

    client: Client
    expired: asyncio.Event = field(default_factory=asyncio.Event)


class _SessionExpired(Exception):
    """A call met the 404 of an expired session (internal: the call is sent again once)."""


class McpServer:
    """One MCP server (see the module docstring).

    ``default_timeout_seconds`` bounds a call when the entry sets no ``timeout_seconds``;
    ``max_result_bytes`` is the sidecar's ``limits.max_tool_output_bytes`` (it sizes the SSE event
    limit, :func:`sse_event_limit`); ``on_change`` is called after every successful listing (the
    tool set merges again).
    """

    kind = "MCP server"

    def __init__(
        self,
        settings: McpServerSettings,
        *,
        default_timeout_seconds: float,
        max_result_bytes: int,
        on_change: Callable[[], None],
    ) -> None:
        self.name = settings.name
        self.settings = settings
        self.timeout_seconds = settings.timeout_seconds or default_timeout_seconds
        self.max_sse_event_bytes = sse_event_limit(max_result_bytes)
        self.session: McpSession | None = None
        self._tools: dict[str, McpTool] = {}
        self._on_change = on_change
        self._attempted = asyncio.Event()
        self._broken = asyncio.Event()
        self._restart_now = False
        self._changed = asyncio.Event()  # set (and replaced) whenever ``session`` changes
        self._task: asyncio.Task[None] | None = None

    @property
    def client(self) -> Client | None:
        """The open session's SDK client (None while starting or restarting)."""
        return self.session.client if self.session is not None else None

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
        if not await set_within(self._attempted, timeout):
            log.warning("MCP server %r: not ready within %g s; its tools join once it is", self.name, timeout)
        return self.client is not None

    def mark_broken(self) -> None:
        """Close the session and start it again (a call found the connection closed)."""
        self._broken.set()

    async def renewed(self, old: McpSession) -> McpSession | None:
        """A new session in place of ``old``, whose id the server no longer knows: starts it at once
        (no backoff) unless another call did, and waits for it up to ``startup_timeout_seconds``.
        None when none opened in that time."""
        if self.session is old:
            self._restart_now = True
            self._broken.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.startup_timeout_seconds):
                while True:
                    changed = self._changed
                    session = self.session
                    if session is not None and session is not old:
                        return session
                    await changed.wait()
        return None

    def _set_session(self, session: McpSession | None) -> None:
        self.session = session
        self._changed.set()
        self._changed = asyncio.Event()

    async def aclose(self) -> None:
        """Close the session (ending a stdio server's process) and stop restarting it."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task})  # cancelled itself (the stop's deadline): returns at once

    async def _run(self) -> None:
        first, longest = RESTART_DELAYS_SECONDS
        delay = first
        while True:
            self._broken.clear()
            try:
                async with self._connect() as session:
                    client = session.client
                    await self._list(client)
                    self._set_session(session)
                    self._attempted.set()
                    delay = first
                    while not self._broken.is_set():
                        await set_within(self._broken, REFRESH_INTERVAL_SECONDS)
                        if not self._broken.is_set():
                            await self._list(client)
                    log.warning("MCP server %r: its connection closed; restarting it", self.name)
            except Exception as error:  # the SDK raises many kinds (and groups of them) for one failure
                log.warning(
                    "MCP server %r failed (%s); starting it again in %g s", self.name, _causes(error), delay
                )
            finally:
                if self.session is not None:
                    self._set_session(None)
                self._attempted.set()
            if self._restart_now:  # the server dropped the session but is up: a new one at once
                self._restart_now = False
                continue
            await asyncio.sleep(delay)
            delay = min(delay * 2, longest)

    @contextlib.asynccontextmanager
    async def _connect(self) -> AsyncIterator[McpSession]:
        settings = self.settings
        expired = asyncio.Event()
        async with contextlib.AsyncExitStack() as stack:
            if settings.command is not None:
                parameters = StdioServerParameters(
                    command=settings.command, args=settings.args, env=settings.env or None, cwd=settings.cwd
                )
                transport: Any = stdio_client(parameters)
            else:
                assert settings.url is not None

                async def on_response(response: httpx2.Response) -> None:
                    # The SDK reports this 404 as a JSON-RPC error ("Session not found" or
                    # "Session terminated"); the status on a request with a session id is the signal.
                    if response.status_code == 404 and MCP_SESSION_ID in response.request.headers:
                        expired.set()

                http = await stack.enter_async_context(
                    httpx2.AsyncClient(
                        headers=settings.headers,
                        timeout=HTTP_TIMEOUT,
                        event_hooks={"response": [on_response]},
                    )
                )
                transport = streamable_http_client(
                    settings.url, http_client=http, max_sse_event_size=self.max_sse_event_bytes
                )
            client = Client(transport, cache=None)
            async with asyncio.timeout(settings.startup_timeout_seconds):
                await stack.enter_async_context(client)
            yield McpSession(client, expired)

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
                    tools[listed.name] = McpTool(
                        self,
                        listed.name,
                        listed.description or "",
                        schema,
                        idempotent=mcp_tool_idempotent(listed),
                    )
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


def mcp_tool_idempotent(listed: Any) -> bool:
    """Whether a listed MCP tool (an ``mcp_types.Tool``) declares that calling it again has no
    further effect: its ``annotations`` say ``readOnlyHint`` (no effect at all) or
    ``idempotentHint`` (MCP's "calling it repeatedly with the same arguments has no additional
    effect"). Annotations are hints a server gives; the sidecar trusts the servers its config
    names (docs/semantics.md §8, "Tool effects")."""
    annotations = getattr(listed, "annotations", None)
    if annotations is None:
        return False
    return (
        getattr(annotations, "read_only_hint", None) is True
        or getattr(annotations, "idempotent_hint", None) is True
    )


class McpTool:
    """A tool of an :class:`McpServer` (see the module docstring); a ``turnwire.tools.Tool``.

    ``timeout_seconds`` is the server entry's ``timeout_seconds``, else the sidecar's tool timeout;
    ``idempotent`` what the listing's annotations say (:func:`mcp_tool_idempotent`).
    Raises :class:`~turnwire.tools.ToolError` for an ``isError`` result (the text of its content),
    an MCP error, a transport failure (the session is then restarted) and a server that is not
    connected. A call refused because the server no longer knows the session (HTTP 404) is sent
    once more on a new session (:meth:`McpServer.renewed`).
    """

    streaming = False

    def __init__(
        self,
        server: McpServer,
        name: str,
        description: str,
        input_schema: dict[str, Any],
        *,
        idempotent: bool = False,
    ) -> None:
        self.server = server
        self.idempotent = idempotent
        self.name = name
        self.description = description
        self.input_schema: Mapping[str, Any] = input_schema
        self.timeout_seconds = server.timeout_seconds

    async def execute(self, input: dict[str, Any], execution: ToolExecution) -> Any:
        """Call the tool on its server (see the class docstring)."""
        server = self.server
        session = server.session
        if session is None:
            raise ToolError(f"MCP server {server.name!r} is not connected (it is starting or restarting)")
        try:
            return await self._call(session, input, execution.idempotency_key)
        except _SessionExpired:
            log.info(
                "MCP server %r: its session expired (HTTP 404); calling %r on a new one",
                server.name,
                self.name,
            )
        renewed = await server.renewed(session)
        if renewed is None:
            raise ToolError(
                f"MCP server {server.name!r} no longer knows its session and no new session opened within "
                f"{server.settings.startup_timeout_seconds:g} s"
            )
        try:
            return await self._call(renewed, input, execution.idempotency_key)
        except _SessionExpired:
            raise ToolError(f"MCP server {server.name!r} refused a new session as expired") from None

    async def _call(self, session: McpSession, input: dict[str, Any], idempotency_key: str) -> Any:
        """One ``tools/call`` on ``session``, the call's ``idempotency_key`` in the request's
        ``_meta`` (:data:`IDEMPOTENCY_META`); raises :class:`_SessionExpired` for its 404."""
        server = self.server
        meta: Any = {IDEMPOTENCY_META: idempotency_key} if idempotency_key else None
        try:
            result = await session.client.call_tool(self.name, input, meta=meta)
        except MCPError as error:
            if session.expired.is_set():
                raise _SessionExpired from None
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


def _causes(error: BaseException) -> str:
    """``error`` as ``Type: message``; a group as its leaf errors', ``; ``-separated (the SDK's
    task groups wrap the one error that says what failed)."""
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_causes(inner) for inner in error.exceptions)
    return f"{type(error).__name__}: {error}"
