"""The middleware chain's added cost per chunk and per turn, with 0, 1, 5 and 20 middlewares.

Runs the real :class:`TurnEngine` in this process (SQLite in a temp dir, the
scripted provider with no delay, events consumed as a client would) and
measures three things, each as the difference to the same run with no
middleware:

  (a) per chunk, N middlewares implementing ``on_chunk`` as a no-op;
  (b) per chunk, N middlewares implementing every hook except ``on_chunk``
      (the engine must skip building ``ChunkContext`` when
      ``chain.observes_chunks`` is false, so this should be ~0);
  (c) per turn, N middlewares implementing every hook as a no-op, for a turn
      with one tool call (two steps).

Per chunk "in turn": the slope of turn time against chunk count (turns of
``--small`` and ``--large`` one-character text deltas), minus the slope with no
middleware: per-turn costs cancel out. Per chunk "isolated": the exact
statements the engine runs per chunk for the hook (``if hooks.observes_chunks:
await hooks.on_chunk(ChunkContext(...))``, ``hooks = chain.for_turn(timeline)``)
in a tight loop, minus an empty loop. Targets (issue 4): (a) <= 5 us with 5 middlewares, (b) <= 0.2 us
with 5, (c) <= 0.5 ms with 5; verdicts use the in-turn numbers.

Configurations are interleaved round by round and medians taken, so drift
(CPU frequency, SQLite file growth) hits every configuration alike. Prints an
aligned table and writes it as markdown to ``bench/middleware_chain.md``; with
``--json PATH`` it writes the table as JSON to PATH instead (how ``bench/run.py``
runs it, putting the table in ``bench/results.md``).

    python bench/middleware_chain.py [--rounds 15] [--small 200] [--large 4200] [--turns 40]
        [--isolated-chunks 200000] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BENCH_DIR, Table, print_tables, verdict, write_markdown, write_tables_json

from turnwire.hooks import (
    ChatErrorClassification,
    ChatErrorContext,
    ChatResponseContext,
    ChunkContext,
    Middleware,
    SessionContext,
    StepConfig,
    StepContext,
    StepFinishContext,
    ToolCallContext,
    ToolCallDecision,
    ToolCallResultContext,
    TurnConfig,
    TurnContext,
)
from turnwire.testing import ScriptedProvider, ScriptedToolCall, ScriptStep
from turnwire.tools import PythonTool, ToolExecution
from turnwire.types import FinishReason, TextDelta, Usage
from turnwire_client.v1 import chat_service_pb2, message_pb2
from turnwire_server.api.status import status_of
from turnwire_server.engine import EngineSettings, TurnEngine, TurnRequest
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.hooks.timeline import HookTimeline
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.sqlite import SqliteStore

COUNTS = (0, 1, 5, 20)
TARGET_CHUNK_US = 5.0  # (a) with 5 on_chunk middlewares
TARGET_SKIPPED_CHUNK_US = 0.2  # (b) with 5 middlewares without on_chunk
TARGET_TURN_MS = 0.5  # (c) whole chain of 5
ISOLATED_CHUNKS = 200_000  # default of --isolated-chunks


# ----------------------------------------------------------------------------- middlewares


class ChunkNoop(Middleware):
    """Implements only ``on_chunk``, as a no-op."""

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """No-op."""
        return None


class AllButChunk(Middleware):
    """Implements every hook except ``on_chunk``, each a no-op."""

    async def configure_session(self, ctx: SessionContext) -> None:
        """No-op."""
        return None

    async def before_turn(self, ctx: TurnContext) -> TurnConfig | None:
        """No-op."""
        return None

    async def before_step(self, ctx: StepContext) -> StepConfig | None:
        """No-op."""
        return None

    async def before_tool_call(self, ctx: ToolCallContext) -> ToolCallDecision | None:
        """No-op."""
        return None

    async def after_tool_call(self, ctx: ToolCallResultContext) -> None:
        """No-op."""
        return None

    async def on_step_finish(self, ctx: StepFinishContext) -> None:
        """No-op."""
        return None

    async def on_chat_response(self, result: ChatResponseContext) -> None:
        """No-op."""
        return None

    async def on_chat_error(self, ctx: ChatErrorContext) -> BaseException | str:
        """No-op."""
        return ctx.error

    async def classify_chat_error(self, ctx: ChatErrorContext) -> ChatErrorClassification | None:
        """No-op."""
        return None


class EveryHook(AllButChunk):
    """Implements every hook, each a no-op."""

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """No-op."""
        return None


def chain_of(kind: type[Middleware], count: int) -> MiddlewareChain:
    """``count`` instances of ``kind``, named apart (the timeline keys on_chunk by name)."""
    middlewares = []
    for index in range(count):
        middleware = kind()
        middleware.name = f"{kind.__name__}{index}"
        middlewares.append(middleware)
    return MiddlewareChain(middlewares)


# ----------------------------------------------------------------------------- engine runs


async def _echo(input: dict[str, Any], execution: ToolExecution) -> dict[str, Any]:
    return {"echo": input}


def scripts(small: int, large: int) -> dict[str, list[ScriptStep]]:
    """``small``/``large``: one text block of that many 1-character deltas; ``tool``: a tool call turn."""
    return {
        "small": [ScriptStep(text="x" * small, chunk_size=1)],
        "large": [ScriptStep(text="x" * large, chunk_size=1)],
        "tool": [
            ScriptStep(text="Let me check.", tool_calls=[ScriptedToolCall(name="echo", input={"q": "a"})]),
            ScriptStep(text="The answer is a."),
        ],
    }


@dataclass
class Config:
    """One engine under test: a label, its chain and its engine."""

    label: str
    chain: MiddlewareChain
    engine: TurnEngine


class Runner:
    """Engines sharing one store and one provider; runs timed turns on new conversations."""

    def __init__(self, store: SqliteStore, provider: ScriptedProvider) -> None:
        """One store and one provider for every engine (the echo tool included)."""
        self.store = store
        self.providers = ProviderRegistry({"scripted": provider})
        self.tools = {"echo": PythonTool("echo", "echo the input", _echo, input_schema={"type": "object"})}
        self.turns = 0

    def engine(self, chain: MiddlewareChain) -> TurnEngine:
        """A new engine on the shared store and provider, running ``chain``."""
        return TurnEngine(
            store=self.store,
            providers=self.providers,
            tools=self.tools,
            chain=chain,
            settings=EngineSettings(default_model="scripted:small"),
            error_status=status_of,
        )

    async def turn(self, engine: TurnEngine, model: str) -> float:
        """Wall time in seconds of one Chat turn on a new conversation, events consumed."""
        self.turns += 1
        message = message_pb2.Message(id=f"u{self.turns}", role=message_pb2.ROLE_USER)
        message.parts.add().text.text = "go"
        request = TurnRequest(
            conversation_id=f"bench-{self.turns}",
            request_id=f"r{self.turns}",
            messages=[message],
            body={},
            model=model,
            continuation=False,
            response_type=chat_service_pb2.ChatResponse,
        )
        started = time.perf_counter()
        handle = await engine.start(request)
        async for _ in handle:
            pass
        await handle.task
        return time.perf_counter() - started


async def interleaved(
    runner: Runner, configs: Sequence[Config], model: str, rounds: int, per_round: int
) -> dict[str, list[float]]:
    """Per config label, the median turn time (seconds) of each of ``rounds`` rounds of
    ``per_round`` turns; within a round every config runs, one after the other."""
    samples: dict[str, list[float]] = {c.label: [] for c in configs}
    for config in configs:  # warm-up
        for _ in range(3):
            await runner.turn(config.engine, model)
    for _ in range(rounds):
        gc.collect()
        gc.disable()
        try:
            for config in configs:
                times = [await runner.turn(config.engine, model) for _ in range(per_round)]
                samples[config.label].append(statistics.median(times))
        finally:
            gc.enable()
    return samples


def added(per_round: dict[str, list[float]], label: str) -> float:
    """Median over rounds of ``label``'s time minus the baseline's (``"0"``) in the same round."""
    return statistics.median(x - base for x, base in zip(per_round[label], per_round["0"], strict=True))


# ----------------------------------------------------------------------------- isolated chunk path


async def isolated_per_chunk(chain: MiddlewareChain, count: int = ISOLATED_CHUNKS) -> float:
    """Microseconds per chunk of the engine's per-chunk hook statements, minus an empty loop."""
    chunks = [TextDelta("t", "x")] * count
    hooks = chain.for_turn(HookTimeline() if chain.middlewares else None)
    best = float("inf")
    for _ in range(5):
        gc.collect()
        started = time.perf_counter()
        for _chunk in chunks:
            pass
        empty = time.perf_counter() - started
        started = time.perf_counter()
        for chunk in chunks:
            if hooks.observes_chunks:
                await hooks.on_chunk(ChunkContext("conv", "req", 0, chunk))
        hooked = time.perf_counter() - started
        best = min(best, (hooked - empty) / count * 1e6)
    return max(best, 0.0)


