"""The history-dependent part of a turn, in process (issue 17: per-turn work independent of history
length): CPU per turn of reading the transcript from the SQLite store (``load_messages``) and of
building the Anthropic Messages and OpenAI Chat requests from it, with 0, 100 and 1,000 prior turns.

Each prior turn is a user message and an assistant message (a step with a text). Every measured
turn appends a user message, reads the transcript and builds both requests, then appends the
reply, as the engine does; CPU is the process's (all threads: the store's reader's too), median of
``--repeats`` runs of ``--turns`` turns. No server, no HTTP, no SDK: the sidecar's own cost only,
without ``ttft.py``'s noise. Compare code versions by putting the other one first on
``PYTHONPATH`` (e.g. ``PYTHONPATH=/path/to/main/server``). Target (issue 17): no more than
+0.2 ms per turn from 0 to 1,000 prior turns, whole turn; printed, never asserted.

    .venv/bin/python bench/history_cost.py [--turns 10] [--repeats 5] [--histories 0,100,1000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from turnwire.providers import ModelRequest
from turnwire_client.v1 import message_pb2
from turnwire_server.providers.anthropic_request import build_request as anthropic_request
from turnwire_server.providers.openai_chat_request import build_request as chat_request
from turnwire_server.store.sqlite import SqliteStore

COLUMNS = ("load_messages", "Anthropic request", "OpenAI Chat request")


def _user(i: int) -> message_pb2.Message:
    message = message_pb2.Message(id=f"u{i}", role=message_pb2.ROLE_USER)
    message.parts.add().text.text = f"Question {i}: what is the weather like in Paris today?"
    return message


def _assistant(i: int) -> message_pb2.Message:
    message = message_pb2.Message(id=f"a{i}", role=message_pb2.ROLE_ASSISTANT)
    message.parts.add().step_start.SetInParent()
    message.parts.add().text.text = (
        "The quick brown fox jumps over the lazy dog while the model streams its answer."
    )
    return message


async def measure(history: int, turns: int, repeats: int) -> list[float]:
    """Median ms of CPU per turn for each of :data:`COLUMNS`."""
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-history-") as tmp:
        store = SqliteStore(Path(tmp) / "turnwire.db")
        await store.open()
        try:
            seed = [m for i in range(history) for m in (_user(i), _assistant(i))] or [_user(-1)]
            await store.add_messages("c1", seed, mode="append", allow_missing=True)
            await store.load_messages("c1")
            n = history
            runs: list[list[float]] = [[], [], []]
            for _ in range(repeats):
                spent = [0.0, 0.0, 0.0]
                for _ in range(turns):
                    n += 1
                    await store.add_messages("c1", [_user(n)], mode="append", allow_missing=False)
                    start = time.process_time()
                    messages = await store.load_messages("c1")
                    loaded = time.process_time()
                    request = ModelRequest(model="m", system="", messages=messages)
                    anthropic_request(
                        request, provider="anthropic", default_max_tokens=100, structured_output="tool"
                    )
                    anthropic = time.process_time()
                    chat_request(
                        request, provider="openai", max_tokens_param="max_tokens", include_usage=True
                    )
                    chat = time.process_time()
                    spent[0] += loaded - start
                    spent[1] += anthropic - loaded
                    spent[2] += chat - anthropic
                    await store.add_messages("c1", [_assistant(n)], mode="append", allow_missing=False)
                for column, total in enumerate(spent):
                    runs[column].append(total / turns * 1000)
            return [statistics.median(run) for run in runs]
        finally:
            await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--histories", default="0,100,1000")
    args = parser.parse_args()
    histories = [int(h) for h in args.histories.split(",")]
    print("| prior turns | " + " | ".join(f"{c} ms" for c in COLUMNS) + " | sum ms | sum vs 0 turns ms |")
    print("|---|" + "---|" * (len(COLUMNS) + 2))
    base: float | None = None
    for history in histories:
        row = await measure(history, args.turns, args.repeats)
        total = sum(row)
        base = total if base is None else base
        growth = f"+{total - base:.2f}" if history != histories[0] else ""
        print(f"| {history:,} | " + " | ".join(f"{v:.2f}" for v in row) + f" | {total:.2f} | {growth} |")


if __name__ == "__main__":
    asyncio.run(main())
