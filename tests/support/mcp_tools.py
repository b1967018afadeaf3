"""A tiny MCP server for end-to-end tests, on the official SDK (``MCPServer``, mcp 2's FastMCP).

Run as ``python tests/support/mcp_tools.py RECORD_FILE`` (stdio) or ``... RECORD_FILE --http PORT``
(streamable HTTP at ``/mcp``). Tools: ``add_big(a, b)`` (exact integers), ``refuse(reason)`` (an
``isError`` result), ``wait()`` (waits until cancelled and appends ``cancelled`` to the record
file), ``exit_now()`` (the process exits mid-call) and ``pid()``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

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


def main() -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("record", type=Path)
    parser.add_argument("--http", type=int, default=None)
    args = parser.parse_args()
    RECORD.append(args.record)
    if args.http is None:
        app.run()
    else:
        app.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
