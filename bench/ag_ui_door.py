"""The AG-UI door's cost (issue 36): server CPU per request and time to first token of a turn
through ``POST /v1/ag-ui`` (AG-UI's SSE, read as ``HttpAgent`` reads it: ``data:`` lines of JSON
events), against native gRPC, on the same sidecar and upstream.

The setup is ``http_door.py``'s and ``openai_door.py``'s (one local upstream speaking OpenAI Chat
Completions SSE, a 4-delta answer; one sidecar on SQLite with ``http.listen``; this process the
client). Sequential turns on a new thread each; protocols in turn, ``--rounds`` rounds of
``--turns`` turns. **Server CPU per request** = the sidecar's CPU (psutil, all threads) over a
protocol's block / its turns; medians over rounds. **TTFT** = call → first text delta received,
p50. *Added* = door - gRPC. The in-process table runs the door's ASGI app on a stub servicer (a
pre-built 4-delta turn, ``_door_bench.Servicer``): the door's own CPU (reading the
``RunAgentInput``, translation to AG-UI's events, SSE), with no engine, sockets or HTTP parsing.

On a 2-core machine the client, the upstream and the sidecar share the cores, and other work may
run beside them: the CPU columns are the measure, TTFT is noisy.

    .venv/bin/python bench/ag_ui_door.py [--quick] [--rounds 5] [--turns 40] [--in-process-only]

Results and conditions: bench/ag_ui_door.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

import httpx2 as httpx
import orjson

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

from _asgi import asgi_post  # noqa: E402
from _common import (  # noqa: E402
    Table,
    print_tables,
    write_tables_json,
)
from _door_bench import (  # noqa: E402
    MODEL,
    FirstToken,
    against_grpc,
    comparison_table,
    cpu_per_call,
    in_process_door,
    sidecar_with_doors,
)
from _ttft_clients import QUESTION  # noqa: E402


def run_input(thread: str) -> bytes:
    """A ``RunAgentInput`` as ``HttpAgent`` posts it: one user message, the bench's model."""
    return orjson.dumps(
        {
            "threadId": thread,
            "runId": f"r-{uuid.uuid4().hex}",
            "messages": [{"id": f"u-{uuid.uuid4().hex[:12]}", "role": "user", "content": QUESTION}],
            "tools": [],
            "context": [],
            "forwardedProps": {"model": MODEL},
        }
    )


async def ag_ui_first_token(http: httpx.AsyncClient, url: str) -> float:
    """A run read to its end (``RUN_FINISHED``); seconds to its first ``TEXT_MESSAGE_CONTENT``."""
    start = time.perf_counter()
    first = 0.0
    body = run_input(f"b-{uuid.uuid4().hex[:12]}")
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    async with http.stream("POST", url, content=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = orjson.loads(line[6:])
            if not first and event["type"] == "TEXT_MESSAGE_CONTENT":
                first = time.perf_counter() - start
            if event["type"] in ("RUN_FINISHED", "RUN_ERROR"):
                break
    if not first:
        raise RuntimeError("no text delta")
    return first


async def run(rounds: int, turns: int) -> Table:
    async with (
        sidecar_with_doors("ag-ui") as (server, grpc_chat, base),
        httpx.AsyncClient(timeout=60) as http,
    ):
        calls: dict[str, FirstToken] = {
            "gRPC": grpc_chat,
            "AG-UI (POST /v1/ag-ui, SSE)": lambda: ag_ui_first_token(http, f"{base}/v1/ag-ui"),
        }
        ttft, cpu = await against_grpc(server, calls, rounds=rounds, turns=turns, label="ag-ui door")
    return comparison_table(
        f"A turn over the AG-UI door vs gRPC, same sidecar and upstream ({rounds} rounds x {turns} "
        "sequential turns per protocol, 4-delta answer; ms)",
        ttft,
        cpu,
    )


async def in_process(requests: int) -> Table:
    """The door's own CPU per streamed run, against the in-process call alone."""
    from turnwire_server.http.doors import ag_ui_door

    app, direct = in_process_door(ag_ui_door)
    body = run_input("c")

    async def door() -> None:
        await asgi_post(app, "/v1/ag-ui", body)

    base = await cpu_per_call(direct, requests)
    own = await cpu_per_call(door, requests)
    table = Table(
        f"The AG-UI door's own CPU per run in process ({requests} requests x 3, median; a pre-built "
        "4-delta turn; µs)",
        ["path", "CPU / request", "added by the door"],
    )
    table.add("in-process call alone (interceptor: RpcObserver)", f"{base * 1e6:.0f}", "")
    table.add("POST /v1/ag-ui, SSE", f"{own * 1e6:.0f}", f"{(own - base) * 1e6:+.0f}")
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
    tables = [asyncio.run(in_process(300 if args.quick else 1000))]
    if not args.in_process_only:
        tables.append(asyncio.run(run(rounds, turns)))
    print_tables(tables)
    if args.json:
        write_tables_json(args.json, tables)


if __name__ == "__main__":
    main()
