"""A tiny MCP server for end-to-end tests, on the official SDK (``MCPServer``, mcp 2's FastMCP).

Run as ``python tests/support/mcp_tools.py RECORD_FILE`` (stdio) or ``... RECORD_FILE --http PORT``
(streamable HTTP at ``/mcp``). ``--legacy`` (with ``--http``) answers as a server of the 2025
protocol revisions does, as servers on older SDKs still do: it refuses the stateless 2026 era
(HTTP 400), so a client falls back to the ``initialize`` handshake and gets a session
(``Mcp-Session-Id``, forgotten when the process ends) and SSE responses.

Tools: ``add_big(a, b)`` (exact integers), ``refuse(reason)`` (an ``isError`` result), ``wait()``
(waits until cancelled and appends ``cancelled`` to the record file), ``exit_now()`` (the process
exits mid-call), ``pid()`` and ``text(size)`` (``size`` characters; the SDK sends them twice in one
result: a text block and ``structuredContent``), ``sales_chart()`` (the content blocks of
``tests/providers/cases_extra/mcp/tool_result_media.json``: text, an image, audio, a PDF and a text
resource, a resource link), ``idempotency_key()`` (the ``dev.turnwire/idempotency-key`` of the
call's ``_meta``, "" when none), ``charge()`` (annotated ``idempotentHint``: appends ``charge
<key>`` to the record file; waits until cancelled unless that key was recorded before, so a
call a crash interrupted answers when it is run again).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
from pathlib import Path
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, ToolAnnotations
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

app = MCPServer("turnwire-test-tools")
RECORD: list[Path] = []  # the record file, set by main()


def _note(line: str) -> None:
    with RECORD[0].open("a") as file:
        file.write(line + "\n")


@app.tool()
def add_big(a: int, b: int) -> dict[str, int]:
    """Add two integers exactly."""
    return {"sum": a + b}


@app.tool()
def idempotency_key(ctx: Context) -> str:
    """The idempotency key the client put in the call's ``_meta``."""
    meta: Any = ctx.request_context.meta or {}
    return str(meta.get("dev.turnwire/idempotency-key", ""))


@app.tool(annotations=ToolAnnotations(idempotent_hint=True))
async def charge(ctx: Context) -> str:
    """An idempotent effect keyed by the call's idempotency key."""
    meta: Any = ctx.request_context.meta or {}
    key = str(meta.get("dev.turnwire/idempotency-key", ""))
    seen = RECORD[0].exists() and f"charge {key}" in RECORD[0].read_text().splitlines()
    _note(f"charge {key}")
    if not seen:
        await asyncio.Event().wait()
    return f"charged {key}"


@app.tool()
def refuse(reason: str) -> str:
    """Always fails with ``reason``."""
    raise ToolError(reason)


@app.tool()
async def wait() -> str:
    """Waits until cancelled."""
    _note("started")
    try:
        await asyncio.Event().wait()
    except BaseException:
        _note("cancelled")
        raise
    return "never"


@app.tool()
def exit_now() -> str:
    """The server process exits mid-call."""
    os._exit(3)


@app.tool()
def pid() -> int:
    """The server's process id."""
    return os.getpid()


@app.tool()
def text(size: int) -> str:
    """``size`` characters."""
    return "x" * size


MEDIA_CASE = (
    Path(__file__).resolve().parents[1] / "providers" / "cases_extra" / "mcp" / "tool_result_media.json"
)


@app.tool()
def sales_chart() -> CallToolResult:
    """A chart: the media case's content blocks, as the case's MCP server answered."""
    return CallToolResult.model_validate(json.loads(MEDIA_CASE.read_text())["mcp_response"]["result"])


def handshake_era_only(inner: Any) -> Any:
    """ASGI middleware: a request of a protocol revision past the 2025 ones gets the 400 a server on
    an older SDK gives ("Unsupported protocol version"); every other request goes to ``inner``."""

    async def asgi(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers") or ())
        version = headers.get(b"mcp-protocol-version")
        if (
            scope["type"] == "http"
            and version is not None
            and version.decode() not in HANDSHAKE_PROTOCOL_VERSIONS
        ):
            body = json.dumps(
                {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": "Unsupported protocol version"},
                }
            ).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 400,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await inner(scope, receive, send)

    return asgi


def main() -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("record", type=Path)
    parser.add_argument("--http", type=int, default=None)
    parser.add_argument("--legacy", action="store_true")
    args = parser.parse_args()
    RECORD.append(args.record)
    if args.http is None:
        app.run()
    elif args.legacy:
        uvicorn.run(
            handshake_era_only(app.streamable_http_app()),
            host="127.0.0.1",
            port=args.http,
            log_level="warning",
        )
    else:
        app.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
