"""One message must not freeze the server (issue 8, item 12), on a real ``turnwire serve`` process.

With the embedded defaults (model ``scripted:demo``, the demo tools), the
message ``what is 1+(((9**99)**99)**99)**99`` makes the model call the
calculator. Computed naively that is a number of about 300 million digits,
minutes of one uninterruptible C call on the event loop: health checks time
out and every other conversation stalls. Now the calculator refuses it at
once, and while that turn runs the health service and a turn on another
conversation answer promptly.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.sidecar import SidecarFactory

from turnwire_client import TurnwireClient, collect
from turnwire_client.v1 import event_pb2

T = TypeVar("T")

TOWER = "1+(((9**99)**99)**99)**99"

PROMPT_SECONDS = 2.0
"""How fast the health check and the other conversation's turn must answer (they take milliseconds)."""

DEADLINE_SECONDS = 10.0
"""gRPC deadline of every call, so a frozen server fails the test instead of hanging it."""


async def _timed(call: Awaitable[T]) -> tuple[T, float]:
    """What ``call`` returns, and how many seconds it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    result = await call
    return result, loop.time() - started


async def test_a_tower_of_powers_neither_freezes_health_checks_nor_other_conversations(
    sidecar_factory: SidecarFactory,
) -> None:
    sidecar = await sidecar_factory().start()  # no config: the embedded defaults
    async with (
        TurnwireClient(sidecar.target) as client,
        grpc.aio.insecure_channel(sidecar.target) as channel,
    ):
        health = health_pb2_grpc.HealthStub(channel)
        tower = client.chat("tower", f"what is {TOWER}", timeout=DEADLINE_SECONDS)
        seen: list[event_pb2.TurnEvent] = []
        try:
            async with asyncio.timeout(DEADLINE_SECONDS):
                # Until the calculator is called; anext, as leaving an `async for` would cancel.
                while not (event := await anext(tower)).HasField("tool_input_available"):
                    seen.append(event)
                seen.append(event)
        except TimeoutError:
            kinds = [e.WhichOneof("event") for e in seen]
            pytest.fail(f"the server sent nothing more for {DEADLINE_SECONDS:g} s after {kinds}: it froze")
        # The calculator has the expression now; meanwhile the server answers the others.
        (check, check_seconds), (other, other_seconds) = await asyncio.gather(
            _timed(health.Check(health_pb2.HealthCheckRequest(), timeout=DEADLINE_SECONDS)),
            _timed(collect(client.chat("other", "what is 6*7", timeout=DEADLINE_SECONDS))),
        )
        rest = [event async for event in tower]

    assert check.status == health_pb2.HealthCheckResponse.SERVING
    assert check_seconds < PROMPT_SECONDS, f"the health check took {check_seconds:.2f} s"
    assert other.status == event_pb2.TURN_STATUS_COMPLETED
    assert "6*7 = 42" in other.text
    assert other_seconds < PROMPT_SECONDS, f"the other conversation's turn took {other_seconds:.2f} s"

    # The tower's turn goes on: the model reads the calculator's refusal and answers.
    events = seen + rest
    (call,) = [e.tool_input_available for e in events if e.HasField("tool_input_available")]
    assert call.tool_name == "calculator"
    (error,) = [e.tool_output_error for e in events if e.HasField("tool_output_error")]
    assert error.error_text.startswith("number too large: the result would have about 9,353 digits")
    end = events[-1].turn_end
    assert end.status == event_pb2.TURN_STATUS_COMPLETED
    answer = "".join(part.text.text for part in end.message.parts if part.HasField("text"))
    assert "The calculator tool failed: number too large" in answer