class ChunkCounter(Middleware):
    """Counts on_chunk calls per step: the real chunk counts of the 1-tool turn."""

    def __init__(self) -> None:
        """Start with no counts."""
        super().__init__()
        self.per_step: dict[int, int] = {}

    async def on_chunk(self, ctx: ChunkContext) -> None:
        """Count one chunk for its step."""
        self.per_step[ctx.step_number] = self.per_step.get(ctx.step_number, 0) + 1


async def isolated_per_turn(
    chain: MiddlewareChain, chunks_per_step: Sequence[int], reps: int = 2000
) -> float:
    """Milliseconds per turn of the chain calls a 1-tool turn makes (the engine's sequence), no engine.

    before_turn, then per step: before_step, on_chunk x chunks, (step 0) before_tool_call and
    after_tool_call, on_step_finish; then on_chat_response; a new timeline per turn as the engine does.
    """
    message = message_pb2.Message(id="u", role=message_pb2.ROLE_USER)
    turn_ctx = TurnContext("conv", "req", "system", [message], {}, "scripted:tool", False, {})
    step_ctx = StepContext("conv", "req", 0, (), "scripted:tool", "system", [message])
    call_ctx = ToolCallContext("conv", "req", "call_0_0", "echo", {"q": "a"}, 0, [message])
    result_ctx = ToolCallResultContext("conv", "req", "call_0_0", "echo", {"q": "a"}, 0, 0.01, True, {"e": 1})
    step_result = StepFinishContext(0, "text", (), "", (), (), FinishReason.STOP, "stop", Usage())
    response = ChatResponseContext("conv", "req", message, False, "completed")
    chunk = TextDelta("t", "x")
    best = float("inf")
    for _ in range(5):
        gc.collect()
        started = time.perf_counter()
        for _ in range(reps):
            hooks = chain.for_turn(HookTimeline() if chain.middlewares else None)
            await hooks.before_turn(turn_ctx)
            for step, chunks in enumerate(chunks_per_step):
                await hooks.before_step(step_ctx)
                for _ in range(chunks):
                    if hooks.observes_chunks:
                        await hooks.on_chunk(ChunkContext("conv", "req", step, chunk))
                if step == 0:
                    await hooks.before_tool_call(call_ctx)
                    await hooks.after_tool_call(result_ctx)
                await hooks.on_step_finish(step_result)
            await hooks.on_chat_response(response)
        best = min(best, (time.perf_counter() - started) / reps * 1000.0)
    return best


