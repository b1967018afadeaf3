"""The cloud platforms' adapters against the Anthropic adapter on the same replayed answer.

For each adapter a replay server (its own process, so its CPU is not counted) serves the same
answer of N text deltas (default 500) in that platform's wire format, one HTTP chunk per event:
Anthropic's and Vertex AI's server-sent events, Bedrock's AWS event-stream messages (each a
``chunk`` with the event's JSON in base64), Gemini's ``data:`` lines of ``GenerateContentResponse``
JSON. This process runs R requests through each adapter (built as a config entry builds it;
credentials from the environment: AWS keys signed with SigV4 per request, a fixed Vertex AI access
token, Gemini's API key) and measures, client side: time to first chunk (call → first chunk, p50)
and CPU per event (this process's CPU for the whole request / events, median).

What it shows: what each platform adds over the Anthropic adapter before the first token (SigV4
signing in a worker thread for Bedrock) and per event (event-stream framing and base64 for
Bedrock; google-genai's typed parsing for Gemini, which does not use the lean SSE reader).
Target: the same as the other adapters' (bench/provider_adapters.py), ≤ 25 µs of CPU per event.

    .venv/bin/python bench/cloud_providers.py [--deltas 500] [--requests 30] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from _common import Table, percentile, print_tables, verdict, write_tables_json  # noqa: E402

from turnwire.providers import ModelRequest, Provider  # noqa: E402
from turnwire_client.v1 import message_pb2  # noqa: E402
from turnwire_server.providers import settings as entries  # noqa: E402

CPU_TARGET_US = 25.0
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]

# The replay server for one body: chunks in a file (orjson list of base64 strings) and a content type.
SERVE = """
import sys, time, base64, orjson
from providers.replay import ReplayServer, Reply
chunks = [base64.b64decode(c) for c in orjson.loads(open(sys.argv[1], 'rb').read())]
server = ReplayServer()
server.default = Reply(headers={'content-type': sys.argv[2]}, chunks=chunks)
server.start()
print(server.url, flush=True)
while True:
    time.sleep(3600)
    server.requests.clear()
