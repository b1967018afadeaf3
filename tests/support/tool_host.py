"""A ToolExecutorService host for end-to-end tests: a real process on grpc.aio.

Run as ``python tests/support/tool_host.py --port N --record FILE [--sidecar HOST:PORT]
[--variant 2]``; tests use :class:`ToolHostProcess`. Every call appends one JSON line to the
record file when it starts, ends, is cancelled or calls back (``{"event": "started", "tool": ...,
"tool_call_id": ..., "parent": <turnwire-parent-request-id>, "traceparent": ..., "input_json": ...,
"idempotency_key": ...}``),
so a test sees from outside what the host saw, the cancellation of its handler included.

Tools (``--variant 2`` adds ``added_after_restart``):

- ``add_big(a, b)``: ``{"sum": a + b}``, computed on the exact integers of the input text;
- ``count(to)``: preliminary results ``{"i": 1}`` … ``{"i": to - 1}``, then ``{"done": to}``;
- ``wait()``: waits until cancelled (it records ``started`` first, ``cancelled`` then);
- ``quick_deadline()``: declares a 0.3 s timeout and waits forever;
- ``fail(reason)``: the error ``reason``;
- ``guarded()``: needs the client's approval; ``{"guarded": "ran"}``;
- ``get_weather(city)``: overrides the demo tool: ``{"city": city, "source": "tool host"}``;
- ``callback(conversation_id)``: a blocking ``Chat`` on that conversation with the parent request id
  it received, and returns ``{"status": <the gRPC code's name>}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2, struct_pb2

from turnwire_client.v1 import (
    chat_service_pb2,
    chat_service_pb2_grpc,
    message_pb2,
    tools_pb2,
    tools_pb2_grpc,
)

PARENT = "turnwire-parent-request-id"


def _schema(properties: dict[str, Any], required: list[str]) -> struct_pb2.Struct:
    schema = struct_pb2.Struct()
    schema.update({"type": "object", "properties": properties, "required": required})
    return schema


def tool_specs(variant: int) -> list[tools_pb2.ToolSpec]:
    """The host's tools (see the module docstring)."""
    integer, string = {"type": "integer"}, {"type": "string"}
    specs = [
        tools_pb2.ToolSpec(
            name="add_big",
            description="Add two integers exactly.",
            input_schema=_schema({"a": integer, "b": integer}, ["a", "b"]),
        ),
        tools_pb2.ToolSpec(
            name="count", description="Count up, streaming.", input_schema=_schema({"to": integer}, ["to"])
        ),
        tools_pb2.ToolSpec(name="wait", description="Wait until cancelled.", input_schema=_schema({}, [])),
        tools_pb2.ToolSpec(
            name="quick_deadline",
            description="Waits forever; may run 0.3 s.",
            input_schema=_schema({}, []),
            timeout=duration_pb2.Duration(nanos=300_000_000),
        ),
        tools_pb2.ToolSpec(
            name="fail", description="Fails.", input_schema=_schema({"reason": string}, ["reason"])
        ),
        tools_pb2.ToolSpec(
            name="guarded",
            description="Needs approval.",
            input_schema=_schema({}, []),
            requires_approval=True,
        ),
        tools_pb2.ToolSpec(
            name="get_weather", description="Weather.", input_schema=_schema({"city": string}, ["city"])
        ),
        tools_pb2.ToolSpec(
            name="callback",
            description="Chat on a conversation.",
            input_schema=_schema({"conversation_id": string}, ["conversation_id"]),
        ),
    ]
    if variant >= 2:
        specs.append(
            tools_pb2.ToolSpec(name="added_after_restart", description="New.", input_schema=_schema({}, []))
        )
    return specs


