"""The remote middleware's tests (``test_remote_hooks.py``) again, with the hook server offering
the ``HookSession`` stream: the same order, contents, decisions, deadlines, failure modes and
breaker when a turn's hook calls are messages of one stream (docs/semantics.md §4, remote
middleware), plus what only the stream does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from support.hook_server import RecordingHookServer

from test_remote_hooks import *  # noqa: F403  # every test of the unary path, collected again here


@pytest.fixture(autouse=True)
def _hook_session() -> Iterator[None]:
    RecordingHookServer.default_hook_session = True
    yield
    RecordingHookServer.default_hook_session = False
