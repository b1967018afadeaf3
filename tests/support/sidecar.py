"""Run a real ``turnwire serve`` process for end-to-end tests.

:class:`SidecarProcess` writes the YAML config (if any) into a directory, picks
a free port, starts ``python -m turnwire_server serve`` there with its own SQLite file,
and waits until the standard health service says SERVING. Output goes to a
log file in the same directory, shown in every failure message.

Several processes may run one after the other on the same directory (and so
the same database) to test restarts; each gets its own log file.

:func:`run_turnwire` runs one of the other ``turnwire`` commands (``migrate``,
``health``, …) to its end.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import grpc
import psutil
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from turnwire_client import TlsOptions
from turnwire_server.health_check import STARTING_SERVER_OPTIONS

# A deadline, not a speed target: a loaded 2-core machine (CI, helpers' test runs at once) has
# taken over 20 s to bring up a process that imports grpc, the SDKs and pydantic.
START_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 20.0
PORT_ATTEMPTS = 3
CONFIG_FILE_NAME = "turnwire.yaml"
DB_FILE_NAME = "turnwire.db"


# Ports handed to servers come from below the kernel's ephemeral range (32768-60999 on Linux),
# which outgoing connections (to PostgreSQL, to a sidecar) draw from: a port taken from that range
# with ``bind(0)`` could be given to some connection before the server bound it ("Address already
# in use"). Each pytest-xdist worker has its own slice, so two workers never hand out one port.
_PORT_RANGE_START = 20000
_PORT_SLICE = 1500


@functools.cache
def _slice_ports() -> Iterator[int]:
    """This process's slice of ``[20000, 32000)`` (by xdist worker number: ``gw3`` → slice 3,
    modulo 8; slice 0 outside xdist), endlessly, from a random start: two test runs at once
    rarely meet."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    index = int(worker) % 8 if worker.isdigit() else 0
    start = _PORT_RANGE_START + index * _PORT_SLICE
    first = random.randrange(_PORT_SLICE)
    return itertools.cycle([start + (first + i) % _PORT_SLICE for i in range(_PORT_SLICE)])


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 that no other test of this run hands out and no outgoing
    connection is given (see above); the server binds it soon after. Each is checked free by
    binding it.

    Raises:
        RuntimeError: every port of this process's slice is held.
    """
    ports = _slice_ports()
    for _ in range(_PORT_SLICE):
        port = next(ports)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("every port of this test process's slice is held")


def _holds_port(pid: int, port: int) -> bool:
    """Whether process ``pid`` or one of its children (``--workers``) has a TCP socket on
    ``port``: the process answering there is this one. Without this check, a health check
    answered by another test's sidecar on the same port (two ``free_port`` calls of parallel
    tests can return the same port) passed for this one, and its calls went to that sidecar."""
    try:
        parent = psutil.Process(pid)
        processes = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for process in processes:
        try:
            if any(c.laddr and c.laddr.port == port for c in process.net_connections(kind="tcp")):
                return True
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return False


class SidecarError(RuntimeError):
    """The sidecar did not start or stop as expected; the message holds its log."""


class SidecarProcess:
    """One ``turnwire serve`` child process.

    Args:
        workdir: Directory for the config file, the SQLite database
            (``turnwire.db``) and the log files; also the process's working directory.
        config: The YAML configuration as a dict, written to ``turnwire.yaml``;
            None starts without ``--config`` (embedded defaults).
        env: Extra environment variables (e.g. ``TURNWIRE_LOG_LEVEL``). Inherited
            ``TURNWIRE_*`` variables are dropped so the host cannot leak settings in. Unless
            ``env`` or ``config`` sets ``limits.drain_seconds``, it is 0: the tests stop their
            sidecars with SIGTERM, and only the drain window's own tests wait it out.
        store_url: The store (``--store``); None: the SQLite file ``turnwire.db`` in ``workdir``.
        tls: How to reach a sidecar whose config has a ``tls:`` section (the start waits for
            SERVING over it); None: plaintext.
    """

    def __init__(
        self,
        workdir: Path,
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        store_url: str | None = None,
        tls: TlsOptions | None = None,
    ) -> None:
        self.workdir = Path(workdir)
        self.tls = tls
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.extra_env = dict(env or {})
        self.port = free_port()
        self.db_path = self.workdir / DB_FILE_NAME
        self.store_url = store_url or f"sqlite:///{self.db_path}"
        self.config_path: Path | None = None
        self.health_metadata: tuple[tuple[str, str], ...] = ()
        """Metadata the readiness check sends: a bearer token when ``auth.open_health`` is false."""
        if config is not None:
            self.config_path = self.workdir / CONFIG_FILE_NAME
            self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.log_path = _next_log_path(self.workdir)
        self.process: subprocess.Popen[bytes] | None = None

    # -- addresses ------------------------------------------------------------------------

    @property
    def target(self) -> str:
        """``127.0.0.1:PORT``, for a gRPC channel."""
        return f"127.0.0.1:{self.port}"

    def channel(self, options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A new channel to the sidecar (with the channel ``options``): over :attr:`tls` when set,
        else plaintext."""
        if self.tls is None:
            return grpc.aio.insecure_channel(self.target, options=list(options))
        return grpc.aio.secure_channel(
            self.target, self.tls.channel_credentials(), options=[*self.tls.channel_options(), *options]
        )

    @property
    def command(self) -> list[str]:
        """The command line the process runs."""
        command = [
            sys.executable,
            "-m",
            "turnwire_server",
            "serve",
            "--listen",
            self.target,
            "--store",
            self.store_url,
        ]
        if self.config_path is not None:
            command += ["--config", str(self.config_path)]
        return command

    @property
    def pid(self) -> int:
        """The child's process id (after :meth:`start`)."""
        return self._running().pid

    @property
    def returncode(self) -> int | None:
        """The exit code once the process ended, else None."""
        return None if self.process is None else self.process.poll()

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, timeout: float = START_TIMEOUT_SECONDS) -> SidecarProcess:  # noqa: ASYNC109
        """Start the process and wait until health Check says SERVING; returns ``self``.

        When another process took the chosen port in the meantime, retries on a new one.

        Raises:
            SidecarError: the process exited, or was not SERVING within ``timeout``
                seconds (the process is killed); the message includes its log.
        """
        deadline = time.monotonic() + timeout
        for attempt in range(1, PORT_ATTEMPTS + 1):
            process = self._spawn()
            code = await self._wait_serving(process, deadline, timeout)
            if code is None:
                return self
            if attempt < PORT_ATTEMPTS and f"cannot listen on {self.target}" in self.log_text():
                self.process = None
                self.port = free_port()
                continue
            raise SidecarError(f"the sidecar exited with code {code} while starting:\n{self.log_text()}")
        raise AssertionError("unreachable")

    async def _wait_serving(
        self, process: subprocess.Popen[bytes], deadline: float, budget: float
    ) -> int | None:
        """None once SERVING; the exit code if the process ended first."""
        async with self.channel(STARTING_SERVER_OPTIONS) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while True:
                code = process.poll()
                if code is not None:
                    return code
                try:
                    reply = await stub.Check(
                        health_pb2.HealthCheckRequest(), timeout=0.5, metadata=self.health_metadata or None
                    )
                    # SERVING from this process, not from another test's sidecar that took the
                    # port first (this one then exits: cannot listen; retried on a new port).
                    if reply.status == health_pb2.HealthCheckResponse.SERVING and _holds_port(
                        process.pid, self.port
                    ):
                        return None
                except grpc.aio.AioRpcError:
                    pass
                if time.monotonic() > deadline:
                    self.kill()
                    raise SidecarError(
                        f"the sidecar at {self.target} was not SERVING after {budget:g} s:\n{self.log_text()}"
                    )
                await asyncio.sleep(0.05)

    def _spawn(self) -> subprocess.Popen[bytes]:
        # Popen returns once the child is forked; it does not wait for it.
        if self.process is not None:
            raise SidecarError("this SidecarProcess was already started; create a new one")
        environment = {k: v for k, v in os.environ.items() if not k.startswith("TURNWIRE_")}
        environment["PYTHONUNBUFFERED"] = "1"
        if "drain_seconds" not in (self.config or {}).get("limits", {}):
            environment["TURNWIRE_LIMITS__DRAIN_SECONDS"] = "0"
        environment.update(self.extra_env)
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.command,
                cwd=self.workdir,
                env=environment,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self.process

    def start_blocking(self, timeout: float = START_TIMEOUT_SECONDS) -> SidecarProcess:
        """:meth:`start` for synchronous code (e.g. a module-scoped fixture): runs it on a
        private event loop in a worker thread, so it works whether or not a loop is running."""
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sidecar-start") as pool:
            return pool.submit(asyncio.run, self.start(timeout)).result()

    def send_signal(self, signum: int) -> None:
        """Send ``signum`` without waiting (e.g. SIGTERM while a turn streams)."""
        process = self._running()
        if process.poll() is None:
            process.send_signal(signum)

    async def wait(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int:  # noqa: ASYNC109
        """Wait (without blocking the event loop) for the process to exit; its exit code.

        Raises:
            SidecarError: still running after ``timeout`` seconds (it is then killed).
        """
        process = self._running()
        deadline = time.monotonic() + timeout
        while (code := process.poll()) is None:
            if time.monotonic() > deadline:
                self.kill()
                raise SidecarError(f"the sidecar did not exit within {timeout:g} s:\n{self.log_text()}")
            await asyncio.sleep(0.02)
        return code

    async def terminate(self, timeout: float = STOP_TIMEOUT_SECONDS) -> int:  # noqa: ASYNC109
        """SIGTERM (graceful stop), then wait for the exit; returns the exit code."""
        self.send_signal(signal.SIGTERM)
        return await self.wait(timeout)

    def kill(self) -> int | None:
        """SIGKILL and reap the process; its exit code (None if it never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.kill()
        return self.process.wait()

    def log_text(self) -> str:
        """Everything the process wrote to stdout and stderr so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _running(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise SidecarError("the sidecar was not started; await start() first")
        return self.process

    def __repr__(self) -> str:
        state = "not started" if self.process is None else f"pid {self.process.pid}"
        return f"SidecarProcess({self.target}, {state}, workdir={self.workdir})"


class CommandResult(NamedTuple):
    """How a ``turnwire`` command ended: its exit status and what it printed."""

    code: int
    stdout: str
    stderr: str


async def spawn_turnwire(*args: str, env: dict[str, str] | None = None) -> asyncio.subprocess.Process:
    """Start ``python -m turnwire_server ARGS`` with piped stdout and stderr, for a test that talks
    to it while it runs (sends it a signal, say). Environment as for :func:`run_turnwire`."""
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TURNWIRE_")}
    environment.update(env or {})
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "turnwire_server",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=environment,
    )


async def run_turnwire(
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,  # noqa: ASYNC109
) -> CommandResult:
    """Run ``python -m turnwire_server ARGS`` (the ``turnwire`` command) to its end without
    blocking the event loop. Its environment is this one less the ``TURNWIRE_*`` variables
    (as for :class:`SidecarProcess`), plus ``env``.

    Raises:
        TimeoutError: it ran longer than ``timeout`` seconds.
    """
    process = await spawn_turnwire(*args, env=env)
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=timeout)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    assert process.returncode is not None
    return CommandResult(process.returncode, out.decode(), err.decode())


SidecarFactory = Callable[..., SidecarProcess]
"""The ``sidecar_factory`` fixture: ``(config=None, env=None, workdir=None, store_url=None,
tls=None) -> SidecarProcess``."""


@contextlib.contextmanager
def running_sidecar(
    workdir: Path,
    config: dict[str, Any] | None = None,
    env: dict[str, str] | None = None,
    tls: TlsOptions | None = None,
    store_url: str | None = None,
) -> Iterator[SidecarProcess]:
    """A started :class:`SidecarProcess` for synchronous code (module-scoped fixtures);
    killed on exit. ``store_url`` as for :class:`SidecarProcess`."""
    sidecar = SidecarProcess(workdir, config, env, store_url=store_url, tls=tls)
    try:
        yield sidecar.start_blocking()
    finally:
        sidecar.kill()


def _next_log_path(workdir: Path) -> Path:
    index = 1
    while (path := workdir / f"sidecar-{index}.log").exists():
        index += 1
    # Reserve the name now so two processes on one directory never share a log.
    path.touch()
    return path
