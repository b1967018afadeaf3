"""``turnwire demo``: the main job end to end on a fresh machine.

Starts ``turnwire serve`` as a real child process on a free port with the
embedded defaults (SQLite in ``workdir``, the offline scripted model, the demo
tools), holds a short conversation whose turns call tools, prints the stored
transcript, then stops the sidecar with SIGTERM and checks it exited cleanly.

``turnwire demo --overflow`` runs the same sidecar with :data:`OVERFLOW_CONFIG`: the scripted
model gets a small context window and the built-in ``ContextCompaction`` middleware turns on
reactive compaction (docs/semantics.md §9), so a longer conversation outgrows the window and
the turn that overflows recovers in its own stream.

``turnwire demo --inspect`` also serves the HTTP listener with the inspector page
(docs/inspector.md) on a free port, prints the page's address (authentication is off in the
demo: no token), and keeps the sidecar up after the conversation until Ctrl-C, so the demo's
turns can be looked at.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from rich.console import Console

from turnwire_server.cli.connection import Connection, command_name
from turnwire_server.cli.history import run_history
from turnwire_server.cli.turns import run_chat
from turnwire_server.health_check import STARTING_SERVER_OPTIONS

DEMO_MESSAGES = (
    "What's the weather in Paris?",
    "And what is (12 + 30) * 7?",
)

OVERFLOW_MESSAGES = (
    "What's the weather in Paris?",
    "What's the weather in Oslo?",
    "What is 1234 * 5678?",
    "What's the weather in Lima?",
    "What's the weather in Tokyo?",
)

OVERFLOW_CONFIG = """\
# turnwire demo --overflow: a model with a small context window, and compaction to recover.
store:
  url: sqlite:///turnwire-overflow-demo.db
providers:
  scripted:
    context_window: 522          # tokens, 222 of them the demo tools' definitions: a longer talk overflows it
middleware:
  - path: turnwire.middlewares:ContextCompaction
    options:
      strategy: summarize
      summary_model: scripted:summarizer
      reactive: true             # compact and run the turn again after an overflow
"""
"""The sidecar's config for ``turnwire demo --overflow`` (written next to its database)."""


