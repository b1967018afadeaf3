"""Server memory per stream for clients that stop reading or read slowly (issue 8's benchmark).

Workload: the scripted provider streams a reply of about 512 KiB in one-word
deltas (about 75,000 TextDelta events, no delay). Turnwire runs in its own
process (``python -m turnwire_server serve --config ...``, SQLite in a temp dir)
with ``limits.stream_buffer_events: 1024`` (the default) and
``limits.slow_reader_timeout_seconds: 2`` (default 30; short so a run is
short). Before issue 8's fix the server buffered the whole reply for a reader
that stopped: +63 MB per stuck stream for this reply.

Each row runs on a fresh server process, after a few warm-up turns:

* **stuck**: N concurrent Chat calls (default 10 and 20; ``--quick``: 5), each
  reading TurnStart and then nothing. Server RSS before, at its peak while the
  readers are stuck (sampled every 0.1 s), and once every turn has been stopped
  and the server is idle, the readers still stuck (what it still holds for them);
  KB per stuck stream = (RSS held - RSS before) / N. Each turn must be stopped
  by the server (its stop logged; ``SLOW_CONSUMER``) within the timeout once its
  buffer is full: the check is that every turn was stopped, none sooner than the
  timeout after its reader stopped, and all of them no later than the timeout
  after the server went idle (every stream's buffers full) plus a 1 s margin.
  Three readers then read on: each gets the events the server and gRPC held for
  it and a TurnEnd (ABORTED, reason SLOW_CONSUMER); the other calls are
  cancelled. gRPC itself holds most of a stuck stream's backlog (about 56,000 of
  these events per stream, far more than the 1,024 of the server's buffer), so
  filling takes over a second of server time per stuck stream: 100 stuck
  readers would take minutes and gigabytes, hence 10 and 20.
* **slow** (cheap; default 4 readers, ``--quick``: 2): readers that read the
  whole reply in bursts, pausing for half the timeout every 20,000 events, so
  the server's buffer fills and the turn waits, but never for the timeout: every
  turn must end COMPLETED. Peak RSS while they read.

Prints the table; ``bench/run.py`` runs it with ``--quick`` or not, and
``--json PATH`` (the table as JSON, not printed), and puts the table in
``bench/results.md``.

    .venv/bin/python bench/slow_readers.py [--quick] [--stuck 10,20] [--slow 4] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.rpc import error_details_pb2

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    CHAT_METHOD,
    CLIENT_OPTIONS,
    PYTHON,
    ServerProcess,
    Table,
    chat_request,
    free_port,
    print_tables,
    verdict,
    write_tables_json,
    yaml_quote,
)

from turnwire_client.v1 import chat_service_pb2, event_pb2

REPLY_BYTES = 512 * 1024
LONG_TEXT = " ".join(f"w{i:05d}" for i in range(REPLY_BYTES // 7))  # one delta per word
LONG_MODEL = "scripted:long"
SHORT_MODEL = "scripted:short"
BUFFER_EVENTS = 1024  # limits.stream_buffer_events (the default)
STOP_MARGIN = 1.0  # seconds allowed past the timeout after the server went idle
READ_ON = 3  # stuck readers that read on after the measurement (the others are cancelled)
PAUSE_EVERY = 20_000  # events a slow reader reads between pauses
BEFORE_FIX_MB = 63  # per stuck stream for this reply, before issue 8's fix
_STOP_LINE = re.compile(r"turn (\S+) stopped: the client read no event")


def config(workdir: Path, port: int, timeout: float) -> Path:
    """A Turnwire config with the long script and the backpressure limits."""
    text = f"""\
listen: 127.0.0.1:{port}
default_model: {SHORT_MODEL}
logging: {{level: warning}}
store:
  url: sqlite:///{workdir / "turnwire.db"}
providers:
  scripted:
    scripts:
      long:
        - text: {yaml_quote(LONG_TEXT)}
      short:
        - text: "a short warm-up reply"
tools:
  demo: false
