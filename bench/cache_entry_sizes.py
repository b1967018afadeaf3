"""What an entry of each cache of conversations costs in RSS, against what it counts in the cache
budget (issue 32, item 11; ``server/turnwire_server/cache_budget.py``).

In this process, with a budget large enough to keep everything: ``--conversations`` conversations of
``--messages`` text messages each (user and assistant alternating, every text ``--text-bytes``
long) go through each cache in the order a turn uses them: the store's decoded messages (rows as
SQLite returns them), the open-call search, the Anthropic and OpenAI Chat conversions, their prefix
states, and the JSON bodies. After each stage: the growth of this process's RSS (``/proc/self/statm``,
after ``gc.collect()``) per message, and what that stage's regions counted per message. The
per-entry constants in the server's docstrings are the fixed parts of these figures; the counted
column should stay near or above the RSS one.

    .venv/bin/python bench/cache_entry_sizes.py                    # 150-byte and 4 KiB texts
    .venv/bin/python bench/cache_entry_sizes.py --text-bytes 150

Printed only (a table).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import Table, machine_summary, print_tables

from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CACHES
from turnwire_server.engine import pending_calls
from turnwire_server.providers import anthropic_request, openai_chat_request, streaming
from turnwire_server.store.core.message_cache import DecodedMessages

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """This process's resident set, in bytes, after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def rows(conversation: int, messages: int, text_bytes: int) -> list[tuple[Any, ...]]:
    """What the history statement returns for a conversation of ``messages`` text messages."""
    out = []
    for index in range(messages):
        part = message_pb2.Part()
        part.text.text = (f"{conversation}:{index} " + "x" * text_bytes)[:text_bytes]
        role = message_pb2.ROLE_USER if index % 2 == 0 else message_pb2.ROLE_ASSISTANT
        message_id = f"msg_{conversation:06d}_{index:04d}_{'0' * 20}"
        out.append(
            (
                100,
                0,
                index + 1,
                message_id,
                index + 1,
                role,
                1_700_000_000_000_000,
                0,
                None,
                part.SerializeToString(),
            )
        )
    return out


def measure(conversations: int, messages: int, text_bytes: int) -> list[list[str]]:
    CACHES.resize(1 << 40)
    CACHES.clear()
    decoded = DecodedMessages("sqlite")
    histories: list[tuple[str, list[message_pb2.Message]]] = []
    total = conversations * messages
    results: list[list[str]] = []
    regions_before = 0

    def stage(name: str, before: int) -> None:
        nonlocal regions_before
        grown = rss() - before
        counted = CACHES.counted_bytes - regions_before
        regions_before = CACHES.counted_bytes
        results.append(
            [name, f"{text_bytes:,}", f"{total:,}", f"{grown / total:,.0f}", f"{counted / total:,.0f}"]
        )

    start = rss()
    for number in range(conversations):
        read = decoded.read(f"c{number}")
        histories.append((f"c{number}", list(decoded.messages(read, rows(number, messages, text_bytes)))))
    stage("store: decoded messages", start)
    start = rss()
    for conversation_id, history in histories:
        pending_calls._SEARCHES.search(conversation_id, tuple(history))
    stage("engine: open-call searches", start)
    bodies = []
    start = rss()
    for _, history in histories:
        for message in history:
            anthropic_request._converted(message)
            openai_chat_request._converted(message)
    stage("adapters: conversions (Anthropic + OpenAI Chat)", start)
    start = rss()
    for _, history in histories:
        _, turns = anthropic_request.convert_messages(history, [])
        chat = openai_chat_request.convert_messages("system", history, [])
        bodies.append((turns, chat))
    stage("adapters: prefix states (both)", start)
    start = rss()
    for turns, chat in bodies:
        streaming._BODIES.encode({"model": "m", "messages": turns})
        streaming._BODIES.encode({"model": "m", "messages": chat})
    stage("adapters: JSON bodies (both)", start)
    del bodies, histories
    CACHES.clear()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=2_000)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--text-bytes", type=int, action="append")
    parser.add_argument("--rows-of", type=int, help=argparse.SUPPRESS)  # one size, rows as JSON
    args = parser.parse_args()
    if args.rows_of is not None:
        print(json.dumps(measure(args.conversations, args.messages, args.rows_of)))
        return
    table = Table(
        "Cache entry sizes: RSS grown vs bytes counted, per message (issue 32 item 11)",
        ["cache", "text bytes", "messages", "RSS per message", "counted per message"],
    )
    for text_bytes in args.text_bytes or [150, 4096]:
        # Each size in a fresh process: memory freed by one run would be reused by the next.
        argv = [
            sys.executable,
            __file__,
            "--conversations",
            str(args.conversations),
            "--messages",
            str(args.messages),
            "--rows-of",
            str(text_bytes),
        ]
        out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
        for row in json.loads(out.strip().splitlines()[-1]):
            table.add(*row)
    table.notes = [
        f"{args.conversations:,} conversations x {args.messages} messages, a fresh process per text size, "
        "budget unbounded; "
        "RSS from /proc/self/statm after gc.collect(); each row is what its stage added.",
        machine_summary(),
    ]
    print_tables([table])


if __name__ == "__main__":
    main()
