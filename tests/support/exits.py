"""Test-only middlewares that make their server process exit on its own, as a crash does: for the
supervisor's restart tests (``serve --workers N``, ``support.exits:ExitsSoon``) and for a crash
right after a turn's end is stored (``support.exits:ExitsAfterTurnEnd``, the detached sub-agent
tests); loaded with ``PYTHONPATH`` set as :func:`support.hooks.pythonpath_env` does."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from support.waiting import wait_until
from turnwire.hooks import ChatResponseContext, Middleware, SessionConfig, SessionContext


class ExitsSoon(Middleware):
    """``configure_session`` (once, at start): the process exits with status 3 ``seconds`` later,
    without stopping gracefully, as a crash does."""

    def __init__(self, seconds: float = 3.0) -> None:
        self.seconds = seconds

    async def configure_session(self, ctx: SessionContext) -> SessionConfig | None:
        """Schedule the exit; configures nothing."""
        asyncio.get_running_loop().call_later(self.seconds, os._exit, 3)
        return None


class ExitsAfterTurnEnd(Middleware):
    """``on_chat_response``: once the file ``go_file`` exists (the test creates it when it is
    ready for the crash), the process exits with status 3, without stopping. The hook runs after
    the turn's end is stored (``Store.finish_turn``) and before anything that follows the turn
    (its TurnEnd sent, a detached sub-agent's answer submitted; docs/semantics.md §4), so the
    crash lands exactly between the two."""

    def __init__(self, go_file: str) -> None:
        self.go_file = Path(go_file)

    async def on_chat_response(self, ctx: ChatResponseContext) -> None:
        """Wait for the go, then exit; a crash leaves nothing flushed or stopped."""
        await wait_until(self.go_file.exists, timeout=120, what="the test's go to crash")
        os._exit(3)
