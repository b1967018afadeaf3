"""What one ``GetConversation`` costs the sidecar (in process: the service method on a real store,
no gRPC), on a conversation of 1 and of ``--turns`` ended turns, this tree against another
checkout's (``--old``; its ``server``, ``middleware`` and ``clients/python/src`` go first on the
``PYTHONPATH`` of a child process), on SQLite and PostgreSQL (bench/openai_door.md, "stop 70").

Each turn is a user message and a 50-byte reply with a cost; the read is the OpenAI door's
follow-up read (``start_message_id`` = the last reply, ``page_size`` 16). Per arm, store and
conversation: ``--rounds`` rounds (the arms alternate) of ``--calls`` calls after 20 to warm up;
per call the wall time and the process's CPU (all threads: SQLite's reader too; PostgreSQL's
server CPU is not counted), medians of the rounds. Printed, never asserted; note the load.

    flock /tmp/bench.lock .venv/bin/python bench/conversation_view.py --old /path/to/checkout
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import checkout_pythonpath

REPO = Path(__file__).resolve().parents[1]


async def _measure(store_kind: str, turns: int, calls: int) -> dict[str, float]:
    """In the child: build the conversation, then time ``calls`` reads of it."""
    sys.path.insert(0, str(REPO / "tests"))
    from support.store_turns import started_turn
    from support.stores import postgres_database

    from turnwire_client.v1 import chat_service_pb2, message_pb2
    from turnwire_server.api import chat_service
    from turnwire_server.store.postgres import PostgresStore
    from turnwire_server.store.sqlite import SqliteStore

    with tempfile.TemporaryDirectory() as tmp, postgres_database() as url:
        store = SqliteStore(Path(tmp) / "bench.db") if store_kind == "sqlite" else PostgresStore(url)
        await store.open()
        try:
            last = ""
            for n in range(turns):
                turn = await started_turn(store, "c", n)
                reply = message_pb2.Message(id=turn.assistant_message_id, role=message_pb2.ROLE_ASSISTANT)
                reply.parts.add().text.text = "an answer " * 5
                ended = dataclasses.replace(
                    turn, state="completed", end_time=turn.start_time, cost_usd=0.001, cost_source="config"
                )
                await store.finish_turn(ended, reply)
                last = turn.assistant_message_id
            service = chat_service.ChatService(
                None,  # type: ignore[arg-type]
                store,
                None,  # type: ignore[arg-type]
                default_model="scripted:echo",
                max_message_bytes=1 << 20,
            )
            request = chat_service_pb2.GetConversationRequest(
                conversation_id="c", start_message_id=last, page_size=16
            )
            for _ in range(20):
                await service.GetConversation(request, None)
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(calls):
                await service.GetConversation(request, None)
            return {
                "wall_ms": (time.perf_counter() - wall) / calls * 1e3,
                "cpu_ms": (time.process_time() - cpu) / calls * 1e3,
            }
        finally:
            await store.close()


def _run_arm(tree: Path, store_kind: str, turns: int, calls: int) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=checkout_pythonpath(tree))
    out = subprocess.run(
        [sys.executable, __file__, "--child", store_kind, str(turns), str(calls)],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    ).stdout
    result: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="the checkout the old arm runs (required)")
    parser.add_argument("--turns", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, turns, calls = args.child
        print(json.dumps(asyncio.run(_measure(kind, int(turns), int(calls)))))
        return
    if args.old is None:
        parser.error("--old is required")
    print(f"load average {os.getloadavg()[0]:.2f}/{os.getloadavg()[1]:.2f} (1/5 min) at the start")
    arms = {"old": args.old.resolve(), "new": REPO}
    seen: dict[tuple[str, str, int], list[dict[str, float]]] = {}
    for round_ in range(args.rounds):
        for store_kind in ("sqlite", "postgres"):
            for turns in (1, args.turns):
                order = list(arms) if round_ % 2 == 0 else list(reversed(arms))
                for arm in order:
                    result = _run_arm(arms[arm], store_kind, turns, args.calls)
                    seen.setdefault((arm, store_kind, turns), []).append(result)
    print("| store | turns | code | wall ms / call p50 of rounds | sidecar CPU ms / call |")
    print("|---|---|---|---|---|")
    for (arm, store_kind, turns), results in sorted(
        seen.items(), key=lambda kv: (kv[0][1:], kv[0][0] != "old")
    ):
        wall = statistics.median(r["wall_ms"] for r in results)
        cpu = statistics.median(r["cpu_ms"] for r in results)
        print(f"| {store_kind} | {turns:,} | {arm} | {wall:.2f} | {cpu:.2f} |")
    print(f"load average {os.getloadavg()[0]:.2f} (1 min) at the end")


if __name__ == "__main__":
    main()
