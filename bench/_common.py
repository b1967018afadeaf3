"""Shared pieces of the benchmarks: the workload, server processes, clients, stats, tables.

Nothing here imports the server package: the servers under test run in their
own processes (``python -m turnwire_server serve`` for Turnwire, ``bench/floor_server.py``
for the floor) and the code here only talks gRPC to them and reads their
CPU time and RSS with psutil.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psutil

from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
PYTHON = sys.executable

CHAT_METHOD = "/turnwire.v1.ChatService/Chat"
STREAM_MODEL = "scripted:bench"  # streams the N-delta text with no delay
PACED_MODEL = "scripted:paced"  # the same text with PACED_DELAY_MS before each delta
HOLD_MODEL = "scripted:hold"  # sleeps before its text: keeps the stream open
HOLD_DELAY_MS = 3_600_000.0
PACED_DELAY_MS = 0.5

# Client channel: one HTTP/2 connection, no client-side limits that would cap the test.
CLIENT_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.enable_retries", 0),
]

# ----------------------------------------------------------------------------- workload

_WORDS = (
    "the quick brown fox jumps over the lazy dog while a model streams its answer "
    "token by token to a client that renders every delta as soon as it arrives "
)


def stream_text(deltas: int, chunk_size: int) -> str:
    """Deterministic text that the scripted provider splits into exactly ``deltas`` chunks."""
    length = deltas * chunk_size
    return (_WORDS * (length // len(_WORDS) + 1))[:length]


def events_per_turn(deltas: int) -> int:
    """TurnStart, StepStart, TextStart, N deltas, TextEnd, StepFinish, TurnEnd."""
    return deltas + 6


def chat_request(conversation_id: str, model: str = STREAM_MODEL) -> chat_service_pb2.ChatRequest:
    """A Chat request with a short user message."""
    return chat_service_pb2.ChatRequest(
        conversation_id=conversation_id,
        message=message_pb2.Message(
            role=message_pb2.ROLE_USER,
            parts=[message_pb2.Part(text=message_pb2.TextPart(text="Tell me a story."))],
        ),
        model=model,
    )


def floor_responses(deltas: int, chunk_size: int) -> list[chat_service_pb2.ChatResponse]:
    """The floor's pre-built stream: the same events, in the same shapes, as a Turnwire turn."""
    text = stream_text(deltas, chunk_size)
    conversation_id = "bench-c-000000-00000"
    request_id = "req_" + "0" * 32
    out: list[chat_service_pb2.ChatResponse] = []

    def new() -> event_pb2.TurnEvent:
        response = chat_service_pb2.ChatResponse()
        event = response.event
        event.conversation_id = conversation_id
        event.request_id = request_id
        event.sequence_number = len(out) + 1
        out.append(response)
        return event

    start = new().turn_start
    start.message_id = "msg_" + request_id
    start.model = STREAM_MODEL
    new().step_start.step_number = 0
    new().text_start.id = "s0-t"
    for i in range(0, len(text), chunk_size):
        delta = new().text_delta
        delta.id = "s0-t"
        delta.delta = text[i : i + chunk_size]
    new().text_end.id = "s0-t"
    finish = new().step_finish
    finish.finish_reason = event_pb2.FINISH_REASON_STOP
    finish.raw_finish_reason = "stop"
    finish.usage.input_tokens = 12
    finish.usage.output_tokens = 120
    finish.usage.total_tokens = 132
    finish.response_id = "scripted-0"
    finish.response_model = STREAM_MODEL
    end = new().turn_end
    end.status = event_pb2.TURN_STATUS_COMPLETED
    message = end.message
    message.id = "msg_" + request_id
    message.role = message_pb2.ROLE_ASSISTANT
    message.create_time.GetCurrentTime()
    message.parts.add().step_start.SetInParent()
    message.parts.add().text.text = text
    end.usage.CopyFrom(finish.usage)
    end.step_count = 1
    return out


# ----------------------------------------------------------------------------- processes


def checkout_pythonpath(tree: Path) -> str:
    """A ``PYTHONPATH`` that runs another checkout's code (``tree``: its ``server``,
    ``middleware`` and ``clients/python/src``), for a bench's "old" arm."""
    return os.pathsep.join(str(tree / part) for part in ("server", "middleware", "clients/python/src"))


def free_port() -> int:
    """A TCP port free right now on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def yaml_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def turnwire_config(
    workdir: Path, port: int, *, deltas: int, chunk_size: int, coalesce_ms: float = 0.0
) -> Path:
    """Write a Turnwire YAML config (SQLite in ``workdir``) and return its path."""
    text = stream_text(deltas, chunk_size)
    config = f"""\
listen: 127.0.0.1:{port}
default_model: {STREAM_MODEL}
logging: {{level: warning}}
store:
  url: sqlite:///{workdir / "turnwire.db"}
