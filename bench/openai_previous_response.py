"""A follow-up request's cost on the OpenAI door (``previous_response_id``) in a long conversation
against a short one, this tree's sidecar against another tree's, interleaved (bench/openai_door.md,
"2026-12-07, stop 69").

Each arm is a sidecar (SQLite, the scripted model: a 6-delta answer, no upstream) with the HTTP
listener on; the ``old`` arm runs the code of ``--old`` (a checkout whose ``server``,
``middleware`` and ``clients/python/src`` go first on its ``PYTHONPATH``). In each, ``long`` holds
``--messages`` messages (a user message and a reply per turn, the last turn over the door) and
``short`` one turn. A request continues the conversation's latest response (``previous_response_id``,
streamed, the official ``openai`` SDK), and the next continues the response it made; the floor is
the same turn over gRPC (``Chat``, no door, the same code in both arms); on this tree's sidecar,
the door's read alone too, over gRPC: before (every page) and now (a page from the reply). Per
request:
time to the first text delta (ms, p50 and p90 over ``--requests`` requests per round and
conversation and kind) and the sidecar's CPU (ms, its threads' time over a block). The arms and the two
conversations alternate, so load drifts hit both. Printed, never asserted; note the load.

    flock /tmp/bench.lock .venv/bin/python bench/openai_previous_response.py --old /work/main
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import openai
from _common import (
    CLIENT_OPTIONS,
    PYTHON,
    ServerProcess,
    checkout_pythonpath,
    cpu_seconds_of,
    free_port,
    machine_summary,
    percentile,
)

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, message_pb2
from turnwire_server.engine.ids import assistant_message_id

ANSWER = "The quick brown fox jumps over the lazy dog, said the model."


class Arm:
    """One sidecar under test and the latest response of each of its conversations."""

    def __init__(self, name: str, source: Path | None) -> None:
        self.name = name
        self.source = source
        home = Path(tempfile.mkdtemp(prefix=f"turnwire-bench-prevresp-{name}-"))
        port, self.http_port = free_port(), free_port()
        config = home / "turnwire.yaml"
        config.write_text(
            f"""\
listen: 127.0.0.1:{port}
default_model: scripted:answer
logging: {{level: warning}}
store:
  url: sqlite:///{home / "turnwire.db"}
providers:
  scripted:
    scripts:
      answer:
        - text: "{ANSWER}"
          chunk_size: 10
tools:
  demo: false
limits:
  shutdown_grace_seconds: 1
http:
  listen: 127.0.0.1:{self.http_port}
