"""A test-only tool and middleware whose errors quote a secret, as a tool calling an upstream API
with a bad key would (``tests/e2e/test_secrets_e2e.py``): loaded by a real server as
``support.leaky_tools:fetch`` and ``support.leaky_tools:LeakyPolicy``.

The secret is the value of the variable ``LEAKY_TOOL_KEY`` in the server's environment.
"""

from __future__ import annotations

import os

from pydantic import BaseModel

from turnwire.hooks import Middleware, TurnConfig, TurnContext
from turnwire.tools import ToolError, ToolExecution, tool


class FetchInput(BaseModel):
    url: str


@tool(FetchInput)
async def fetch(args: FetchInput, execution: ToolExecution) -> dict[str, str]:
    """Fail as an upstream API refusing its key does, quoting the key."""
    key = os.environ["LEAKY_TOOL_KEY"]
    raise ToolError(f"GET {args.url}: 401 Incorrect API key provided: {key}. Authorization: Bearer {key}")


class LeakyPolicy(Middleware):
    """A ``before_turn`` that fails as a policy lookup with a bad credential does, quoting the
    configured key and a password: loaded as ``support.leaky_tools:LeakyPolicy``, only for a
    request whose ``body`` asks (``{"leak": true}``)."""

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        if ctx.body.get("leak"):
            key = os.environ["LEAKY_TOOL_KEY"]
            raise RuntimeError(f"policy db refused: password=hunter2-db-pass, api_key={key}")
        return None