providers:
  scripted:
    scripts:
      bench:
        - text: {yaml_quote(text)}
          chunk_size: {chunk_size}
          delay_ms: 0
      paced:
        - text: {yaml_quote(text)}
          chunk_size: {chunk_size}
          delay_ms: {PACED_DELAY_MS}
      hold:
        - text: "held"
          delay_ms: {HOLD_DELAY_MS}
tools:
  demo: false
events:
  text_coalesce_ms: {coalesce_ms}
limits:
  shutdown_grace_seconds: 1
"""
    path = workdir / f"turnwire-{port}.yaml"
    path.write_text(config)
    return path


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Time on a CPU (ns) of each live thread of process ``pid`` (thread id → ns), from
    ``/proc/<pid>/task/<tid>/schedstat``: ``/proc/<pid>/stat``'s user and system times count whole
    10 ms ticks, too coarse for the differences the benches measure (a few hundred µs over a
    block). Only live threads count: a thread that ends between two reads takes the time it had at
    the first out of their difference (``/proc/<pid>/stat`` would keep it), so a bench that uses
    this measures processes whose threads live as long as they do (a server's pools, its event
    loop); a process that is gone reads as none."""
    found: dict[int, int] = {}
    with contextlib.suppress(FileNotFoundError, ProcessLookupError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError, IndexError):
                found[int(task.name)] = int((task / "schedstat").read_text().split()[0])
    return found


def cpu_seconds_of(pid: int) -> float:
    """CPU seconds of every live thread of process ``pid`` (:func:`thread_cpu_ns`, summed)."""
    return sum(thread_cpu_ns(pid).values()) / 1e9


class ServerProcess:
    """A server under test in its own process; ``stop()`` sends SIGTERM (then SIGKILL)."""

    def __init__(self, argv: Sequence[str], port: int, workdir: Path, name: str) -> None:
        self.argv = list(argv)
        self.port = port
        self.target = f"127.0.0.1:{port}"
        self.workdir = workdir
        self.name = name
        self.log_path = workdir / f"{name}-{port}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        self.ps: psutil.Process | None = None

    @classmethod
    def turnwire(
        cls, workdir: Path, *, deltas: int, chunk_size: int, coalesce_ms: float = 0.0
    ) -> ServerProcess:
        port = free_port()
        config = turnwire_config(workdir, port, deltas=deltas, chunk_size=chunk_size, coalesce_ms=coalesce_ms)
        name = "turnwire" if not coalesce_ms else f"turnwire-coalesce{coalesce_ms:g}"
        return cls([PYTHON, "-m", "turnwire_server", "serve", "--config", str(config)], port, workdir, name)

    @classmethod
    def floor(cls, workdir: Path, *, deltas: int, chunk_size: int) -> ServerProcess:
        port = free_port()
        argv = [
            PYTHON,
            str(BENCH_DIR / "floor_server.py"),
            "--port",
            str(port),
            "--deltas",
            str(deltas),
            "--chunk-size",
            str(chunk_size),
        ]
        return cls(argv, port, workdir, "floor")

    def spawn(self) -> None:
        """Start the process (without waiting for it to serve)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TURNWIRE_")}
        env["TURNWIRE_LIMITS__DRAIN_SECONDS"] = "0"  # no load balancer to drain from: stop at once
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                self.argv, cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT, env=env
            )
        self.ps = psutil.Process(self.popen.pid)

    async def start(self, startup_seconds: float = 30.0) -> None:
        """Spawn the process and wait until it accepts connections."""
        self.spawn()
        assert self.popen is not None
        deadline = time.monotonic() + startup_seconds
        async with grpc.aio.insecure_channel(self.target) as channel:
            while True:
                if self.popen.poll() is not None:
                    raise RuntimeError(f"{self.name} exited early:\n{self.log_path.read_text()}")
                try:
                    await asyncio.wait_for(channel.channel_ready(), 0.5)
                    return
                except TimeoutError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{self.name} did not start in {startup_seconds} s") from None

    def rss(self) -> int:
        assert self.ps is not None
        return int(self.ps.memory_info().rss)

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process (all its threads)."""
        assert self.ps is not None
        times = self.ps.cpu_times()
        return float(times.user + times.system)

    def threads(self) -> int:
        assert self.ps is not None
        return int(self.ps.num_threads())

    async def settle(self, quiet_for: float = 0.3, max_wait: float = 5.0) -> None:
        """Wait until the server has used (almost) no CPU for ``quiet_for`` seconds."""
        deadline = time.monotonic() + max_wait
        while time.monotonic() < deadline:
            before = self.cpu_seconds()
            await asyncio.sleep(quiet_for)
            if self.cpu_seconds() - before < 0.02 * quiet_for:
                return

    def stop(self, timeout: float = 15.0) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


