"""A load-generating client process: S streams running Chat turns back to back.

Used by the diagnostics that run the server in-process (``turn_phases.py``),
so the client gets its own process and core. Prints one JSON line:
events/s, turns/s, and time-to-first-event percentiles (ms) of the turns
started inside the window.

    python bench/_load.py --target 127.0.0.1:50051 --streams 100 --warm 1 --seconds 4
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    CHAT_METHOD,
    CLIENT_OPTIONS,
    STREAM_MODEL,
    chat_request,
    own_cpu_seconds,
    percentile,
)

from turnwire_client.v1 import chat_service_pb2


async def load(
    target: str,
    streams: int,
    warm: float,
    seconds: float,
    tag: str,
    *,
    model: str = "",
    on_window: Callable[[str], None] | None = None,
    count_text: bool = False,
    pause: float = 0.0,
) -> dict[str, float]:
    """Run ``streams`` workers for ``warm`` + ``seconds``; count what arrives in the window.

    ``on_window("start")`` / ``on_window("end")`` run exactly at the window's edges (to
    sample the server's CPU time there). ``count_text`` parses every response, counts the
    characters of text deltas (for coalesced streams, whose events vary in size) and times the
    first text delta of each turn (time to first token); otherwise responses stay raw bytes.
    ``pause`` (seconds) is each worker's think time between its turns: 0 sends the next turn the
    moment the last one's stream ends, while the server still does that turn's trailing writes.
    """
    counts = {"events": 0, "turns": 0, "text": 0}
    first_event: list[tuple[float, float]] = []  # (call start, seconds to first message)
    first_token: list[tuple[float, float]] = []  # (call start, seconds to first text delta)
    stop = asyncio.Event()
    async with grpc.aio.insecure_channel(target, options=CLIENT_OPTIONS) as channel:
        chat = channel.unary_stream(
            CHAT_METHOD,
            request_serializer=chat_service_pb2.ChatRequest.SerializeToString,
            response_deserializer=chat_service_pb2.ChatResponse.FromString if count_text else None,
        )

        async def worker(w: int) -> None:
            k = 0
            while not stop.is_set():
                start = time.perf_counter()
                call = chat(chat_request(f"{tag}-{w}-{k}", model or STREAM_MODEL))
                response = await call.read()
                if response is grpc.aio.EOF:
                    raise RuntimeError(f"empty stream: {await call.code()}")
                first_event.append((start, time.perf_counter() - start))
                token_seen = False
                while response is not grpc.aio.EOF:
                    counts["events"] += 1
                    if count_text and response.event.HasField("text_delta"):
                        counts["text"] += len(response.event.text_delta.delta)
                        if not token_seen:
                            token_seen = True
                            first_token.append((start, time.perf_counter() - start))
                    response = await call.read()
                counts["turns"] += 1
                k += 1
                if pause:
                    await asyncio.sleep(pause)

        tasks = [asyncio.create_task(worker(w)) for w in range(streams)]
        await asyncio.sleep(warm)
        e0, n0, x0 = counts["events"], counts["turns"], counts["text"]
        t0, c0 = time.perf_counter(), own_cpu_seconds()
        if on_window is not None:
            on_window("start")
        await asyncio.sleep(seconds)
        e1, n1, x1 = counts["events"], counts["turns"], counts["text"]
        t1, c1 = time.perf_counter(), own_cpu_seconds()
        if on_window is not None:
            on_window("end")
        stop.set()
        await asyncio.gather(*tasks)
    in_window = [d for s, d in first_event if t0 <= s <= t1]
    tokens_in_window = [d for s, d in first_token if t0 <= s <= t1]
    return {
        "events": e1 - e0,
        "events_per_s": (e1 - e0) / (t1 - t0),
        "turns_per_s": (n1 - n0) / (t1 - t0),
        "text_chars_per_s": (x1 - x0) / (t1 - t0),
        "client_cores": (c1 - c0) / (t1 - t0),
        "ttfe_p50_ms": percentile(in_window, 50) * 1000,
        "ttfe_p99_ms": percentile(in_window, 99) * 1000,
        "ttft_p50_ms": percentile(tokens_in_window, 50) * 1000 if tokens_in_window else float("nan"),
        "ttft_p99_ms": percentile(tokens_in_window, 99) * 1000 if tokens_in_window else float("nan"),
        "window_start": t0,
        "window_end": t1,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", required=True)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--warm", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--tag", default="load")
    parser.add_argument("--model", default=STREAM_MODEL)
    parser.add_argument(
        "--count-text", action="store_true", help="parse events: text and time to first token"
    )
    parser.add_argument("--pause-ms", type=float, default=0.0, help="think time between a worker's turns")
    args = parser.parse_args()
    result = asyncio.run(
        load(
            args.target,
            args.streams,
            args.warm,
            args.seconds,
            args.tag,
            model=args.model,
            count_text=args.count_text,
            pause=args.pause_ms / 1000.0,
        )
    )
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