limits:
  stream_buffer_events: {BUFFER_EVENTS}
  slow_reader_timeout_seconds: {timeout:g}
  shutdown_grace_seconds: 1
"""
    path = workdir / f"turnwire-{port}.yaml"
    path.write_text(text)
    return path


def server(workdir: Path, timeout: float) -> ServerProcess:
    port = free_port()
    argv = [PYTHON, "-m", "turnwire_server", "serve", "--config", str(config(workdir, port, timeout))]
    return ServerProcess(argv, port, workdir, "turnwire")


@dataclass
class Row:
    """One row of the table: N readers of one behaviour on a fresh server."""

    behaviour: str
    readers: int
    rss_before: int = 0
    rss_peak: int = 0
    rss_held: int = 0  # stuck: all turns stopped, readers still stuck; slow: = peak
    rss_after: int = 0  # every call ended
    ended: dict[str, int] = field(default_factory=dict)  # "ABORTED SLOW_CONSUMER" -> count
    stop_after: list[float] = field(default_factory=list)  # stuck: reader stopped -> turn stopped, s
    idle_after: float = 0.0  # stuck: reader stopped -> server idle (all buffers full), s
    held_events: list[int] = field(default_factory=list)  # stuck: events read after resuming
    turn_seconds: list[float] = field(default_factory=list)  # slow: per turn

    def kb_per_stream(self, rss: int) -> float:
        return (rss - self.rss_before) / self.readers / 1024


@contextlib.asynccontextmanager
async def peak_rss(srv: ServerProcess, row: Row) -> AsyncIterator[None]:
    """Sample the server's RSS every 0.1 s while the block runs; keep the peak in ``row``."""

    async def sample() -> None:
        while True:
            row.rss_peak = max(row.rss_peak, srv.rss())
            await asyncio.sleep(0.1)

    task = asyncio.create_task(sample())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        row.rss_peak = max(row.rss_peak, srv.rss())


def _ending(raw: bytes) -> str:
    """'STATUS REASON' of a TurnEnd, from the raw last response of a call."""
    event = chat_service_pb2.ChatResponse.FromString(raw).event
    if event.WhichOneof("event") != "turn_end":
        return f"no TurnEnd ({event.WhichOneof('event')})"
    end = event.turn_end
    status = event_pb2.TurnStatus.Name(end.status).removeprefix("TURN_STATUS_")
    info = error_details_pb2.ErrorInfo()
    if end.error.details and end.error.details[0].Unpack(info):
        return f"{status} {info.reason}"
    return status


def _chat(channel: grpc.aio.Channel) -> Any:
    """Chat with responses left as raw bytes."""
    return channel.unary_stream(
        CHAT_METHOD, request_serializer=chat_service_pb2.ChatRequest.SerializeToString
    )


async def warm_up(chat: Any, tag: str) -> None:
    for i in range(5):
        async for _ in chat(chat_request(f"{tag}-warm-{i}", SHORT_MODEL)):
            pass


async def server_idle(srv: ServerProcess, since: float, deadline: float) -> float:
    """Seconds from ``since`` until the server used < 5 % of a core over 0.1 s (or the deadline)."""
    while time.perf_counter() < deadline:
        before = srv.cpu_seconds()
        await asyncio.sleep(0.1)
        if srv.cpu_seconds() - before < 0.005:
            return time.perf_counter() - 0.1 - since
    return time.perf_counter() - since


