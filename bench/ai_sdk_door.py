"""The AI SDK door's cost (issue 36): server CPU per request and time to first token of a turn
through ``POST /v1/ai-sdk/chat`` (the UI message stream), against native gRPC, on the same sidecar
and upstream.

The setup is ``openai_door.py``'s (one local upstream speaking OpenAI Chat Completions SSE, a
4-delta answer; one sidecar on SQLite with ``http.listen``; this process the client). The client
posts the body the AI SDK's ``DefaultChatTransport`` sends and reads the SSE lines with httpx2
(the AI SDK itself is a Node.js package: its own parsing is the page's cost, not the sidecar's).
Sequential turns on a new conversation each; protocols in turn, ``--rounds`` rounds of
``--turns`` turns. **Server CPU per request** = the sidecar's CPU (psutil, all threads) over a
protocol's block / its turns; medians over rounds. **TTFT** = call → first ``text-delta``
received, p50. *Added* = door - gRPC. The in-process table runs the door's ASGI app on a stub
servicer (a pre-built 4-delta turn): the door's own CPU (body parsing, translation to chunks,
SSE), with no engine, sockets or HTTP parsing.

On a 2-core machine the client, the upstream and the sidecar share the cores, and other work may
run beside them: the CPU columns are the measure, TTFT is noisy.

    .venv/bin/python bench/ai_sdk_door.py [--quick] [--rounds 5] [--turns 40] [--in-process-only]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

import httpx2
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
    FirstToken,
    against_grpc,
    comparison_table,
    cpu_per_call,
    in_process_door,
    sidecar_with_doors,
)
from _ttft_clients import QUESTION  # noqa: E402

MODEL = "openai:burst-4"
PATH = "/v1/ai-sdk/chat"


def body(conversation: str) -> bytes:
    """The body ``DefaultChatTransport.sendMessages`` posts for one new user message."""
    message = {
        "id": f"m-{uuid.uuid4().hex[:12]}",
        "role": "user",
        "parts": [{"type": "text", "text": QUESTION}],
    }
    return orjson.dumps(
        {"id": conversation, "messages": [message], "trigger": "submit-message", "model": MODEL}
    )


async def ui_stream_first_token(http: httpx2.AsyncClient, url: str) -> float:
    """A UI message stream read to its ``[DONE]``; seconds to its first ``text-delta``."""
    start = time.perf_counter()
    first = 0.0
    content = body(f"b-{uuid.uuid4().hex[:12]}")
    headers = {"content-type": "application/json"}
    async with http.stream("POST", url, content=content, headers=headers) as response:
        async for line in response.aiter_lines():
            if not first and line.startswith('data: {"type":"text-delta"'):
                first = time.perf_counter() - start
    if not first:
        raise RuntimeError("no text delta")
    return first


async def run(rounds: int, turns: int) -> Table:
    async with (
        sidecar_with_doors("ai-sdk") as (server, grpc_chat, base),
        httpx2.AsyncClient(timeout=60) as http,
    ):
        calls: dict[str, FirstToken] = {
            "gRPC": grpc_chat,
            "AI SDK UI message stream": lambda: ui_stream_first_token(http, f"{base}{PATH}"),
        }
        ttft, cpu = await against_grpc(server, calls, rounds=rounds, turns=turns, label="ai sdk door")
    return comparison_table(
        f"A turn over the AI SDK door vs gRPC, same sidecar and upstream ({rounds} rounds x {turns} "
        "sequential turns per protocol, 4-delta answer; ms)",
        ttft,
        cpu,
    )


async def in_process(requests: int) -> Table:
    """The door's own CPU per streamed turn, against the in-process call alone."""
    from turnwire_server.http.doors import ai_sdk_door

    app, direct = in_process_door(ai_sdk_door)
    posted = body("c")

    async def door() -> None:
        await asgi_post(app, PATH, posted)

    base = await cpu_per_call(direct, requests)
    own = await cpu_per_call(door, requests)
    table = Table(
        f"The AI SDK door's own CPU per turn in process ({requests} requests x 3, median; a pre-built "
        "4-delta turn of 10 events, 10 chunks and [DONE]; µs)",
        ["path", "CPU / request", "added by the door"],
    )
    table.add("in-process call alone (interceptor: RpcObserver)", f"{base * 1e6:.0f}", "")
    table.add(f"POST {PATH} (UI message stream)", f"{own * 1e6:.0f}", f"{(own - base) * 1e6:+.0f}")
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
