"""A ``configure_session`` that raises at start-up is named once: the hook's error already says
which middleware and hook failed (``Policy.configure_session failed: …``), so the start-up error
and a sub-agent's configuration error do not say "configure_session failed" twice (kit trial:
``configure_session failed: orders-policy.configure_session failed: cannot ask …``)."""

from __future__ import annotations

import pytest

from turnwire.hooks import Middleware, SessionConfig, SessionContext
from turnwire_server.assembly import StartupError, configure_session
from turnwire_server.config import Settings
from turnwire_server.hooks.chain import MiddlewareChain, session_failure
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.tools.tool_set import ToolSet


class Policy(Middleware):
    """A middleware whose start-up asks a store that is down."""

    async def configure_session(self, ctx: SessionContext) -> SessionConfig | None:
        raise RuntimeError("cannot ask the policy store")


async def test_a_hook_that_fails_at_start_up_is_named_once() -> None:
    with pytest.raises(StartupError) as failed:
        await configure_session(Settings(), MiddlewareChain([Policy()]), ProviderRegistry({}), ToolSet({}))
    assert str(failed.value) == "Policy.configure_session failed: cannot ask the policy store"


def test_an_error_of_the_chains_own_check_keeps_the_hooks_name() -> None:
    # Not a hook's error (the chain refusing an answer of the wrong type): the prefix says where.
    assert session_failure(TypeError("returned dict")) == "configure_session failed: returned dict"
