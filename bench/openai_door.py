"""The OpenAI-compatible door's cost (issue 36): server CPU per request and time to first token of
a turn through ``POST /v1/responses`` and ``POST /v1/chat/completions`` (streamed, the official
``openai`` Python SDK as the client), against native gRPC, on the same sidecar and upstream.

The setup is ``http_door.py``'s (one local upstream speaking OpenAI Chat Completions SSE, a
4-delta answer; one sidecar on SQLite with ``http.listen``; this process the client). Sequential
turns on a new conversation each; protocols in turn, ``--rounds`` rounds of ``--turns`` turns.
**Server CPU per request** = the sidecar's CPU (psutil, all threads) over a protocol's block /
its turns; medians over rounds. **TTFT** = call → first text delta received, p50. *Added* =
door - gRPC. The in-process table runs the door's ASGI app on a stub servicer (a pre-built
4-delta turn): the door's own CPU (request parsing, translation to OpenAI's events, SSE), with
no engine, sockets or HTTP parsing.

Chat Completions without a named conversation also deletes the call's conversation after the
turn (one more store write): its row includes that.

On a 2-core machine the client, the upstream and the sidecar share the cores, and other work may
run beside them: the CPU columns are the measure, TTFT is noisy.

    .venv/bin/python bench/openai_door.py [--quick] [--rounds 5] [--turns 40] [--json PATH]

Results and conditions: bench/openai_door.md.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path

import openai
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
    server_interceptors,
    sidecar_with_doors,
)
from _ttft_clients import QUESTION  # noqa: E402

MODEL = "openai:burst-4"


async def responses_first_token(client: openai.AsyncOpenAI) -> float:
    """A streamed ``responses.create`` read to its end; seconds to its first text delta."""
    start = time.perf_counter()
    first = 0.0
    stream = await client.responses.create(
        model=MODEL, input=QUESTION, conversation=f"b-{uuid.uuid4().hex[:12]}", stream=True
    )
    async for event in stream:
        if not first and event.type == "response.output_text.delta":
            first = time.perf_counter() - start
    if not first:
        raise RuntimeError("no text delta")
    return first


async def chat_first_token(client: openai.AsyncOpenAI) -> float:
    """A streamed ``chat.completions.create`` read to its end; seconds to its first content."""
    start = time.perf_counter()
    first = 0.0
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": QUESTION}], stream=True
    )
    async for chunk in stream:
        if not first and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - start
    if not first:
        raise RuntimeError("no text delta")
    return first


async def run(rounds: int, turns: int) -> Table:
    async with (
        sidecar_with_doors("openai") as (server, grpc_chat, base),
        openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="-", max_retries=0) as client,
    ):
        calls: dict[str, FirstToken] = {
            "gRPC": grpc_chat,
            "OpenAI Responses (stream)": lambda: responses_first_token(client),
            "OpenAI Chat Completions (stream)": lambda: chat_first_token(client),
        }
        ttft, cpu = await against_grpc(server, calls, rounds=rounds, turns=turns, label="openai door")
    return comparison_table(
        f"A turn over the OpenAI door vs gRPC, same sidecar and upstream ({rounds} rounds x {turns} "
        "sequential turns per protocol, 4-delta answer; ms)",
        ttft,
        cpu,
    )


async def in_process(requests: int) -> Table:
    """The door's own CPU per streamed turn, against the in-process call alone."""
    from turnwire_server.http.doors import openai_door

    app, direct = in_process_door(openai_door)
    responses = orjson.dumps({"model": MODEL, "input": QUESTION, "conversation": "c", "stream": True})
    responses_whole = orjson.dumps({"model": MODEL, "input": QUESTION, "conversation": "c"})

    base = await cpu_per_call(direct, requests)
    table = Table(
        f"The OpenAI door's own CPU per turn in process ({requests} requests x 3, median; a pre-built "
        "4-delta turn of 10 events, 18 OpenAI events; µs)",
        ["path", "CPU / request", "added by the door"],
    )
    table.add("in-process call alone (interceptor: RpcObserver)", f"{base * 1e6:.0f}", "")
    for name, body in (
        ("POST /v1/responses, stream", responses),
        ("POST /v1/responses, one JSON answer", responses_whole),
    ):

        async def one(body: bytes = body) -> None:
            await asgi_post(app, "/v1/responses", body)

        own = await cpu_per_call(one, requests)
        table.add(name, f"{own * 1e6:.0f}", f"{(own - base) * 1e6:+.0f}")
    # The same with the server's interceptors and JWT authentication (what a door call pays for its
    # token, its depth check and its slot), and a retry sent with its Idempotency-Key (the stored
    # response read again through ResumeTurn).
    interceptors, token = server_interceptors(Path(tempfile.mkdtemp(prefix="turnwire-bench-jwt-")))
    guarded, guarded_direct = in_process_door(openai_door, interceptors, token)
    base = await cpu_per_call(guarded_direct, requests)
    table.add("in-process call alone (the server's interceptors, JWT auth)", f"{base * 1e6:.0f}", "")
    for name, headers in (
        ("POST /v1/responses, stream (JWT auth)", ()),
        ("POST /v1/responses, stream, a retry (Idempotency-Key; JWT auth)", (("idempotency-key", "k1"),)),
    ):

        async def guarded_one(headers: tuple[tuple[str, str], ...] = headers) -> None:
            await asgi_post(guarded, "/v1/responses", responses, token=token, headers=headers)

        own = await cpu_per_call(guarded_one, requests)
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
    tables = [asyncio.run(in_process(300 if args.quick else 1000))]
    if not args.in_process_only:
        tables.append(asyncio.run(run(rounds, turns)))
    print_tables(tables)
    if args.json:
        write_tables_json(args.json, tables)


if __name__ == "__main__":
    main()
