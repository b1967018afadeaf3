"""CPU per streamed chunk of the engine, the provider adapters and the SDKs' HTTP client, without gRPC.

Where a sidecar's CPU per chunk (``ttft.py --budget``'s slope, ``chunk_cost_ab.py``) goes: the
real :class:`TurnEngine` in this process (SQLite in a temp dir, no middleware) on the real
``anthropic`` and ``openai`` adapters, whose official SDK clients call the local upstream
(``_upstream.py``, its own process); each turn's events are drained as they come (in process: no
gRPC write). Per API, ``--rounds`` rounds of ``--turns`` turns of ``burst-4`` and of ``burst-N``
(``--deltas``) answers on new conversations: the process's CPU (``process_time``: the SQLite
writer's thread included) and the event loop thread's (``thread_time``) per turn, medians over the
rounds, and the slope per extra chunk. The sidecar's slope minus this one is what the gRPC side
costs per chunk (the RPC's write, its completion and the generators in between).

``--aiohttp`` gives both SDK clients their ``DefaultAioHttpClient`` (the SDKs' documented aiohttp
transport; needs ``pip install aiohttp``) instead of the default ``httpx2`` one, to price the HTTP
stack. ``--profile`` prints a cProfile of the loop thread over ``--turns`` long-answer turns.

    .venv/bin/python bench/engine_chunk_cost.py [--rounds 5] [--turns 30] [--deltas 200]
        [--apis openai,anthropic] [--aiohttp] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import pstats
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import anthropic
import openai
from _common import Table, print_tables
from _ttft_clients import Upstream

from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api.status import status_of
from turnwire_server.engine import EngineSettings, TurnEngine, TurnRequest
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider
from turnwire_server.providers.openai_chat import OpenAIChatProvider
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.sqlite import SqliteStore

SHORT = 4
_numbers = itertools.count(1)


async def _turn(engine: TurnEngine, model: str) -> None:
    """One Chat turn on a new conversation, its events drained."""
    number = next(_numbers)
    message = message_pb2.Message(id=f"u{number}", role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "go"
    handle = await engine.start(
        TurnRequest(
            conversation_id=f"bench-{number}",
            request_id=f"r{number}",
            messages=[message],
            body={},
            model=model,
            continuation=False,
            response_type=chat_service_pb2.ChatResponse,
        )
    )
    async for _ in handle:
        pass
    await handle.task


async def _per_turn(engine: TurnEngine, model: str, turns: int) -> tuple[float, float]:
    """(process CPU, loop thread CPU) per turn of ``model``, s."""
    process, thread = time.process_time(), time.thread_time()
    for _ in range(turns):
        await _turn(engine, model)
    return (time.process_time() - process) / turns, (time.thread_time() - thread) / turns


def _providers(upstream: str, aiohttp: bool) -> ProviderRegistry:
    anthropic_http: dict[str, Any] = {"http_client": anthropic.DefaultAioHttpClient()} if aiohttp else {}
    openai_http: dict[str, Any] = {"http_client": openai.DefaultAioHttpClient()} if aiohttp else {}
    return ProviderRegistry(
        {
            "anthropic": AnthropicMessagesProvider(
                "anthropic",
                anthropic.AsyncAnthropic(base_url=upstream, api_key="bench", max_retries=0, **anthropic_http),
            ),
            "openai": OpenAIChatProvider(
                "openai",
                openai.AsyncOpenAI(base_url=f"{upstream}/v1", api_key="bench", max_retries=0, **openai_http),
            ),
        }
    )


async def main(args: argparse.Namespace) -> None:
    """Measure each API (and profile, with ``--profile``); print the table."""
    table = Table(
        f"Engine, adapters and HTTP client in process (no gRPC), {args.rounds} rounds x {args.turns} "
        f"turns, {'aiohttp' if args.aiohttp else 'httpx2'} transport (medians)",
        [
            "API",
            "process CPU ms/turn, 4 / N deltas",
            "loop CPU ms/turn, 4 / N",
            "process µs/chunk",
            "loop µs/chunk",
        ],
    )
    upstream = Upstream()
    try:
        with tempfile.TemporaryDirectory(prefix="turnwire-bench-chunks-") as tmp:
            store = SqliteStore(Path(tmp) / "bench.sqlite")
            await store.open()
            providers = _providers(upstream.url, args.aiohttp)
            engine = TurnEngine(
                store=store,
                providers=providers,
                tools={},
                chain=MiddlewareChain([]),
                settings=EngineSettings(default_model=f"openai:burst-{SHORT}"),
                error_status=status_of,
            )
            try:
                for api in args.apis.split(","):
                    short, long = f"{api}:burst-{SHORT}", f"{api}:burst-{args.deltas}"
                    for _ in range(10):  # warm-up: connections, first-call costs
                        await _turn(engine, short)
                        await _turn(engine, long)
                    rounds = [
                        (
                            await _per_turn(engine, short, args.turns),
                            await _per_turn(engine, long, args.turns),
                        )
                        for _ in range(args.rounds)
                    ]
                    p4, t4 = (statistics.median(r[0][i] for r in rounds) for i in (0, 1))
                    pn, tn = (statistics.median(r[1][i] for r in rounds) for i in (0, 1))
                    extra = args.deltas - SHORT
                    table.add(
                        api,
                        f"{p4 * 1e3:.2f} / {pn * 1e3:.2f}",
                        f"{t4 * 1e3:.2f} / {tn * 1e3:.2f}",
                        f"{(pn - p4) / extra * 1e6:.1f}",
                        f"{(tn - t4) / extra * 1e6:.1f}",
                    )
                    if args.profile:
                        profile = cProfile.Profile(time.thread_time)
                        profile.enable()
                        for _ in range(args.turns):
                            await _turn(engine, long)
                        profile.disable()
                        out = io.StringIO()
                        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(30)
                        print(f"{api}, {args.turns} turns of {args.deltas} deltas:\n{out.getvalue()}")
            finally:
                await providers.aclose()
                await store.close()
    finally:
        upstream.close()
    print_tables([table])


def _options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--deltas", type=int, default=200)
    parser.add_argument("--apis", default="openai,anthropic")
    parser.add_argument(
        "--aiohttp", action="store_true", help="the SDKs' aiohttp transport (pip install aiohttp)"
    )
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of the loop thread")
    return parser.parse_args()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main(_options()))
