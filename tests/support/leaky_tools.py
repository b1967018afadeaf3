"""A test-only tool whose error quotes a secret, as a tool calling an upstream API with a bad key
would (``tests/e2e/test_secrets_e2e.py``): loaded by a real server as ``support.leaky_tools:fetch``.

The secret is the value of the variable ``LEAKY_TOOL_KEY`` in the server's environment.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from turnwire.tools import ToolError, ToolExecution, tool


class FetchInput(BaseModel):
    url: str


@tool(FetchInput)
async def fetch(args: FetchInput, execution: ToolExecution) -> dict[str, str]:
    """Fail as an upstream API refusing its key does, quoting the key."""
    key = os.environ["LEAKY_TOOL_KEY"]
    raise ToolError(f"GET {args.url}: 401 Incorrect API key provided: {key}. Authorization: Bearer {key}")
