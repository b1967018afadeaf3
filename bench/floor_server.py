"""The floor: a bare grpc.aio server that streams pre-built ChatResponse messages.

It implements only ``turnwire.v1.ChatService/Chat`` through the generated
servicer base class, with no validation, engine, store or provider: each call
yields the same pre-built list of responses (the event shapes and sizes of a
Turnwire turn, see ``_common.floor_responses``). Whatever Turnwire costs above
this is Turnwire's overhead; what this costs is grpc.aio's.

A request whose ``model`` is ``scripted:hold`` gets the first two events and is
then held open (to measure gRPC's own memory per open stream).

    python bench/floor_server.py --port 50099 --deltas 200 --chunk-size 4
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path
from typing import Any

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import HOLD_MODEL, floor_responses

from turnwire_client.v1 import chat_service_pb2_grpc


class FloorChat(chat_service_pb2_grpc.ChatServiceServicer):
    """Streams the pre-built responses; holds ``scripted:hold`` calls open."""

    def __init__(self, responses: list[Any]) -> None:
        self.responses = responses

    async def Chat(self, request: Any, context: Any) -> Any:
        if request.model == HOLD_MODEL:
            yield self.responses[0]
            yield self.responses[1]
            await asyncio.Event().wait()
            return
        for response in self.responses:
            yield response


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--chunk-size", type=int, default=4)
    args = parser.parse_args()
    server = grpc.aio.server(
        options=[
            ("grpc.so_reuseport", 0),
            ("grpc.max_send_message_length", 16 << 20),
            ("grpc.server.max_pending_requests", 10_000),
        ],
        maximum_concurrent_rpcs=10_000,
    )
    # The generated stubs make every RPC abstract; at runtime the base answers UNIMPLEMENTED for
    # the ones FloorChat leaves out.
    floor = FloorChat(floor_responses(args.deltas, args.chunk_size))  # type: ignore[abstract]
    chat_service_pb2_grpc.add_ChatServiceServicer_to_server(floor, server)
    server.add_insecure_port(f"127.0.0.1:{args.port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await server.stop(0.5)


if __name__ == "__main__":
    asyncio.run(main())