async def stuck(srv: ServerProcess, n: int, reader_timeout: float) -> Row:
    """N readers that read TurnStart and then nothing; see the module docstring."""
    row = Row("stuck: reads TurnStart, then nothing", n)
    async with grpc.aio.insecure_channel(srv.target, options=CLIENT_OPTIONS) as channel:
        chat = _chat(channel)
        await warm_up(chat, "s")
        await srv.settle()
        row.rss_before = srv.rss()
        async with peak_rss(srv, row):
            calls = [chat(chat_request(f"stuck-{i}", LONG_MODEL)) for i in range(n)]
            firsts = await asyncio.gather(*(call.read() for call in calls))
            stuck_at = time.perf_counter()  # every reader has its TurnStart and reads no more
            ids = [chat_service_pb2.ChatResponse.FromString(raw).event.request_id for raw in firsts]
            deadline = stuck_at + reader_timeout + 60
            idle_task = asyncio.create_task(server_idle(srv, stuck_at, deadline))
            stopped: dict[str, float] = {}
            while len(stopped) < n and time.perf_counter() < deadline:
                now = time.perf_counter() - stuck_at
                for request_id in _STOP_LINE.findall(srv.log_path.read_text(errors="replace")):
                    stopped.setdefault(request_id, now)
                await asyncio.sleep(0.05)
            row.idle_after = await idle_task
            row.stop_after = [stopped[r] for r in ids if r in stopped]
            await srv.settle()
            row.rss_held = srv.rss()
        # READ_ON readers read on: what was held for them, then the TurnEnd saying why; the
        # others (their stop is in the log) are cancelled, which is cheaper.
        for call in calls[:READ_ON]:
            held, last = 0, b""
            while (raw := await call.read()) is not grpc.aio.EOF:
                held, last = held + 1, raw
            row.held_events.append(held)
            ending = _ending(last) if last else "nothing held"
            row.ended[ending] = row.ended.get(ending, 0) + 1
        for call in calls[READ_ON:]:
            call.cancel()
    await srv.settle()
    row.rss_after = srv.rss()
    return row


async def slow(srv: ServerProcess, n: int, reader_timeout: float) -> Row:
    """N readers that read everything, pausing for half the timeout every PAUSE_EVERY events."""
    pause = reader_timeout / 2
    row = Row(f"slow: pauses {pause:g} s every {PAUSE_EVERY:,} events", n)
    async with grpc.aio.insecure_channel(srv.target, options=CLIENT_OPTIONS) as channel:
        chat = _chat(channel)
        await warm_up(chat, "w")
        await srv.settle()
        row.rss_before = srv.rss()

        async def reader(i: int) -> None:
            start = time.perf_counter()
            count, last = 0, b""
            async for raw in chat(chat_request(f"slow-{i}", LONG_MODEL)):
                count, last = count + 1, raw
                if count % PAUSE_EVERY == 0:
                    await asyncio.sleep(pause)
            row.turn_seconds.append(time.perf_counter() - start)
            ending = _ending(last)
            row.ended[ending] = row.ended.get(ending, 0) + 1

        async with peak_rss(srv, row):
            await asyncio.gather(*(reader(i) for i in range(n)))
        row.rss_held = row.rss_peak
    await srv.settle()
    row.rss_after = srv.rss()
    return row


async def run(stuck_levels: list[int], slow_readers: int, reader_timeout: float) -> Table:
    rows: list[Row] = []
    plan = [(stuck, n) for n in stuck_levels] + ([(slow, slow_readers)] if slow_readers else [])
    with tempfile.TemporaryDirectory(prefix="turnwire-bench-slow-") as tmp:
        for index, (measure, n) in enumerate(plan):
            workdir = Path(tmp) / f"r{index}"
            workdir.mkdir()
            srv = server(workdir, reader_timeout)
            print(f"[slow_readers] {measure.__name__}: {n} readers", file=sys.stderr, flush=True)
            await srv.start()
            try:
                rows.append(await measure(srv, n, reader_timeout))
            finally:
                srv.stop()
    return table(rows, reader_timeout)