class Executor(tools_pb2_grpc.ToolExecutorServiceServicer):
    """The servicer (see the module docstring)."""

    def __init__(self, record: Path, variant: int, sidecar: str | None) -> None:
        self.record = record
        self.variant = variant
        self.sidecar = sidecar
        self.instance_id = uuid.uuid4().hex

    def _note(self, event: str, request: tools_pb2.ExecuteToolRequest, **extra: Any) -> None:
        line = {"event": event, "tool": request.tool_name, "tool_call_id": request.tool_call_id, **extra}
        with self.record.open("a") as file:
            file.write(json.dumps(line) + "\n")

    async def ListTools(
        self, request: tools_pb2.ListToolsRequest, context: Any
    ) -> tools_pb2.ListToolsResponse:
        return tools_pb2.ListToolsResponse(tools=tool_specs(self.variant), instance_id=self.instance_id)

    async def ExecuteTool(
        self, request: tools_pb2.ExecuteToolRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[tools_pb2.ExecuteToolResponse]:
        metadata = dict(context.invocation_metadata() or ())
        parent = metadata.get(PARENT, "")
        self._note(
            "started",
            request,
            parent=parent,
            input_json=request.input_json,
            request_id=request.request_id,
            traceparent=metadata.get("traceparent", ""),
            idempotency_key=request.idempotency_key,
        )
        try:
            async for response in self._run(request, parent):
                yield response
        except asyncio.CancelledError:
            self._note("cancelled", request)
            raise
        self._note("finished", request)

    async def _run(
        self, request: tools_pb2.ExecuteToolRequest, parent: str
    ) -> AsyncIterator[tools_pb2.ExecuteToolResponse]:
        name = request.tool_name
        args = json.loads(request.input_json)
        if name == "add_big":
            yield tools_pb2.ExecuteToolResponse(output_json=json.dumps({"sum": args["a"] + args["b"]}))
        elif name == "count":
            for i in range(1, args["to"]):
                yield tools_pb2.ExecuteToolResponse(preliminary_output_json=json.dumps({"i": i}))
            yield tools_pb2.ExecuteToolResponse(output_json=json.dumps({"done": args["to"]}))
        elif name in ("wait", "quick_deadline"):
            await asyncio.Event().wait()
        elif name == "fail":
            yield tools_pb2.ExecuteToolResponse(error=args["reason"])
        elif name == "guarded":
            yield tools_pb2.ExecuteToolResponse(output_json='{"guarded": "ran"}')
        elif name == "get_weather":
            yield tools_pb2.ExecuteToolResponse(
                output_json=json.dumps({"city": args["city"], "source": "tool host"})
            )
        elif name == "callback":
            yield tools_pb2.ExecuteToolResponse(
                output_json=json.dumps({"status": await self._chat(args, parent)})
            )
        elif name == "added_after_restart":
            yield tools_pb2.ExecuteToolResponse(output_json='"new"')
        else:
            yield tools_pb2.ExecuteToolResponse(error=f"unknown tool {name}")

    async def _chat(self, args: dict[str, Any], parent: str) -> str:
        assert self.sidecar, "callback needs --sidecar"
        async with grpc.aio.insecure_channel(self.sidecar) as channel:
            stub = chat_service_pb2_grpc.ChatServiceStub(channel)
            message = message_pb2.Message(parts=[message_pb2.Part(text=message_pb2.TextPart(text="nested"))])
            call = stub.Chat(
                chat_service_pb2.ChatRequest(conversation_id=args["conversation_id"], message=message),
                metadata=((PARENT, parent),),
                timeout=10,
            )
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as error:
                return str(error.code().name)
            return "OK"


async def serve(port: int, record: Path, variant: int, sidecar: str | None) -> None:
    """Serve until SIGTERM."""
    server = grpc.aio.server()
    tools_pb2_grpc.add_ToolExecutorServiceServicer_to_server(Executor(record, variant, sidecar), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(None)


class ToolHostProcess:
    """One test host process on ``port``, recording to ``record`` (see the module docstring)."""

    def __init__(self, port: int, record: Path, *, variant: int = 1, sidecar: str | None = None) -> None:
        self.port = port
        self.record = record
        self.variant = variant
        self.sidecar = sidecar
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.port}"

    async def start(self, timeout: float = 20.0) -> ToolHostProcess:  # noqa: ASYNC109
        """Start it and wait until ListTools answers; returns ``self``."""
        # Imported here: this file also runs as the host's own script, where ``support`` is not
        # a package on the path.
        from support.waiting import wait_until

        process = self.process = self._spawn()
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = tools_pb2_grpc.ToolExecutorServiceStub(channel)

            async def answers() -> bool:
                if process.poll() is not None:
                    raise RuntimeError(f"the tool host exited with {process.returncode}")
                try:
                    await stub.ListTools(tools_pb2.ListToolsRequest(), timeout=0.5)
                except grpc.aio.AioRpcError:
                    return False
                return True

            try:
                await wait_until(answers, timeout, interval=0.05, what="the tool host answers ListTools")
            except AssertionError:
                self.kill()
                raise RuntimeError("the tool host did not answer ListTools") from None
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        # Popen returns once the child is forked; it does not wait for it.
        command = [sys.executable, __file__, "--port", str(self.port), "--record", str(self.record)]
        command += ["--variant", str(self.variant)]
        if self.sidecar:
            command += ["--sidecar", self.sidecar]
        environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, env=environment)

    def kill(self) -> None:
        """SIGKILL and reap it (a host that dies)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait()

    def events(self, event: str | None = None, tool: str | None = None) -> list[dict[str, Any]]:
        """The recorded lines, optionally only those of ``event`` and ``tool``."""
        if not self.record.exists():
            return []
        lines = [json.loads(line) for line in self.record.read_text().splitlines() if line]
        return [
            line
            for line in lines
            if (event is None or line["event"] == event) and (tool is None or line["tool"] == tool)
        ]


def main() -> None:
    """Command line (see the module docstring)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--record", type=Path, required=True)
    parser.add_argument("--variant", type=int, default=1)
    parser.add_argument("--sidecar", default=None)
    args = parser.parse_args()
    asyncio.run(serve(args.port, args.record, args.variant, args.sidecar))


if __name__ == "__main__":
    main()
