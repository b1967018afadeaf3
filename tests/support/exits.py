"""A test-only middleware that makes its server process exit on its own, for the supervisor's
restart tests (``serve --workers N``); loaded as ``support.exits:ExitsSoon`` with ``PYTHONPATH``
set as :func:`support.hooks.pythonpath_env` does."""

from __future__ import annotations

import asyncio
import os

from turnwire.hooks import Middleware, SessionConfig, SessionContext


class ExitsSoon(Middleware):
    """``configure_session`` (once, at start): the process exits with status 3 ``seconds`` later,
    without stopping gracefully, as a crash does."""

    def __init__(self, seconds: float = 3.0) -> None:
        self.seconds = seconds

    async def configure_session(self, ctx: SessionContext) -> SessionConfig | None:
        """Schedule the exit; configures nothing."""
        asyncio.get_running_loop().call_later(self.seconds, os._exit, 3)
        return None