"""


def anthropic_events(deltas: int) -> list[dict[str, Any]]:
    usage = {
        "input_tokens": 12,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    message = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "model": "claude-bench",
        "content": [],
    }
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": {**message, "usage": usage}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    ]
    events += [
        {
            "type": "content_block_delta",
            "index": 0,
            "delta": {"type": "text_delta", "text": WORDS[i % 9] + " "},
        }
        for i in range(deltas)
    ]
    return [
        *events,
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": deltas}},
        {"type": "message_stop"},
    ]


def sse_chunks(events: list[dict[str, Any]]) -> list[bytes]:
    return [b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps(e)) for e in events]


def bedrock_chunks(events: list[dict[str, Any]]) -> list[bytes]:
    sys.path.insert(0, str(REPO / "tests"))
    from support.aws_event_stream import chunks

    return chunks(events)


def gemini_chunks(deltas: int) -> list[bytes]:
    def event(parts: list[dict[str, Any]], finish: str | None = None) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        body: dict[str, Any] = {"candidates": [candidate], "modelVersion": "gemini-bench", "responseId": "r"}
        if finish:
            body["usageMetadata"] = {"promptTokenCount": 12, "candidatesTokenCount": deltas}
        return b"data: " + orjson.dumps(body) + b"\r\n\r\n"

    return [event([{"text": WORDS[i % 9] + " "}]) for i in range(deltas)] + [event([], "STOP")]


class Server:
    """The replay server in its own process, serving ``chunks`` for every request."""

    def __init__(self, chunks: list[bytes], content_type: str) -> None:
        self._file = tempfile.NamedTemporaryFile(suffix=".json")  # noqa: SIM115 - lives as long as the server
        self._file.write(orjson.dumps([base64.b64encode(c).decode() for c in chunks]))
        self._file.flush()
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE, self._file.name, content_type],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO / "tests",
        )
        assert self.process.stdout is not None
        self.url = self.process.stdout.readline().strip()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(5)
        self._file.close()


def _request(model: str) -> ModelRequest:
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "Tell me a story."
    return ModelRequest(model=model, system="You are terse.", messages=[message])


def _provider(kind: str, url: str) -> Provider:
    common: dict[str, Any] = {"type": kind, "base_url": url, "max_retries": 0}
    if kind == "anthropic":
        return entries.build_provider(
            kind, entries.AnthropicProviderSettings(**common, api_key_env="BENCH_KEY")
        )
    if kind == "bedrock":
        return entries.build_provider(kind, entries.BedrockProviderSettings(**common, region="us-east-1"))
    if kind == "vertex":
        settings = entries.VertexProviderSettings(**{**common, "base_url": f"{url}/v1"}, project="bench")
        provider = entries.build_provider(kind, settings)
        provider.client.access_token = "bench-token"  # type: ignore[attr-defined]  # no token endpoint here
        return provider
    return entries.build_provider(kind, entries.GeminiProviderSettings(**common, api_key_env="BENCH_KEY"))


async def bench(kind: str, deltas: int, requests: int) -> tuple[int, float, float]:
    """``(events, TTFC p50 seconds, CPU seconds per event)`` of adapter ``kind``."""
    events = anthropic_events(deltas)
    chunks, content_type = {
        "anthropic": (sse_chunks(events), "text/event-stream"),
        "vertex": (sse_chunks(events), "text/event-stream"),
        "bedrock": (bedrock_chunks(events), "application/vnd.amazon.eventstream"),
        "gemini": (gemini_chunks(deltas), "text/event-stream"),
    }[kind]
    server = Server(chunks, content_type)
    model = {"bedrock": "anthropic.claude-bench-v1:0", "gemini": "gemini-bench"}.get(kind, "claude-bench")
    try:
        provider = _provider(kind, server.url)
        samples: list[tuple[float, float]] = []
        for index in range(requests + 3):  # 3 to warm up: connections, imports, credentials
            cpu0, start = time.process_time(), time.perf_counter()
            first: float | None = None
            async for _ in provider.stream(_request(model)):
                if first is None:
                    first = time.perf_counter() - start
            if index >= 3 and first is not None:
                samples.append((first, time.process_time() - cpu0))
        await provider.aclose()
    finally:
        server.close()
    ttfc = percentile([s[0] for s in samples], 50)
    return len(chunks), ttfc, statistics.median(s[1] for s in samples) / len(chunks)


async def run(deltas: int, requests: int) -> Table:
    os.environ.update(
        BENCH_KEY="bench-key",
        AWS_ACCESS_KEY_ID="AKIDBENCH",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_EC2_METADATA_DISABLED="true",
    )
    os.environ.pop("AWS_BEARER_TOKEN_BEDROCK", None)
    table = Table(
        f"Cloud platform adapters vs the Anthropic adapter ({deltas} text deltas, {requests} requests each)",
        ["adapter", "events", "TTFC p50 ms", "added ms", "CPU µs/event", "vs anthropic", "≤25 µs"],
    )
    base_ttfc = base_cpu = 0.0
    for kind in ("anthropic", "bedrock", "vertex", "gemini"):
        events, ttfc, cpu = await bench(kind, deltas, requests)
        if kind == "anthropic":
            base_ttfc, base_cpu = ttfc, cpu
        table.add(
            kind,
            str(events),
            f"{ttfc * 1000:.2f}",
            f"{(ttfc - base_ttfc) * 1000:+.2f}",
            f"{cpu * 1e6:.1f}",
            f"{cpu / base_cpu:.2f}",
            verdict(cpu * 1e6 <= CPU_TARGET_US),
        )
    table.notes = [
        "TTFC: provider.stream() called → first chunk, p50; added: over the Anthropic adapter.",
        "CPU: this process only (the replay server runs in its own process), per event, whole request "
        "included (request building, signing, HTTP, parsing), median over requests.",
        "bedrock signs each request with SigV4 (botocore, in a worker thread, as the SDK does).",
    ]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deltas", type=int, default=500, help="text deltas per answer")
    parser.add_argument("--requests", type=int, default=30, help="requests per adapter")
    parser.add_argument("--json", type=Path, metavar="PATH", help="write the table as JSON here instead")
    args = parser.parse_args()
    table = asyncio.run(run(args.deltas, args.requests))
    if args.json:
        write_tables_json(args.json, [table])
    else:
        print_tables([table])


if __name__ == "__main__":
    main()
