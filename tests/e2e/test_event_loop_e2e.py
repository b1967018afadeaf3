"""The event loop a real ``turnwire serve`` runs on (``event_loop``, docs/operate/workers.md):
the start-up line names the loop read from the running process, so these tests see what ran,
not what was asked for."""

from __future__ import annotations

import re

import pytest
from support.sidecar import SidecarFactory, run_turnwire

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

LISTENING = re.compile(r"turnwire listening on .*, event loop (\w+)\)")


@pytest.mark.parametrize(
    ("config", "env", "expected"),
    [
        ({}, {}, "uvloop"),  # auto: uvloop is a runtime dependency on Linux
        ({"event_loop": "asyncio"}, {}, "asyncio"),
        ({"event_loop": "asyncio"}, {"TURNWIRE_EVENT_LOOP": "uvloop"}, "uvloop"),  # environment beats file
    ],
    ids=["auto", "asyncio", "uvloop-from-env"],
)
async def test_serve_runs_on_the_configured_event_loop(
    sidecar_factory: SidecarFactory, config: dict[str, str], env: dict[str, str], expected: str
) -> None:
    sidecar = await sidecar_factory(config=config, env=env).start()
    async with TurnwireClient(sidecar.target) as client:
        done = await collect(client.chat("loop-1", "hello", request_id="req-loop"))
    assert done.status == event_pb2.TURN_STATUS_COMPLETED
    assert await sidecar.terminate() == 0
    assert LISTENING.findall(sidecar.log_text()) == [expected], sidecar.log_text()


async def test_an_unknown_event_loop_is_a_configuration_error() -> None:
    result = await run_turnwire("config", "show", env={"TURNWIRE_EVENT_LOOP": "trio"})
    assert result.code == 2
    assert "event_loop" in result.stderr
