"""The HTTP listener's cost (issue 35): server CPU per request and time to first token of a Chat
over Connect (binary and JSON) and gRPC-Web, against native gRPC, on the same sidecar and the
same upstream.

One local upstream (``_upstream.py``: OpenAI Chat Completions SSE, a 4-delta answer) and one
sidecar (``python -m turnwire_server serve``, SQLite, the ``openai`` provider pointed at the
upstream, ``http.listen`` on) in their own processes. This process is the client: ``grpc.aio``
for gRPC, connectrpc's client (pyqwest, HTTP/1.1 keep-alive, no compression) for the HTTP
listener. Sequential turns on a new conversation each; each round runs ``--turns`` turns per
protocol, protocols in turn (gRPC, Connect proto, Connect JSON, gRPC-Web proto), ``--rounds``
rounds. **Server CPU per request** = the sidecar process's CPU (psutil, all threads) over a
protocol's block / its turns (the sidecar is idle between turns); medians over rounds.
**TTFT** = call → first text delta received, p50 over all turns. *Added* = protocol - gRPC.

Target (issue 35): ≤ +0.5 ms server CPU per request over Connect. Printed with PASS/MISS, never
asserted. On a 2-core machine the client, the upstream and the sidecar share the cores, and
other work may run beside them: the CPU columns are the measure, TTFT is noisy.

    .venv/bin/python bench/http_door.py [--quick] [--rounds 5] [--turns 40] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from connectrpc.client import ConnectClient
from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
from connectrpc.protocol import ProtocolType
from google.protobuf import json_format

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _asgi import asgi_post  # noqa: E402
from _common import (  # noqa: E402
    CLIENT_OPTIONS,
    Table,
    free_port,
    percentile,
    print_tables,
    verdict,
    wait_for_quiet,
    write_tables_json,
)
from _door_bench import cpu_per_call, first_token, in_process_door, request, sidecar  # noqa: E402
from _ttft_clients import Upstream  # noqa: E402

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc  # noqa: E402
from turnwire_server.http.connect_door import ProtoBinaryCodec, ProtoJsonCodec  # noqa: E402

CPU_TARGET_MS = 0.5
CHAT = MethodInfo(
    name="Chat",
    service_name="turnwire.v1.ChatService",
    input=chat_service_pb2.ChatRequest,
    output=chat_service_pb2.ChatResponse,
    idempotency_level=IdempotencyLevel.UNKNOWN,
    stream_type=StreamType.SERVER_STREAM,
)


async def run(rounds: int, turns: int) -> list[Table]:
    upstream = Upstream()
    workdir = Path(tempfile.mkdtemp(prefix="turnwire-bench-http-"))
    http_port = free_port()
    server = sidecar(workdir, upstream.url, http_port)
    await server.start(startup_seconds=120.0)  # a loaded 2-core machine
    base = f"http://127.0.0.1:{http_port}"
    channel = grpc.aio.insecure_channel(server.target, options=CLIENT_OPTIONS)
    stub = chat_service_pb2_grpc.ChatServiceStub(channel)
    clients = {
        "Connect proto": ConnectClient(base, codec=ProtoBinaryCodec(), send_compression=None),
        "Connect JSON": ConnectClient(base, codec=ProtoJsonCodec(), send_compression=None),
        "gRPC-Web proto": ConnectClient(
            base, codec=ProtoBinaryCodec(), protocol=ProtocolType.GRPC_WEB, send_compression=None
        ),
    }
    calls: dict[str, Callable[[], Awaitable[float]]] = {"gRPC": lambda: first_token(stub.Chat(request()))}
    for name, client in clients.items():
        calls[name] = lambda client=client: first_token(  # type: ignore[misc]
            client.execute_server_stream(request=request(), method=CHAT)
        )
    ttft: dict[str, list[float]] = {name: [] for name in calls}
    cpu: dict[str, list[float]] = {name: [] for name in calls}
    try:
        for call in calls.values():  # warm-up: connections, caches
            for _ in range(5):
                await call()
        for number in range(rounds):
            await wait_for_quiet(max_wait=3.0)
            for name, call in calls.items():
                await server.settle()
                cpu0 = server.cpu_seconds()
                for _ in range(turns):
                    ttft[name].append(await call())
                cpu[name].append((server.cpu_seconds() - cpu0) / turns)
            print(f"  [http door round {number + 1}/{rounds} done]", file=sys.stderr, flush=True)
    finally:
        await channel.close()
        for client in clients.values():
            await client.close()
        server.stop()
        upstream.close()
    table = Table(
        f"Chat over the HTTP listener vs gRPC, same sidecar and upstream ({rounds} rounds x {turns} "
        "sequential turns per protocol, 4-delta answer; ms)",
        [
            "protocol",
            "server CPU / request",
            "added CPU",
            "TTFT p50",
            "added TTFT p50",
            "TTFT p99",
            f"target added CPU ≤ {CPU_TARGET_MS} ms",
        ],
    )
    base_cpu = statistics.median(cpu["gRPC"])
    base_ttft = percentile(ttft["gRPC"], 50)
    for name in calls:
        own = statistics.median(cpu[name])
        p50 = percentile(ttft[name], 50)
        table.add(
            name,
            f"{own * 1e3:.2f}",
            "" if name == "gRPC" else f"{(own - base_cpu) * 1e3:+.2f}",
            f"{p50 * 1e3:.2f}",
            "" if name == "gRPC" else f"{(p50 - base_ttft) * 1e3:+.2f}",
            f"{percentile(ttft[name], 99) * 1e3:.2f}",
            "" if name == "gRPC" else verdict(own - base_cpu <= CPU_TARGET_MS / 1e3),
        )
    return [table]


# ----------------------------------------------------------------------------- in process


def _envelope(payload: bytes) -> bytes:
    return b"\0" + len(payload).to_bytes(4, "big") + payload


async def in_process(requests: int) -> Table:
    """The door's own CPU per Chat (ASGI app, connectrpc, the in-process call; no sockets, no
    HTTP parsing), against running the same handler with an in-process context alone."""
    from turnwire_server.http.doors import connect_door

    app, direct = in_process_door(connect_door)
    chat = request()
    bodies = {
        "Connect proto": ("application/connect+proto", _envelope(chat.SerializeToString())),
        "Connect JSON": ("application/connect+json", _envelope(json_format.MessageToJson(chat).encode())),
        "gRPC-Web proto": ("application/grpc-web+proto", _envelope(chat.SerializeToString())),
    }

    base = await cpu_per_call(direct, requests)
    table = Table(
        f"The door's own CPU per Chat in process ({requests} requests x 3, median; a pre-built 4-delta "
        "turn of 10 events; µs)",
        ["path", "CPU / request", "added by HTTP framing and codec"],
    )
    table.add("in-process call alone (interceptor: RpcObserver)", f"{base * 1e6:.0f}", "")
    for name, (content_type, body) in bodies.items():

        async def one(content_type: str = content_type, body: bytes = body) -> None:
            await asgi_post(app, "/turnwire.v1.ChatService/Chat", body, content_type=content_type)

        own = await cpu_per_call(one, requests)
        table.add(name, f"{own * 1e6:.0f}", f"{(own - base) * 1e6:+.0f}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds of 10 turns")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--json", type=Path, help="also write the tables as JSON here")
    parser.add_argument("--in-process-only", action="store_true", help="only the in-process table")
    args = parser.parse_args()
    rounds, turns = (2, 10) if args.quick else (args.rounds, args.turns)
    tables = [asyncio.run(in_process(500 if args.quick else 2000))]
    if not args.in_process_only:
        tables += asyncio.run(run(rounds, turns))
    print_tables(tables)
    if args.json:
        write_tables_json(args.json, tables)


if __name__ == "__main__":
    main()
