"""The kit conformance fixture (clients/conformance/kits/SPEC.md) on the Python kit, ``turnwire.kit``.

Usage: ``python clients/conformance/kits/python/fixture.py --port N --journal PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from pydantic import BaseModel, ConfigDict

from turnwire.kit import HookServer, allow, block, call_info, run, tool_input, tool_output
from turnwire.tools import ToolError, ToolExecution, tool
from turnwire_client.v1 import event_pb2, hooks_pb2

READY = "turnwire-kit-fixture listening on 127.0.0.1:{port}"
SLEEP_SECONDS = 30.0  # a "sleep" hook waits this long at most (the sidecar's deadline comes first)
SLOW_SECONDS = 60.0  # the slow tool waits this long at most (the cancellation comes first)
BIG = 18446744073709551616  # 2^64: the stream tool's results carry integers beyond 2^53


class Journal:
    """The JSON-lines journal: one whole line per record, flushed before the caller goes on."""

    path = Path("journal.jsonl")

    def start(self, path: Path) -> None:
        """Write to ``path``, emptied first."""
        self.path = path
        path.write_text("")

    def write(self, event: str, **members: Any) -> None:
        """Append ``{"event": event, **members}``."""
        with self.path.open("a") as out:
            out.write(json.dumps({"event": event, **members}, separators=(",", ":")) + "\n")


journal = Journal()  # main() points it at --journal


def _controls(turn: hooks_pb2.TurnInfo) -> dict[str, Any]:
    """``body.fixture``: what the turn asks the fixture's hooks to do (SPEC.md §2)."""
    controls = json_format.MessageToDict(turn.body).get("fixture", {})
    return controls if isinstance(controls, dict) else {}


async def _misbehave(controls: dict[str, Any], hook: str) -> None:
    """Sleep past the sidecar's deadline, or fail, when the turn asks ``hook`` to."""
    if controls.get(hook) == "sleep":
        await asyncio.sleep(SLEEP_SECONDS)
    elif controls.get(hook) == "fail":
        raise RuntimeError(f"fixture: {hook} failed on purpose")


class FixtureHooks(HookServer):
    """The hooks of SPEC.md §2."""

    observed_hooks = frozenset({"before_step"})

    async def before_turn(self, request: hooks_pb2.BeforeTurnRequest) -> hooks_pb2.BeforeTurnResponse | None:
        journal.write(
            "before_turn",
            request_id=request.turn.request_id,
            system=request.system,
            attempt=request.turn.attempt,
            parent_request_id=call_info().parent_request_id,
        )
        controls = _controls(request.turn)
        await _misbehave(controls, "before_turn")
        system = controls.get("system")
        return hooks_pb2.BeforeTurnResponse(system=system) if isinstance(system, str) else None

    async def before_step(self, request: hooks_pb2.BeforeStepRequest) -> None:
        journal.write("before_step", request_id=request.turn.request_id, step_number=request.step_number)

    async def before_tool_call(
        self, request: hooks_pb2.BeforeToolCallRequest
    ) -> hooks_pb2.BeforeToolCallResponse | None:
        input = tool_input(request.call)
        journal.write(
            "before_tool_call",
            request_id=request.turn.request_id,
            tool_call_id=request.call.tool_call_id,
            tool_name=request.call.tool_name,
            input=input,
        )
        await _misbehave(_controls(request.turn), "before_tool_call")
        if request.call.tool_name == "echo" and input.get("text") == "blocked":
            return block('echo refused: "blocked" is not allowed')
        if request.call.tool_name == "echo" and input.get("text") == "secret":
            return allow({**input, "text": "[redacted]"})
        return None

    async def after_tool_call(self, request: hooks_pb2.AfterToolCallRequest) -> None:
        journal.write(
            "after_tool_call",
            request_id=request.turn.request_id,
            tool_call_id=request.call.tool_call_id,
            tool_name=request.call.tool_name,
            success=request.success,
            outcome=hooks_pb2.ToolCallOutcome.Name(request.outcome).removeprefix("TOOL_CALL_OUTCOME_"),
            output=tool_output(request),
            error=request.error,
        )

    async def on_step_finish(self, request: hooks_pb2.OnStepFinishRequest) -> None:
        journal.write(
            "on_step_finish",
            request_id=request.turn.request_id,
            step_number=request.step.step_number,
            tool_names=list(request.step.tool_names),
            text=request.text,
        )

    async def on_chunks(self, turn: hooks_pb2.TurnInfo, events: AsyncIterator[event_pb2.TurnEvent]) -> None:
        kinds = [event.WhichOneof("event") async for event in events]
        journal.write("on_chunks", request_id=turn.request_id, kinds=kinds)

    async def on_chat_response(self, request: hooks_pb2.OnChatResponseRequest) -> None:
        journal.write(
            "on_chat_response",
            request_id=request.turn.request_id,
            outcome=hooks_pb2.TurnOutcome.Name(request.outcome).removeprefix("TURN_OUTCOME_"),
        )


class _Input(BaseModel):
    model_config = ConfigDict(extra="allow")


def _started(name: str, input: BaseModel, execution: ToolExecution) -> None:
    journal.write(
        "tool_call",
        request_id=execution.request_id,
        tool_call_id=execution.tool_call_id,
        tool_name=name,
        idempotency_key=execution.idempotency_key,
        input=input.model_dump(mode="json", exclude_unset=True),
    )


class EchoInput(_Input):
    text: str
    big: int = 0
    nested: dict[str, Any] = {}


@tool(EchoInput)
async def echo(input: EchoInput, execution: ToolExecution) -> dict[str, Any]:
    """Return the input object as received."""
    _started("echo", input, execution)
    return {"echo": input.model_dump(mode="json", exclude_unset=True)}


class StreamInput(_Input):
    count: int


@tool(StreamInput, name="stream")
async def stream_tool(input: StreamInput, execution: ToolExecution) -> Any:
    """Send `count` preliminary results, then the final one."""
    _started("stream", input, execution)
    for index in range(1, input.count + 1):
        yield {"index": index, "big": BIG + index}
    yield {"done": input.count}


class SlowInput(_Input):
    pass


@tool(SlowInput)
async def slow(input: SlowInput, execution: ToolExecution) -> dict[str, Any]:
    """Wait until cancelled."""
    _started("slow", input, execution)
    try:
        await asyncio.sleep(SLOW_SECONDS)
    except asyncio.CancelledError:
        journal.write(
            "tool_cancelled",
            request_id=execution.request_id,
            tool_call_id=execution.tool_call_id,
            tool_name="slow",
        )
        raise
    return {"finished": True}


class FailInput(_Input):
    reason: str


@tool(FailInput)
async def fail(input: FailInput, execution: ToolExecution) -> Any:
    """Fail with the reason given."""
    _started("fail", input, execution)
    raise ToolError(f"fixture tool failed: {input.reason}")


def main() -> None:
    """Parse the flags, serve until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--journal", type=Path, required=True)
    args = parser.parse_args()
    journal.start(args.journal)
    asyncio.run(
        run(
            f"127.0.0.1:{args.port}",
            hooks=FixtureHooks(),
            tools=[echo, stream_tool, slow, fail],
            ready=lambda port: print(READY.format(port=port), flush=True),
        )
    )


if __name__ == "__main__":
    main()