def free_port() -> int:
    """An unused TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class SidecarExited(RuntimeError):
    """The sidecar process ended before it was SERVING."""


async def wait_until_serving(
    target: str, process: asyncio.subprocess.Process | None = None, limit_s: float = 30.0
) -> None:
    """Poll the standard health service until SERVING.

    Raises :class:`SidecarExited` as soon as ``process`` (when given) has ended, and
    TimeoutError after ``limit_s`` seconds.
    """
    deadline = time.monotonic() + limit_s
    async with grpc.aio.insecure_channel(target, options=STARTING_SERVER_OPTIONS) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.aio.AioRpcError:
                pass
            if process is not None and process.returncode is not None:
                raise SidecarExited(
                    f"the sidecar exited with code {process.returncode} before it was serving"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(f"the sidecar at {target} did not become SERVING in {limit_s:g} s")
            await asyncio.sleep(0.1)


async def wait_for_interrupt() -> None:
    """Return on SIGINT (Ctrl-C) or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def run_demo(
    workdir: Path, *, overflow: bool = False, listen: str | None = None, inspect: bool = False
) -> int:
    """Run the demo in ``workdir`` (an existing directory); returns a process exit code.
    ``overflow``: the context-overflow demo (module docstring). ``listen``: the sidecar's
    ``HOST:PORT`` (a wildcard host, ``0.0.0.0`` or ``[::]``, is reached on the loopback; port 0:
    a free one); None: 127.0.0.1 and a free port. ``inspect``: the inspector page too, the
    sidecar kept up until Ctrl-C (module docstring)."""
    console = Console()
    from turnwire_server.http.inspector_door import page_built  # starlette: only the page needs it

    if inspect and not page_built():
        # A checkout builds the page with `make build-inspector` (`make demo` does); a wheel ships it.
        console.print(
            "[red]the inspector page is not built in this install[/]: run `make build-inspector` "
            "(or `make demo`, which builds it) in the repository, "
            f"then `{command_name()} demo --inspect` again"
        )
        return 2
    host, _, port = (listen or "127.0.0.1:0").rpartition(":")
    if port == "0":  # the demo must know the port to talk to its sidecar: pick one now
        port = str(free_port())
    listen = f"{host}:{port}"
    target = f"127.0.0.1:{port}" if host in ("0.0.0.0", "[::]", "") else listen
    log_path = workdir / ("turnwire-overflow-demo.log" if overflow else "turnwire-demo.log")
    config: list[str] = []
    messages: tuple[str, ...] = DEMO_MESSAGES
    if overflow:
        config_path = workdir / "turnwire-overflow-demo.yaml"
        config_path.write_text(OVERFLOW_CONFIG)
        config = ["--config", str(config_path)]
        messages = OVERFLOW_MESSAGES
    console.rule("[bold]Turnwire demo" + (": context-window overflow" if overflow else ""))
    command = " ".join(["turnwire serve --listen", listen, *config])
    console.print(f"starting [bold]{command}[/] in {workdir}")
    console.print(f"sidecar log: {log_path}", soft_wrap=True)
    environment = dict(os.environ)
    page = ""
    if inspect:
        http_listen = f"127.0.0.1:{free_port()}"
        environment.update({"TURNWIRE_HTTP__LISTEN": http_listen, "TURNWIRE_HTTP__INSPECTOR": "true"})
        page = f"http://{http_listen}/inspector/"
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "turnwire_server",
            "serve",
            "--listen",
            listen,
            *config,
            cwd=workdir,
            stdout=log,
            stderr=log,
            env=environment,
        )
        code = 1
        try:
            try:
                await wait_until_serving(target, process)
            except (SidecarExited, TimeoutError) as error:
                console.print(f"[red]{error}[/]; its log says:")
                logged = log_path.read_text(errors="replace")
                console.print(logged[-2000:], markup=False, highlight=False)
                if "in use by another turnwire process" in logged:
                    # The demo's own store is the file in its directory: another directory frees it.
                    console.print(
                        f"a sidecar already serves {workdir}: run the demo in another directory,"
                        f" `{command_name()} demo --workdir DIR`"
                        " (from make: `make demo DEMO_ARGS='--workdir DIR'`)",
                        soft_wrap=True,  # commands to copy: never broken across lines
                    )
                return 1
            console.print("[green]sidecar is SERVING[/] (grpc.health.v1)\n")
            conversation = f"demo-{int(time.time())}"
            if page:
                console.print(f"inspector: [bold]{page}#conversation={conversation}[/]\n", soft_wrap=True)
            code = 0
            for text in messages:
                console.print(f"[bold cyan]you>[/] {text}")
                result = await run_chat(Connection(target), conversation, text, console=console)
                code = code or result
                console.print()
            console.rule(f"stored transcript of {conversation}")
            code = code or await run_history(Connection(target), conversation, console=console)
            if page:
                console.rule()
                console.print(f"inspector: [bold]{page}#conversation={conversation}[/]", soft_wrap=True)
                console.print("the sidecar stays up for the page: press Ctrl-C to stop it")
                await wait_for_interrupt()
            elif code == 0 and not overflow:
                console.print(
                    "\nsee these turns as timelines in the inspector page: "
                    f"[bold]{command_name()} demo --inspect[/]",
                    soft_wrap=True,
                )
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            exit_code = await process.wait()
        console.rule()
        if exit_code != 0:
            console.print(f"[red]the sidecar exited with {exit_code}; see {log_path}[/]")
            return exit_code or 1
        console.print("sidecar stopped cleanly (SIGTERM, exit 0)")
    return code
