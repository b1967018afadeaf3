"""ResumeTurn of a stored turn, one event a message against event batches (issue 33;
docs/semantics.md §10, "Event batches").

One ``turnwire serve`` (SQLite, the scripted model, demo tools off) runs one turn of ``--deltas``
text deltas, paced (0.5 ms before each, so that fewer are merged); this process then replays it
from the start with ``ResumeTurn``, ``--replays`` times per arm, the arms alternating every
``--block`` replays: **one by one** (no metadata) and **batched** (``turnwire-event-batches:
1``). Measured per replay: gRPC messages received, the sidecar's CPU (its threads'
``schedstat``, ns) and this client's, and the wall time; medians of the blocks.

    .venv/bin/python bench/replay_batches.py [--deltas 1000] [--replays 60] [--block 10]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import grpc
from _common import (
    CLIENT_OPTIONS,
    PACED_MODEL,
    ServerProcess,
    Table,
    chat_request,
    cpu_seconds_of,
    own_cpu_seconds,
    print_tables,
)

from turnwire_client.metadata import EVENT_BATCHES_METADATA
from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc

ARMS: dict[str, tuple[tuple[str, str], ...]] = {"one by one": (), "batched": ((EVENT_BATCHES_METADATA, "1"),)}


async def _replay(
    stub: chat_service_pb2_grpc.ChatServiceStub, request_id: str, metadata: tuple[tuple[str, str], ...]
) -> tuple[int, int]:
    """(messages, events) of one ResumeTurn from the start."""
    messages = events = 0
    request = chat_service_pb2.ResumeTurnRequest(request_id=request_id)
    async for response in stub.ResumeTurn(request, metadata=metadata):
        messages += 1
        events += 1 + len(response.more_events)
    return messages, events


async def run(deltas: int, replays: int, block: int) -> Table:
    with tempfile.TemporaryDirectory(prefix="replay-batches-") as tmp:
        server = ServerProcess.turnwire(Path(tmp), deltas=deltas, chunk_size=4)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(server.target, options=CLIENT_OPTIONS) as channel:
                stub = chat_service_pb2_grpc.ChatServiceStub(channel)
                request_id = ""
                async for response in stub.Chat(chat_request("replayed", PACED_MODEL)):
                    request_id = response.event.request_id
                await server.settle()
                pid = server.ps.pid if server.ps else 0
                per: dict[str, dict[str, list[float]]] = {
                    arm: {"messages": [], "events": [], "server": [], "client": [], "wall": []}
                    for arm in ARMS
                }
                for _ in range(2):  # warm-up, both arms
                    for metadata in ARMS.values():
                        await _replay(stub, request_id, metadata)
                for round_index in range(replays // block):
                    order = list(ARMS) if round_index % 2 == 0 else list(reversed(ARMS))
                    for arm in order:
                        server_before, client_before = cpu_seconds_of(pid), own_cpu_seconds()
                        start = time.perf_counter()
                        for _ in range(block):
                            messages, events = await _replay(stub, request_id, ARMS[arm])
                        figures = per[arm]
                        figures["wall"].append((time.perf_counter() - start) / block)
                        figures["server"].append((cpu_seconds_of(pid) - server_before) / block)
                        figures["client"].append((own_cpu_seconds() - client_before) / block)
                        figures["messages"].append(messages)
                        figures["events"].append(events)
        finally:
            server.stop()
    table = Table(
        f"ResumeTurn of a stored {deltas}-delta turn from the start ({replays} replays per arm,"
        f" medians of blocks of {block})",
        ["arm", "events", "messages", "server CPU ms/replay", "client CPU ms/replay", "wall ms/replay"],
    )
    for arm, figures in per.items():
        table.rows.append(
            [
                arm,
                f"{statistics.median(figures['events']):.0f}",
                f"{statistics.median(figures['messages']):.0f}",
                f"{statistics.median(figures['server']) * 1e3:.2f}",
                f"{statistics.median(figures['client']) * 1e3:.2f}",
                f"{statistics.median(figures['wall']) * 1e3:.2f}",
            ]
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--deltas", type=int, default=1000)
    parser.add_argument("--replays", type=int, default=60)
    parser.add_argument("--block", type=int, default=10)
    args = parser.parse_args()
    print_tables([asyncio.run(run(args.deltas, args.replays, args.block))])


if __name__ == "__main__":
    main()
