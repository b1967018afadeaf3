"""Serving a :class:`~turnwire.kit.HookServer` and tools on one gRPC server (grpc.aio)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import grpc

from turnwire.kit.hook_server import HookServer
from turnwire.kit.tool_host import ToolHost
from turnwire.tools import Tool
from turnwire_client.v1 import hooks_pb2_grpc, tools_pb2_grpc

STOP_GRACE_SECONDS = 5.0
"""How long :meth:`Served.stop` lets running calls finish before cancelling them."""


@dataclass
class Served:
    """A started server: ``port`` is the bound port (useful after binding port 0)."""

    server: grpc.aio.Server
    port: int

    async def stop(self, grace: float = STOP_GRACE_SECONDS) -> None:
        """Stop taking calls; cancel those still running after ``grace`` seconds."""
        await self.server.stop(grace)

    async def wait(self) -> None:
        """Return when the server has stopped."""
        await self.server.wait_for_termination()


async def start(
    address: str = "127.0.0.1:0",
    *,
    hooks: HookServer | None = None,
    tools: Sequence[Tool] = (),
    credentials: grpc.ServerCredentials | None = None,
) -> Served:
    """Serve ``hooks`` (``TurnHooksService``) and/or ``tools`` (``ToolExecutorService``) at
    ``address`` (``HOST:PORT``; port 0 picks a free one), plaintext unless ``credentials`` are
    given. Returns once it accepts calls.

    Raises :class:`ValueError` when there is nothing to serve, or a tool :class:`ToolHost`
    refuses; :class:`RuntimeError` (grpc's) when the address cannot be bound.
    """
    if hooks is None and not tools:
        raise ValueError("give hooks, tools or both")
    server = grpc.aio.server()
    if hooks is not None:
        hooks_pb2_grpc.add_TurnHooksServiceServicer_to_server(hooks.servicer(), server)
    if tools:
        tools_pb2_grpc.add_ToolExecutorServiceServicer_to_server(ToolHost(tools), server)
    if credentials is None:
        port = server.add_insecure_port(address)
    else:
        port = server.add_secure_port(address, credentials)
    await server.start()
    return Served(server, port)


async def run(
    address: str,
    *,
    hooks: HookServer | None = None,
    tools: Sequence[Tool] = (),
    credentials: grpc.ServerCredentials | None = None,
    ready: Callable[[int], None] | None = None,
) -> None:
    """:func:`start`, then serve until SIGINT or SIGTERM (then stop as :meth:`Served.stop`).
    ``ready`` is called with the bound port once calls are accepted. Run it with
    ``asyncio.run(run("127.0.0.1:7001", hooks=MyHooks(), tools=[my_tool]))``."""
    served = await start(address, hooks=hooks, tools=tools, credentials=credentials)
    if ready is not None:
        ready(served.port)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stopping.set)
    try:
        await stopping.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
        await served.stop()
