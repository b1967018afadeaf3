"""The sidecar's RSS over a long run of many conversations (issue 32, item 11: memory bounded in bytes).

A real ``turnwire serve`` (SQLite, no middleware) with the ``openai`` and ``anthropic`` providers
pointed at the local upstream (``_upstream.py``, its own process), so that the store's decoded
messages and the adapters' conversions, prefix states and kept JSON bodies all fill. ``--concurrency``
clients take the conversations one after another; each conversation gets ``--turns`` Chat turns in a
row (its provider alternates by conversation), the user messages mixed 150-byte and 4 KiB (every
``--large-every``-th is the large one), the replies ``burst-24`` (24 words). The server's RSS
(``/proc/<pid>/status`` ``VmRSS``, through psutil) is sampled at each twentieth of the conversations;
the table gives it at the start and at each quarter and the growth over the last quarter, PASS
under 5 %. What the cache budget counted (``turnwire_cache_bytes``, ``/metrics``) is shown beside
when the server exports it.

    .venv/bin/python bench/memory_soak.py                        # 10,000 conversations x 4 turns
    .venv/bin/python bench/memory_soak.py --conversations 1000   # a smoke run
    TURNWIRE_MEMORY__CACHE_BYTES=67108864 .venv/bin/python bench/memory_soak.py   # another budget

Printed (a table); in ``make bench`` (``run.py``, ``--skip-memory-soak``). The before/after note is
``memory_soak.md``. To measure another checkout's server, put its source roots first on
``PYTHONPATH`` (the server process inherits it).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
from _common import (
    CLIENT_OPTIONS,
    PYTHON,
    ServerProcess,
    Table,
    free_port,
    machine_summary,
    print_tables,
    verdict,
    write_tables_json,
)
from _ttft_clients import Upstream

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc, event_pb2

MIB = 2**20
SMALL_BYTES = 150
LARGE_BYTES = 4096
GROWTH_TARGET = 0.05
_WORDS = "a user asks the model about the weather and the way home and what to cook tonight "
_CACHE_BYTES = re.compile(rb"^turnwire_cache_bytes (\S+)$", re.MULTILINE)
_CACHE_LIMIT = re.compile(rb"^turnwire_cache_limit_bytes (\S+)$", re.MULTILINE)


def user_text(conversation: int, turn: int, size: int) -> str:
    """A user message of exactly ``size`` bytes (ASCII), different per conversation and turn."""
    head = f"[{conversation}:{turn}] "
    return (head + _WORDS * (size // len(_WORDS) + 1))[:size]


def sidecar(workdir: Path, upstream: str) -> ServerProcess:
    """The sidecar under test (not yet started): SQLite in ``workdir``, both providers on the upstream."""
    port, metrics_port = free_port(), free_port()
    config = workdir / "turnwire.yaml"
    config.write_text(
        f"""\
listen: 127.0.0.1:{port}
default_model: openai:burst-24
logging: {{level: warning}}
store:
  url: sqlite:///{workdir / "turnwire.db"}
providers:
  openai:
    type: openai
    base_url: {upstream}/v1
    api_key_env: null
    max_retries: 0
  anthropic:
    type: anthropic
    base_url: {upstream}
    api_key_env: null
    max_retries: 0
tools:
  demo: false
metrics:
  enabled: true
  listen: 127.0.0.1:{metrics_port}
limits:
  shutdown_grace_seconds: 1
"""
    )
    server = ServerProcess(
        [PYTHON, "-m", "turnwire_server", "serve", "--config", str(config)], port, workdir, "turnwire"
    )
    server.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"  # type: ignore[attr-defined]
    return server


def cache_figures(url: str) -> tuple[float, float] | None:
    """``(bytes counted, limit)`` from the server's ``/metrics``, None when it exports neither."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read()
    except OSError:
        return None
    counted, limit = _CACHE_BYTES.search(text), _CACHE_LIMIT.search(text)
    if counted is None or limit is None:
        return None
    return float(counted.group(1)), float(limit.group(1))


@dataclass
class Sample:
    conversations: int
    turns: int
    rss: int
    seconds: float
    counted: tuple[float, float] | None


async def run(
    conversations: int, turns: int, concurrency: int, large_every: int
) -> tuple[Table, list[Sample]]:
    with tempfile.TemporaryDirectory(prefix="turnwire-memory-soak-") as tmp:
        upstream = Upstream()
        server = sidecar(Path(tmp), upstream.url)
        try:
            await server.start(startup_seconds=300)  # a loaded machine imports slowly
            samples = await _soak(server, conversations, turns, concurrency, large_every)
        finally:
            server.stop()
            upstream.close()
    return _table(samples, turns, concurrency, large_every), samples