"""
        )
        argv = [PYTHON, "-m", "turnwire_server", "serve", "--config", str(config)]
        self.server = ServerProcess(argv, port, home, name)
        self.latest: dict[str, str] = {}

    async def start(self) -> None:
        """Start the sidecar, with ``source``'s code first on its path when given."""
        before = os.environ.get("PYTHONPATH")
        if self.source is not None:
            os.environ["PYTHONPATH"] = checkout_pythonpath(self.source)
        try:
            await self.server.start(startup_seconds=120.0)
        finally:
            if before is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = before

    def client(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{self.http_port}/v1", api_key="unused")


async def seed(arm: Arm, messages: int) -> None:
    """``long``: ``messages`` / 2 - 1 turns over gRPC (``Chat``), then one over the door;
    ``short``: one turn over the door."""
    async with grpc.aio.insecure_channel(arm.server.target, options=CLIENT_OPTIONS) as channel:
        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
        for _ in range(messages // 2 - 1):
            await grpc_turn(stub, "long")
    async with arm.client() as client:
        for conversation in ("long", "short"):
            arm.latest[conversation] = (
                await client.responses.create(input="hi", conversation=conversation)
            ).id


async def follow_up(client: openai.AsyncOpenAI, arm: Arm, conversation: str) -> float:
    """One streamed follow-up of ``conversation``'s latest response; seconds to its first text
    delta. Its response becomes the latest."""
    start = time.perf_counter()
    first = 0.0
    stream = await client.responses.create(
        input="and then?", previous_response_id=arm.latest[conversation], stream=True
    )
    async for event in stream:
        if event.type == "response.created":
            arm.latest[conversation] = event.response.id
        elif event.type == "response.output_text.delta" and not first:
            first = time.perf_counter() - start
    if not first:
        raise RuntimeError("no text delta")
    return first


async def grpc_turn(stub: chat_service_pb2_grpc.ChatServiceStub, conversation: str) -> float:
    """One ``Chat`` turn of ``conversation`` over gRPC (the floor: the same turn without the
    door); seconds to its first text delta."""
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "and then?"
    start = time.perf_counter()
    first = 0.0
    async for response in stub.Chat(
        chat_service_pb2.ChatRequest(conversation_id=conversation, message=message)
    ):
        if response.event.WhichOneof("event") == "text_delta" and not first:
            first = time.perf_counter() - start
    if not first:
        raise RuntimeError("no text delta")
    return first


async def whole_read(stub: chat_service_pb2_grpc.ChatServiceStub, conversation: str) -> float:
    """The door's read before: every page of ``conversation`` (``GetConversation``); seconds."""
    start = time.perf_counter()
    request = chat_service_pb2.GetConversationRequest(conversation_id=conversation)
    while True:
        page = await stub.GetConversation(request)
        if not page.next_page_token:
            return time.perf_counter() - start
        request.page_token = page.next_page_token


async def bounded_read(stub: chat_service_pb2_grpc.ChatServiceStub, arm: Arm, conversation: str) -> float:
    """The door's read now: ``conversation`` from the reply of its latest response over the door
    on, one page of 16 (``stored_turns.reply_followed``); seconds."""
    start = time.perf_counter()
    reply = assistant_message_id(arm.latest[conversation])
    request = chat_service_pb2.GetConversationRequest(
        conversation_id=conversation, start_message_id=reply, page_size=16
    )
    await stub.GetConversation(request)
    return time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, required=True, help="the checkout the old arm runs")
    parser.add_argument("--messages", type=int, default=2_000)
    parser.add_argument("--requests", type=int, default=10, help="per round, arm and conversation")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    arms = [Arm("old", args.old.resolve()), Arm("new", None)]
    ttft: dict[tuple[str, str, str], list[float]] = {}
    cpu: dict[tuple[str, str, str], list[float]] = {}
    try:
        for arm in arms:
            await arm.start()
            await seed(arm, args.messages)
        print(machine_summary())
        for _ in range(args.rounds):
            for conversation in ("short", "long"):
                for arm in arms:
                    pid = arm.server.popen.pid  # type: ignore[union-attr]
                    async with (
                        arm.client() as client,
                        grpc.aio.insecure_channel(arm.server.target, options=CLIENT_OPTIONS) as channel,
                    ):
                        stub = chat_service_pb2_grpc.ChatServiceStub(channel)
                        paths = [
                            ("gRPC Chat", functools.partial(grpc_turn, stub, conversation)),
                            ("previous_response_id", functools.partial(follow_up, client, arm, conversation)),
                        ]
                        if arm.source is None:  # the reads alone (the old sidecar has no start_message_id)
                            paths += [
                                (
                                    "GetConversation, every page",
                                    functools.partial(whole_read, stub, conversation),
                                ),
                                (
                                    "GetConversation from the reply",
                                    functools.partial(bounded_read, stub, arm, conversation),
                                ),
                            ]
                        for path, one in paths:
                            await one()  # warm the connection
                            before = cpu_seconds_of(pid)
                            times = [await one() for _ in range(args.requests)]
                            spent = cpu_seconds_of(pid) - before
                            ttft.setdefault((arm.name, conversation, path), []).extend(times)
                            cpu.setdefault((arm.name, conversation, path), []).append(spent / args.requests)
        print(f"load: {os.getloadavg()}")
    finally:
        for arm in arms:
            arm.server.stop()
    print("| code | conversation | request | TTFT, read: time p50 (ms) | p90 (ms) | sidecar CPU (ms) |")
    print("|---|---|---|---|---|---|")
    for key in sorted(ttft, key=lambda key: (key[1] == "long", key[2], key[0] == "new")):
        times = ttft[key]
        cpu_ms = statistics.median(cpu[key]) * 1e3
        print(
            f"| {' | '.join(key)} | {percentile(times, 50) * 1e3:.2f} | "
            f"{percentile(times, 90) * 1e3:.2f} | {cpu_ms:.2f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