# ----------------------------------------------------------------------------- stats


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of ``values``."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def own_cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return float(times.user + times.system)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent busy (all cores, all processes) since boot."""
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


async def wait_for_quiet(
    exclude: Sequence[psutil.Process] = (), *, limit: float = 0.25, max_wait: float = 10.0
) -> float:
    """Wait (up to ``max_wait`` s) until the rest of the machine uses < ``limit`` cores.

    Other users' builds and tests on a shared 2-core machine skew every number;
    this trades a few seconds for cleaner windows. ``exclude`` (our servers,
    this process) is not counted. Returns the last measured outside load (cores).
    """
    mine = [psutil.Process(), *exclude]
    deadline = time.monotonic() + max_wait
    while True:
        busy0 = machine_busy_seconds()
        own0 = _cpu_of(mine)
        t0 = time.monotonic()
        await asyncio.sleep(0.5)
        elapsed = time.monotonic() - t0
        other = max(0.0, (machine_busy_seconds() - busy0 - (_cpu_of(mine) - own0)) / elapsed)
        if other < limit or time.monotonic() >= deadline:
            return other


class QuietGate:
    """Calls :func:`wait_for_quiet` before each measurement, within a total time budget."""

    def __init__(self, budget: float, per_wait: float = 5.0, limit: float = 0.25) -> None:
        self.budget = budget
        self.per_wait = per_wait
        self.limit = limit
        self.waited = 0.0
        self.noisy = 0  # measurements started while the machine was still busy
        self.exclude: list[psutil.Process] = []

    async def __call__(self) -> None:
        left = self.budget - self.waited
        start = time.monotonic()
        other = await wait_for_quiet(
            self.exclude, limit=self.limit, max_wait=max(0.0, min(self.per_wait, left))
        )
        self.waited += time.monotonic() - start
        if other >= self.limit:
            self.noisy += 1


def _cpu_of(processes: Sequence[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        with contextlib.suppress(psutil.Error):
            times = process.cpu_times()
            total += times.user + times.system
    return total


def machine_summary() -> str:
    """One line about the machine and the software measured."""
    import platform

    import google.protobuf

    load1, load5, _ = os.getloadavg()
    return (
        f"Python {platform.python_version()}, grpcio {grpc.__version__}, protobuf "
        f"{google.protobuf.__version__}, {psutil.cpu_count()} CPUs ({platform.machine()}), "
        f"load average {load1:.2f}/{load5:.2f} (1/5 min) at the start"
    )


# ----------------------------------------------------------------------------- tables


@dataclass
class Table:
    """A result table, rendered with rich on the console and as markdown in results.md."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, *cells: Any) -> None:
        self.rows.append([str(c) for c in cells])

    def to_markdown(self) -> str:
        lines = [f"### {self.title}", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        for row in self.rows:
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")
        if self.notes:
            lines.append("")
            lines.extend(f"- {note}" for note in self.notes)
        lines.append("")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "columns": self.columns, "rows": self.rows, "notes": self.notes}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Table:
        return cls(data["title"], data["columns"], data["rows"], data.get("notes", []))


def print_tables(tables: Sequence[Table]) -> None:
    """Aligned text tables (rich), notes under each."""
    from rich import box
    from rich.console import Console
    from rich.table import Table as RichTable

    console = Console(width=max(180, Console().width), highlight=False)
    for table in tables:
        rich_table = RichTable(title=table.title, box=box.SIMPLE_HEAVY, title_justify="left")
        for index, column in enumerate(table.columns):
            rich_table.add_column(column, justify="left" if index == 0 else "right", no_wrap=index == 0)
        for row in table.rows:
            styled = [f"[green]{c}[/]" if c == "PASS" else f"[red]{c}[/]" if c == "MISS" else c for c in row]
            rich_table.add_row(*styled)
        console.print(rich_table)
        for note in table.notes:
            console.print(f"  * {note}", soft_wrap=False)
        console.print()


def write_markdown(path: Path, header: str, tables: Sequence[Table]) -> None:
    body = [header.rstrip(), ""]
    body.extend(table.to_markdown() for table in tables)
    path.write_text("\n".join(body), encoding="utf-8")


def write_tables_json(path: Path, tables: Sequence[Table]) -> None:
    """``tables`` as JSON: how a benchmark run by bench/run.py in its own process hands them back."""
    path.write_text(json.dumps([table.to_dict() for table in tables], ensure_ascii=False), encoding="utf-8")


def read_tables_json(path: Path) -> list[Table]:
    """The tables :func:`write_tables_json` wrote."""
    return [Table.from_dict(data) for data in json.loads(path.read_text(encoding="utf-8"))]


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


@contextlib.contextmanager
def timed(label: str, log: bool = True) -> Any:
    start = time.perf_counter()
    yield
    if log:
        print(f"  [{label}: {time.perf_counter() - start:.1f} s]", file=sys.stderr, flush=True)