def table(rows: list[Row], timeout: float) -> Table:
    t = Table(
        "Slow readers: server memory per stream, and the stuck turns stopped",
        [
            "readers",
            "behaviour",
            "RSS before MB",
            "RSS peak MB",
            "RSS held MB",
            "KB/stream held",
            "KB/stream peak",
            "after all end MB",
            "events held/stream",
            "server idle after s",
            "stopped, after s (min..max)",
            "turns ended (read on)",
            "target",
            "verdict",
        ],
    )
    for row in rows:
        ended = ", ".join(f"{count} {how}" for how, count in sorted(row.ended.items()))
        if row.stop_after or row.held_events:
            stops = f"{len(row.stop_after)}/{row.readers}: " + (
                f"{min(row.stop_after):.2f}..{max(row.stop_after):.2f}" if row.stop_after else "none"
            )
            ok = (
                len(row.stop_after) == row.readers
                and row.ended == {"ABORTED SLOW_CONSUMER": min(READ_ON, row.readers)}
                and min(row.stop_after) >= timeout
                and max(row.stop_after) <= row.idle_after + timeout + STOP_MARGIN
            )
            held = f"{min(row.held_events):,}..{max(row.held_events):,}"
            target = f"all stopped, {timeout:g} s after their buffer filled"
            idle = f"{row.idle_after:.2f}"
        else:
            stops = f"(turn {min(row.turn_seconds):.1f}..{max(row.turn_seconds):.1f} s)"
            ok = row.ended == {"COMPLETED": row.readers}
            held, idle, target = "", "", "all COMPLETED"
        t.add(
            row.readers,
            row.behaviour,
            f"{row.rss_before / 2**20:.1f}",
            f"{row.rss_peak / 2**20:.1f}",
            f"{row.rss_held / 2**20:.1f}",
            f"{row.kb_per_stream(row.rss_held):,.0f}",
            f"{row.kb_per_stream(row.rss_peak):,.0f}",
            f"{row.rss_after / 2**20:.1f}",
            held,
            idle,
            stops,
            ended,
            target,
            verdict(ok),
        )
    t.notes = [
        f"Reply: {len(LONG_TEXT.split()):,} one-word text deltas ({len(LONG_TEXT) / 1024:.0f} KiB of text), "
        f"no provider delay; limits.stream_buffer_events {BUFFER_EVENTS}, "
        f"limits.slow_reader_timeout_seconds {timeout:g}. A fresh server process per row, RSS (psutil) "
        "after 5 warm-up turns. Before issue 8's fix a stuck reader of this reply cost the server "
        f"+{BEFORE_FIX_MB} MB.",
        "stuck: 'held' = every turn stopped and the server idle, the readers still reading nothing; "
        "'peak' = the highest RSS sampled (every 0.1 s) while they were stuck. 'events held/stream' = "
        f"events each of {READ_ON} readers got when it read on (the server's buffer, gRPC's and the "
        "TurnEnd); the other calls were cancelled. Times from the moment every reader had its "
        "TurnStart: 'server idle' = the server stopped working (every stream's buffers full); "
        "'stopped' = the turn's stop ('the client read no event', i.e. SLOW_CONSUMER) appeared in the "
        "server log (polled every 0.05 s). PASS: every turn stopped, the readers that read on got "
        "TurnEnd ABORTED SLOW_CONSUMER, none "
        f"sooner than {timeout:g} s, all by server idle + {timeout:g} s + {STOP_MARGIN:g} s.",
        f"slow: each reader reads the whole reply, pausing {timeout / 2:g} s (half the timeout) every "
        f"{PAUSE_EVERY:,} events, so the buffer fills and the turn waits but is never stopped; "
        "'held' = 'peak' = the highest RSS sampled while they read.",
    ]
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 5 stuck readers, 2 slow ones")
    parser.add_argument("--stuck", help="stuck readers per row, comma-separated (default 10,20; quick 5)")
    parser.add_argument("--slow", type=int, help="slow readers (default 4, quick 2; 0: no slow row)")
    parser.add_argument("--timeout", type=float, default=2.0, help="slow_reader_timeout_seconds (default 2)")
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="write the table as JSON to PATH (for bench/run.py), not print it",
    )
    args = parser.parse_args()
    levels = [int(x) for x in (args.stuck or ("5" if args.quick else "10,20")).split(",")]
    slow_readers = args.slow if args.slow is not None else (2 if args.quick else 4)
    result = asyncio.run(run(levels, slow_readers, args.timeout))
    if args.json is not None:
        write_tables_json(args.json, [result])
    else:
        print_tables([result])


if __name__ == "__main__":
    main()