async def _soak(
    server: ServerProcess, conversations: int, turns: int, concurrency: int, large_every: int
) -> list[Sample]:
    metrics_url: str = server.metrics_url  # type: ignore[attr-defined]
    started = time.monotonic()
    samples = [Sample(0, 0, server.rss(), 0.0, cache_figures(metrics_url))]
    marks = {conversations * twentieth // 20 for twentieth in range(1, 21)}
    done = 0
    turns_done = 0
    next_conversation = 0
    sampling = asyncio.Lock()

    async def client() -> None:
        nonlocal done, turns_done, next_conversation
        async with grpc.aio.insecure_channel(server.target, options=CLIENT_OPTIONS) as channel:
            stub = chat_service_pb2_grpc.ChatServiceStub(channel)
            while next_conversation < conversations:
                number = next_conversation
                next_conversation += 1
                model = "openai:burst-24" if number % 2 == 0 else "anthropic:burst-24"
                for turn in range(turns):
                    large = (number * turns + turn) % large_every == large_every - 1
                    request = chat_service_pb2.ChatRequest(conversation_id=f"soak-{number:06d}", model=model)
                    request.message.parts.add().text.text = user_text(
                        number, turn, LARGE_BYTES if large else SMALL_BYTES
                    )
                    end = None
                    async for response in stub.Chat(request, timeout=120):
                        if response.event.HasField("turn_end"):
                            end = response.event.turn_end
                    if end is None or end.status != event_pb2.TURN_STATUS_COMPLETED:
                        raise RuntimeError(f"turn {number}/{turn} did not complete: {end}")
                    turns_done += 1
                done += 1
                if done in marks:
                    async with sampling:
                        samples.append(
                            Sample(
                                done,
                                turns_done,
                                server.rss(),
                                time.monotonic() - started,
                                cache_figures(metrics_url),
                            )
                        )
                        print(
                            f"  [{done:,} conversations, {turns_done:,} turns, RSS "
                            f"{samples[-1].rss / MIB:.0f} MiB, {samples[-1].seconds:.0f} s]",
                            file=sys.stderr,
                            flush=True,
                        )

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples


def _table(samples: list[Sample], turns: int, concurrency: int, large_every: int) -> Table:
    total = samples[-1].conversations
    table = Table(
        f"Memory soak: server RSS over {total:,} conversations x {turns} turns (issue 32 item 11)",
        ["point", "conversations", "turns", "RSS MiB", "cache counted MiB (limit)", "elapsed s"],
    )
    by_conversations = {sample.conversations: sample for sample in samples}
    points = [("start", samples[0])]
    for quarter in range(1, 5):  # sampled at every twentieth, so at each quarter
        points.append((f"{quarter}/4", by_conversations[total * quarter // 4]))
    for label, sample in points:
        counted = (
            "-"
            if sample.counted is None
            else f"{sample.counted[0] / MIB:.1f} ({sample.counted[1] / MIB:.0f})"
        )
        table.add(
            label,
            f"{sample.conversations:,}",
            f"{sample.turns:,}",
            f"{sample.rss / MIB:.0f}",
            counted,
            f"{sample.seconds:.0f}",
        )
    three_quarters, last = points[3][1], points[4][1]
    growth = (last.rss - three_quarters.rss) / three_quarters.rss
    table.add(
        "growth over the last quarter",
        "",
        "",
        f"{growth * 100:+.1f} %",
        "",
        verdict(growth < GROWTH_TARGET),
    )
    table.notes = [
        f"{concurrency} clients, conversations one after another, each {turns} Chat turns in a row; user "
        f"messages {SMALL_BYTES} B, every {large_every}th {LARGE_BYTES} B; replies burst-24 from the local "
        "upstream; providers openai and anthropic alternating by conversation; SQLite store.",
        "RSS is VmRSS of the server process (psutil, /proc). Target: under 5 % growth over the last quarter "
        "(PASS/MISS, not asserted).",
        f"Every twentieth: {', '.join(f'{s.rss / MIB:.0f}' for s in samples)} MiB.",
        machine_summary(),
    ]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--large-every", type=int, default=4, help="every Nth user message is 4 KiB")
    parser.add_argument("--quick", action="store_true", help="1,000 conversations")
    parser.add_argument("--json", type=Path, help="also write the table as JSON (bench/run.py)")
    args = parser.parse_args()
    conversations = 1_000 if args.quick else args.conversations
    table, _ = asyncio.run(run(conversations, args.turns, args.concurrency, args.large_every))
    print_tables([table])
    if args.json:
        write_tables_json(args.json, [table])


if __name__ == "__main__":
    main()