# ----------------------------------------------------------------------------- main


def fmt(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` decimals."""
    return f"{value:.{digits}f}"


async def measure(args: argparse.Namespace) -> Table:
    """Run (a), (b) and (c) for 0, 1, 5 and 20 middlewares; the result table with verdicts."""
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-chain-") as tmp:
        store = SqliteStore(Path(tmp) / "bench.sqlite")
        await store.open()
        try:
            runner = Runner(store, ScriptedProvider(scripts(args.small, args.large)))
            # "again": a second empty chain, measured like the others: the noise floor.
            empty = [
                Config(label, MiddlewareChain(), runner.engine(MiddlewareChain())) for label in ("0", "again")
            ]
            chunk_configs = list(empty)
            for n in COUNTS[1:]:
                for label, kind in ((f"a{n}", ChunkNoop), (f"b{n}", AllButChunk)):
                    chain = chain_of(kind, n)
                    chunk_configs.append(Config(label, chain, runner.engine(chain)))
            turn_configs = list(empty)
            for n in COUNTS[1:]:
                chain = chain_of(EveryHook, n)
                turn_configs.append(Config(f"c{n}", chain, runner.engine(chain)))

            small = await interleaved(runner, chunk_configs, "scripted:small", args.rounds, 3)
            large = await interleaved(runner, chunk_configs, "scripted:large", args.rounds, 3)
            per_turn = await interleaved(runner, turn_configs, "scripted:tool", args.rounds, args.turns)
            isolated = {
                c.label: await isolated_per_chunk(c.chain, args.isolated_chunks) for c in chunk_configs
            }
            counter = ChunkCounter()
            await runner.turn(runner.engine(MiddlewareChain([counter])), "scripted:tool")
            chunks_per_step = [counter.per_step[step] for step in sorted(counter.per_step)]
            base_turn = await isolated_per_turn(MiddlewareChain(), chunks_per_step)
            isolated_turn = {
                c.label: await isolated_per_turn(c.chain, chunks_per_step) - base_turn
                for c in turn_configs[1:]
            }
        finally:
            await store.close()

    chunks_between = int(args.large) - int(args.small)

    def per_chunk_us(label: str) -> float:
        """Added microseconds per chunk of ``label``: its slope (long minus short turns, per chunk)
        minus the baseline's, per round, median over rounds."""
        return (added(large, label) - added(small, label)) / chunks_between * 1e6

    base_slope = statistics.median(
        (long - short) / chunks_between * 1e6 for long, short in zip(large["0"], small["0"], strict=True)
    )
    table = Table(
        "Middleware chain: added cost per chunk and per turn",
        [
            "middlewares",
            "(a) on_chunk no-ops: us/chunk in turn",
            "(a) isolated",
            "(b) without on_chunk: us/chunk in turn",
            "(b) isolated",
            "(c) every hook, 1-tool turn: ms/turn in turn",
            "(c) isolated",
        ],
    )
    results: dict[str, float] = {}
    table.add("0 (baseline)", "0", fmt(isolated["0"]), "0", fmt(isolated["0"]), "0", "0")
    table.add(
        "0 again (noise floor)",
        fmt(per_chunk_us("again")),
        fmt(isolated["again"]),
        fmt(per_chunk_us("again")),
        fmt(isolated["again"]),
        fmt(added(per_turn, "again") * 1000.0, 4),
        fmt(isolated_turn["again"], 4),
    )
    for n in COUNTS[1:]:
        a, b = per_chunk_us(f"a{n}"), per_chunk_us(f"b{n}")
        c = added(per_turn, f"c{n}") * 1000.0
        results.update({f"a{n}": a, f"b{n}": b, f"c{n}": c})
        table.add(
            str(n),
            fmt(a),
            fmt(isolated[f"a{n}"]),
            fmt(b),
            fmt(isolated[f"b{n}"]),
            fmt(c, 4),
            fmt(isolated_turn[f"c{n}"], 4),
        )
    table.add(
        "target (5 middlewares)",
        f"<= {TARGET_CHUNK_US:g}",
        "",
        f"<= {TARGET_SKIPPED_CHUNK_US:g}",
        "",
        f"<= {TARGET_TURN_MS:g}",
        "",
    )
    table.add(
        "verdict (5, in turn)",
        verdict(results["a5"] <= TARGET_CHUNK_US),
        "",
        verdict(results["b5"] <= TARGET_SKIPPED_CHUNK_US),
        "",
        verdict(results["c5"] <= TARGET_TURN_MS),
        "",
    )
    table.notes += [
        f"Baselines (no middleware): {base_slope:.2f} us per chunk in a turn; "
        f"{statistics.median(per_turn['0']) * 1000:.3f} ms per 1-tool turn (2 steps, SQLite, events "
        "consumed in-process).",
        f"Per chunk in turn: slope between turns of {args.small} and {args.large} one-character deltas "
        f"minus the baseline's slope in the same round; median over {args.rounds} rounds of 3 turns per "
        "size and configuration. The '0 again' row is a second empty chain measured the same way: "
        "its values are the run's noise (machine load), and negative values are noise.",
        f"Isolated: `if hooks.observes_chunks: await hooks.on_chunk(ChunkContext(...))` "
        f"over {args.isolated_chunks:,} chunks minus an empty loop, best of 5; includes the hook timeline "
        "(hooks = chain.for_turn(HookTimeline())), which the engine records only with "
        "events.hook_timeline on (off by default, so not in the in-turn numbers).",
        f"Per turn: the configuration's median minus the baseline's in the same round, median over "
        f"{args.rounds} rounds of {args.turns} turns; each turn on a new conversation.",
        f"Per turn isolated: the chain calls of that turn ({' + '.join(map(str, chunks_per_step))} on_chunk "
        "calls, 8 other hooks, a new timeline) in a loop without the engine, minus the empty chain; "
        "best of 5.",
    ]
    return table


def main() -> None:
    """Parse the options, measure, print the table and write ``bench/middleware_chain.md``
    (or, with ``--json``, only write the table as JSON)."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    parser.add_argument("--small", type=int, default=200, help="deltas in the short turn (default 200)")
    parser.add_argument("--large", type=int, default=4200, help="deltas in the long turn (default 4200)")
    parser.add_argument(
        "--turns", type=int, default=40, help="1-tool turns per round and config (default 40)"
    )
    parser.add_argument(
        "--isolated-chunks",
        type=int,
        default=ISOLATED_CHUNKS,
        help=f"chunks per isolated per-chunk loop (default {ISOLATED_CHUNKS})",
    )
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="write the table as JSON to PATH (for bench/run.py) instead of printing it and "
        "writing bench/middleware_chain.md",
    )
    args = parser.parse_args()
    table = asyncio.run(measure(args))
    if args.json is not None:
        write_tables_json(args.json, [table])
        return
    print_tables([table])
    header = (
        "# middleware_chain results\n\n"
        f"`python bench/middleware_chain.py --rounds {args.rounds} --small {args.small} "
        f"--large {args.large} --turns {args.turns} --isolated-chunks {args.isolated_chunks}` "
        f"on {time.strftime('%Y-%m-%d')}, "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}.\n"
    )
    write_markdown(BENCH_DIR / "middleware_chain.md", header, [table])
    print(f"written to {BENCH_DIR / 'middleware_chain.md'}")


if __name__ == "__main__":
    main()
