"""Provider adapters vs the bare SDK on the same replayed stream (issue 3's benchmark).

For each API (Anthropic Messages, OpenAI Chat Completions, OpenAI Responses) a
replay server (``tests/providers/replay.py``, its own process, so its CPU is
not counted) serves the same recorded-format stream of N text deltas (default
500) for every request, one HTTP chunk per SSE event. This process then runs,
interleaved, R requests each way:

- **bare SDK**: ``client.<api>.create(stream=True)`` iterated to the end (the
  SDK's typed events, what an application gets from the SDK alone);
- **adapter**: ``provider.stream(request)`` iterated to the end (request built
  from a one-message transcript, SSE parsed with orjson into Turnwire chunks).

Measured, client side: time to first event (call → first typed event for the
SDK, first chunk for the adapter; p50 over R), and CPU per SSE event (process
CPU of the whole request / events, median over R). Targets (issue 3): adapter
CPU ≤ 25 µs per event on this lean path; added time to first event over the
bare SDK ≤ 0.5 ms p50.

Prints the table; ``bench/run.py`` runs it with ``--json PATH`` (the table as
JSON, not printed) and puts the table in ``bench/results.md``.

    .venv/bin/python bench/provider_adapters.py [--deltas 500] [--requests 30] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import orjson

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(BENCH))
sys.path.insert(0, str(REPO))

from _common import Table, percentile, print_tables, verdict, write_tables_json  # noqa: E402

from turnwire.providers import ModelRequest  # noqa: E402
from turnwire_client.v1 import message_pb2  # noqa: E402
from turnwire_server.providers.anthropic_messages import AnthropicMessagesProvider  # noqa: E402
from turnwire_server.providers.openai_chat import OpenAIChatProvider  # noqa: E402
from turnwire_server.providers.openai_responses import OpenAIResponsesProvider  # noqa: E402

CPU_TARGET_US = 25.0
TTFE_TARGET_MS = 0.5
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"]


def _pieces(deltas: int) -> list[str]:
    return [WORDS[i % len(WORDS)] + " " for i in range(deltas)]


def anthropic_body(deltas: int) -> bytes:
    def event(obj: dict[str, Any]) -> bytes:
        return b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), orjson.dumps(obj))

    usage = {
        "input_tokens": 12,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    parts = [
        event(
            {
                "type": "message_start",
                "message": {
                    "id": "msg_bench",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-bench",
                    "content": [],
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": usage,
                },
            }
        ),
        event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        event({"type": "ping"}),
    ]
    parts += [
        event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}})
        for p in _pieces(deltas)
    ]
    parts += [
        event({"type": "content_block_stop", "index": 0}),
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": deltas},
            }
        ),
        event({"type": "message_stop"}),
    ]
    return b"".join(parts)


def chat_body(deltas: int) -> bytes:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        obj = {
            "id": "chatcmpl-bench",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-bench",
            "system_fingerprint": "fp_bench",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
        }
        return b"data: %s\n\n" % orjson.dumps(obj)

    parts = [chunk({"role": "assistant", "content": ""})]
    parts += [chunk({"content": p}) for p in _pieces(deltas)]
    parts.append(chunk({}, "stop"))
    usage = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-bench",
        "choices": [],
        "usage": {"prompt_tokens": 12, "completion_tokens": deltas, "total_tokens": 12 + deltas},
    }
    parts.append(b"data: %s\n\n" % orjson.dumps(usage))
    return b"".join(parts) + b"data: [DONE]\n\n"


def responses_body(deltas: int) -> bytes:
    number = 0

    def event(obj: dict[str, Any]) -> bytes:
        nonlocal number
        obj = {**obj, "sequence_number": number}
        number += 1
        return b"event: %s\ndata: %s\n\n" % (obj["type"].encode(), orjson.dumps(obj))

    response = {
        "id": "resp_bench",
        "object": "response",
        "created_at": 1,
        "model": "gpt-bench",
        "output": [],
        "status": "in_progress",
        "tools": [],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
    }
    message = {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    where = {"item_id": "msg_bench", "output_index": 0, "content_index": 0}
    parts = [
        event({"type": "response.created", "response": response}),
        event({"type": "response.in_progress", "response": response}),
        event({"type": "response.output_item.added", "output_index": 0, "item": message}),
        event(
            {
                "type": "response.content_part.added",
                **where,
                "part": {"type": "output_text", "text": "", "annotations": []},
            }
        ),
    ]
    text = _pieces(deltas)
    parts += [
        event({"type": "response.output_text.delta", **where, "delta": p, "logprobs": []}) for p in text
    ]
    full = "".join(text)
    done_message = {
        **message,
        "status": "completed",
        "content": [{"type": "output_text", "text": full, "annotations": []}],
    }
    usage = {
        "input_tokens": 12,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": deltas,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 12 + deltas,
    }
    parts += [
        event({"type": "response.output_text.done", **where, "text": full, "logprobs": []}),
        event(
            {
                "type": "response.content_part.done",
                **where,
                "part": {"type": "output_text", "text": full, "annotations": []},
            }
        ),
        event({"type": "response.output_item.done", "output_index": 0, "item": done_message}),
        event(
            {
                "type": "response.completed",
                "response": {**response, "status": "completed", "output": [done_message], "usage": usage},
            }
        ),
    ]
    return b"".join(parts)


@dataclass
class Sample:
    ttfe: float  # seconds
    cpu: float  # seconds of this process's CPU for the whole request
    events: int


async def _measure(run: Callable[[Callable[[], None]], Awaitable[int]]) -> Sample:
    first: list[float] = []
    cpu0 = time.process_time()
    start = time.perf_counter()

    def mark() -> None:
        if not first:
            first.append(time.perf_counter() - start)

    events = await run(mark)
    return Sample(first[0], time.process_time() - cpu0, events)


class Server:
    """The replay server in its own process, serving ``body`` for every request."""

    def __init__(self, body: bytes) -> None:
        self._file = tempfile.NamedTemporaryFile(suffix=".sse")  # noqa: SIM115 - lives as long as the server
        self._file.write(body)
        self._file.flush()
        script = REPO / "tests" / "providers" / "replay.py"
        self.process = subprocess.Popen(
            [sys.executable, str(script), self._file.name],
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


def _request() -> ModelRequest:
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    message.parts.add().text.text = "Tell me a story."
    return ModelRequest(model="bench-model", system="You are terse.", messages=[message])


async def bench_api(name: str, deltas: int, requests: int) -> list[str]:
    """One table row for API ``name`` (see the table's columns in :func:`run`)."""
    body = {"anthropic": anthropic_body, "chat": chat_body, "responses": responses_body}[name](deltas)
    events = body.count(b"\n\n")
    server = Server(body)
    try:
        if name == "anthropic":
            client: Any = anthropic.AsyncAnthropic(api_key="k", base_url=server.url, max_retries=0)
            provider: Any = AnthropicMessagesProvider("anthropic", client)

            async def bare(mark: Callable[[], None]) -> int:
                stream = await client.messages.create(
                    model="bench-model",
                    max_tokens=1024,
                    system="You are terse.",
                    stream=True,
                    messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me a story."}]}],
                )
                count = 0
                async for _ in stream:
                    mark()
                    count += 1
                return count
        else:
            client = openai.AsyncOpenAI(api_key="k", base_url=f"{server.url}/v1", max_retries=0)
            if name == "chat":
                provider = OpenAIChatProvider("openai", client)

                async def bare(mark: Callable[[], None]) -> int:
                    stream = await client.chat.completions.create(
                        model="bench-model",
                        stream=True,
                        stream_options={"include_usage": True},
                        messages=[
                            {"role": "system", "content": "You are terse."},
                            {"role": "user", "content": "Tell me a story."},
                        ],
                    )
                    count = 0
                    async for _ in stream:
                        mark()
                        count += 1
                    return count
            else:
                provider = OpenAIResponsesProvider("openai-responses", client)

                async def bare(mark: Callable[[], None]) -> int:
                    stream = await client.responses.create(
                        model="bench-model",
                        stream=True,
                        store=False,
                        instructions="You are terse.",
                        input=[
                            {"role": "user", "content": [{"type": "input_text", "text": "Tell me a story."}]}
                        ],
                    )
                    count = 0
                    async for _ in stream:
                        mark()
                        count += 1
                    return count

        async def adapter(mark: Callable[[], None]) -> int:
            count = 0
            async for _ in provider.stream(_request()):
                mark()
                count += 1
            return count

        for _ in range(3):  # warm up: connections, imports, caches
            await _measure(bare)
            await _measure(adapter)
        bare_samples: list[Sample] = []
        adapter_samples: list[Sample] = []
        for _ in range(requests):
            bare_samples.append(await _measure(bare))
            adapter_samples.append(await _measure(adapter))
        await provider.aclose()
    finally:
        server.close()
    bare_ttfe = percentile([s.ttfe for s in bare_samples], 50)
    adapter_ttfe = percentile([s.ttfe for s in adapter_samples], 50)
    bare_cpu = statistics.median(s.cpu for s in bare_samples) / events * 1e6
    adapter_cpu = statistics.median(s.cpu for s in adapter_samples) / events * 1e6
    added = (adapter_ttfe - bare_ttfe) * 1000
    return [
        name,
        str(events),
        f"{bare_ttfe * 1000:.2f}",
        f"{adapter_ttfe * 1000:.2f}",
        f"{added:+.2f}",
        verdict(added <= TTFE_TARGET_MS),
        f"{bare_cpu:.1f}",
        f"{adapter_cpu:.1f}",
        f"{adapter_cpu / bare_cpu:.2f}",
        verdict(adapter_cpu <= CPU_TARGET_US),
    ]


async def run(deltas: int, requests: int) -> Table:
    table = Table(
        f"Provider adapters vs bare SDK ({deltas} text deltas per stream, {requests} requests each)",
        [
            "api",
            "SSE events",
            "bare TTFE p50 ms",
            "adapter TTFE p50 ms",
            "added ms",
            "≤0.5 ms",
            "bare CPU µs/event",
            "adapter CPU µs/event",
            "adapter/bare",
            "≤25 µs",
        ],
    )
    for name in ("anthropic", "chat", "responses"):
        table.add(*await bench_api(name, deltas, requests))
    table.notes = [
        "bare = the SDK's typed stream (create(stream=True)); adapter = provider.stream() → Turnwire chunks.",
        "CPU: this process only (the replay server runs in its own process); per SSE event, whole request "
        "included (request building, HTTP, parsing), median over requests.",
        "TTFE: call start → first typed event (bare) / first chunk (adapter), p50.",
    ]
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deltas", type=int, default=500, help="text deltas per stream")
    parser.add_argument("--requests", type=int, default=30, help="requests per variant per API")
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="write the table as JSON to PATH (for bench/run.py), not print it",
    )
    args = parser.parse_args()
    table = asyncio.run(run(args.deltas, args.requests))
    if args.json is not None:
        write_tables_json(args.json, [table])
    else:
        print_tables([table])


if __name__ == "__main__":
    main()
