"""``turnwire serve --workers N``: N worker processes serve one port (issue 17, "All cores").

grpcio cannot serve a socket it inherits, so the workers share the port the kernel's way: each
binds it with ``SO_REUSEPORT`` and the kernel spreads new connections over them (by a hash of the
connection's addresses; a connection, so a channel, stays with one worker). The supervisor (this
process) first checks the address as a single sidecar does
(:func:`~turnwire_server.listen_check.check_listen_address`: a port in use fails at once, with
the same message), then holds it (:func:`~turnwire_server.listen_check.hold_listen_address`:
bound with ``SO_REUSEPORT``, never listening), so no other server takes the port while workers
come and go.

Each worker (:mod:`turnwire_server.worker`) is a whole sidecar and a replica of the PostgreSQL
store (docs/semantics.md §5, §8): its own replica id; its turns' leases renewed; the turns of a
worker that died claimed by a live one once their lease lapses. The SQLite store is one process's
file, so ``workers`` > 1 with it is a configuration error (:class:`~turnwire_server.config.Settings`).

The supervisor:

- sends each worker its settings through its stdin (pickled: exactly the validated settings,
  secrets included, written nowhere) and keeps the pipe open; a worker whose stdin closes (the
  supervisor died) stops as on SIGTERM;
- forwards SIGTERM, SIGINT and SIGHUP; each worker then drains, stops or reloads its TLS files and
  token sources as a single sidecar does. Workers run in their own session, so a terminal's Ctrl-C
  reaches them once, through the supervisor. A worker that has not said it serves yet may still
  be importing, before any handler: it gets SIGTERM for either stop signal (SIGINT would print a
  ``KeyboardInterrupt`` traceback), which then ends it as a stop, and no SIGHUP (whose default
  action would kill it; it reads its files as it starts);
- restarts a worker that exits on its own after a backoff (0.5 s, doubling up to 30 s, while it
  keeps exiting within 30 s of its start) and gives up after 5 such exits in a row: it stops the
  other workers and exits 1;
- exits 1 when a worker cannot start at first (the worker printed why), after stopping the others;
  after a signal, 0 once every worker exited 0 (or, not serving yet, was ended by that SIGTERM);
- serves the metrics endpoint alone: the workers write prometheus-client's multiprocess files in
  a directory it creates (``PROMETHEUS_MULTIPROC_DIR``) and removes at exit (one that a
  SIGKILLed supervisor left is removed at the next start), and a scrape adds them up
  (``MultiProcessCollector``; the ``process_*`` and ``python_*`` families are not served).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from turnwire_server.config import Settings
from turnwire_server.event_waits import set_within
from turnwire_server.listen_check import ListenAddressError, check_listen_address, hold_listen_address
from turnwire_server.metrics_endpoint import MetricsEndpoint, start_metrics_endpoint

log = logging.getLogger("turnwire.supervisor")

FIRST_BACKOFF_SECONDS = 0.5
MAX_BACKOFF_SECONDS = 30.0
STABLE_SECONDS = 30.0
"""A worker that ran this long before exiting starts its backoff afresh."""
MAX_QUICK_EXITS = 5
"""Exits in a row, each within :data:`STABLE_SECONDS` of its start, after which the supervisor gives up."""

_READY = b"r"
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class SupervisorError(Exception):
    """The supervisor cannot start; the message says what to fix."""


@dataclass
class _Worker:
    """One worker slot: its current process (replaced on a restart) and its backoff state."""

    number: int
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    quick_exits: int = 0
    ready: bool = False
    """The current process said it serves (its signal handlers are in place)."""

    def signal(self, signum: int) -> None:
        if self.process is not None and self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signum)


class Supervisor:
    """Runs ``len(workers)`` worker processes until a signal (see the module docstring).

    ``settings`` are what each worker runs with (``listen`` the concrete, held address);
    ``metrics_dir`` is the multiprocess directory the workers write, None without metrics.
    """

    def __init__(self, settings: Settings, metrics_dir: str | None) -> None:
        self._payload = pickle.dumps(settings)
        self._count = settings.workers
        self._workers = [_Worker(number) for number in range(1, settings.workers + 1)]
        self._metrics_dir = metrics_dir
        self._environment = dict(os.environ)
        if metrics_dir is not None:
            self._environment["PROMETHEUS_MULTIPROC_DIR"] = metrics_dir
        self._stopping = asyncio.Event()
        self._gave_up = False

    async def run(self) -> int:
        """Start every worker, keep them running until a signal or a worker that cannot be kept
        running, and return the exit status (0: stopped by a signal, every worker exited 0)."""
        loop = asyncio.get_running_loop()
        for signum in _FORWARDED:
            loop.add_signal_handler(signum, self._forward, signum)
        try:
            return await self._run()
        finally:
            for signum in _FORWARDED:
                loop.remove_signal_handler(signum)

    async def _run(self) -> int:
        started = await asyncio.gather(*(self._start(worker) for worker in self._workers))
        if not all(started):
            if not self._stopping.is_set():
                failed = [str(w.number) for w, ok in zip(self._workers, started, strict=True) if not ok]
                log.error("worker %s could not start (its message is above): stopping", ", ".join(failed))
                self._stopping.set()
                self._gave_up = True
                for worker in self._workers:
                    worker.signal(signal.SIGTERM)
        elif not self._stopping.is_set():
            log.info("%d workers serving", self._count)
        clean = await asyncio.gather(*(self._keep(worker) for worker in self._workers))
        code = 0 if all(clean) and not self._gave_up else 1
        log.info("every worker stopped; exit status %d", code)
        return code

    def _forward(self, signum: signal.Signals) -> None:
        if signum != signal.SIGHUP:
            if not self._stopping.is_set():
                log.info("%s: stopping the workers", signum.name)
            self._stopping.set()
        for worker in self._workers:
            if worker.ready:
                worker.signal(signum)
            elif signum != signal.SIGHUP:
                worker.signal(signal.SIGTERM)

    async def _start(self, worker: _Worker) -> bool:
        """Start ``worker``'s process; True once it serves, False when it exited first."""
        ready_read, ready_write = os.pipe()
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "turnwire_server.worker",
                str(ready_write),
                str(worker.number),
                str(self._count),
                stdin=asyncio.subprocess.PIPE,
                pass_fds=(ready_write,),
                start_new_session=True,
                env=self._environment,
            )
        except BaseException:
            os.close(ready_read)
            raise
        finally:
            os.close(ready_write)
        worker.process, worker.started_at, worker.ready = process, time.monotonic(), False
        log.info("worker %d started: pid %d", worker.number, process.pid)
        if self._stopping.is_set():  # a signal came while it was being created
            worker.signal(signal.SIGTERM)
        assert process.stdin is not None
        process.stdin.write(self._payload)  # the pipe stays open: its end tells the worker we are gone
        with contextlib.suppress(ConnectionError):
            await process.stdin.drain()
        reader = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(ready_read, "rb", buffering=0)
        )
        try:
            worker.ready = await reader.read(1) == _READY
            return worker.ready
        finally:
            transport.close()

    async def _keep(self, worker: _Worker) -> bool:
        """Wait for ``worker``'s process to exit and restart it until the supervisor stops;
        True when its last process exited 0 after a stop, False otherwise."""
        while True:
            assert worker.process is not None
            code = await worker.process.wait()
            if self._metrics_dir is not None:
                # Its live* gauges go; its counters stay in the sums.
                mark_process_dead(worker.process.pid, self._metrics_dir)  # type: ignore[no-untyped-call]
            if self._stopping.is_set():
                if code == -signal.SIGTERM and not worker.ready:
                    # Ended by the stop before it served (still importing): a stop like any other.
                    log.info("worker %d (pid %d) stopped before it served", worker.number, worker.process.pid)
                    return True
                if code != 0:
                    log.warning("worker %d (pid %d) exited with %s", worker.number, worker.process.pid, code)
                return code == 0
            lived = time.monotonic() - worker.started_at
            worker.quick_exits = worker.quick_exits + 1 if lived < STABLE_SECONDS else 1
            if worker.quick_exits > MAX_QUICK_EXITS:
                log.error(
                    "worker %d exited %d times in a row within %.0f s of starting: giving up, stopping",
                    worker.number,
                    worker.quick_exits,
                    STABLE_SECONDS,
                )
                self._gave_up = True
                self._forward(signal.SIGTERM)
                return False
            delay = min(FIRST_BACKOFF_SECONDS * 2 ** (worker.quick_exits - 1), MAX_BACKOFF_SECONDS)
            log.warning(
                "worker %d (pid %d) exited unexpectedly (%s): restarting it in %.1f s",
                worker.number,
                worker.process.pid,
                _describe_exit(code),
                delay,
            )
            await set_within(self._stopping, delay)
            if self._stopping.is_set():
                return True  # stopped during the backoff: nothing left to stop
            await self._start(worker)  # a worker that cannot start exits: the loop counts it


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit status {code}"


METRICS_DIR_PREFIX = "turnwire-metrics-"
"""The multiprocess metrics directory is ``{tempdir}/turnwire-metrics-{supervisor pid}-{random}``."""


def remove_orphaned_metrics_dirs(parent: str) -> list[str]:
    """Remove the multiprocess metrics directories under ``parent`` whose supervisor is gone (it
    was SIGKILLed, so its ``finally`` never removed them); the paths removed. A directory whose
    pid is alive (another supervisor, or a reused pid) is kept: the check is ``kill(pid, 0)``."""
    removed: list[str] = []
    try:
        names = os.listdir(parent)
    except OSError:
        return removed
    for name in names:
        pid_text, _, rest = name.removeprefix(METRICS_DIR_PREFIX).partition("-")
        if not name.startswith(METRICS_DIR_PREFIX) or not rest or not pid_text.isdigit():
            continue
        try:
            os.kill(int(pid_text), 0)
            continue
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue  # alive under another user, or not a pid: not ours to remove
        path = os.path.join(parent, name)
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


async def supervise(settings: Settings) -> int:
    """Run ``settings.workers`` workers on ``settings.listen`` until SIGTERM or SIGINT (see the
    module docstring); the exit status. Raises :class:`SupervisorError` when the port or the
    metrics endpoint cannot be had (nothing was started then)."""
    try:
        check_listen_address(settings.listen)
        held, port = hold_listen_address(settings.listen)
    except ListenAddressError as error:
        raise SupervisorError(str(error)) from None
    http_listen = settings.http.listen
    if http_listen is not None:
        # The HTTP listener's port is held the same way: each worker serves it with SO_REUSEPORT.
        try:
            check_listen_address(http_listen)
            http_held, http_port = hold_listen_address(http_listen)
        except ListenAddressError as error:
            for holder in held:
                holder.close()
            raise SupervisorError(f"http.listen: {error}") from None
        held += http_held
        http_listen = f"{http_listen.rpartition(':')[0]}:{http_port}"
    metrics_dir: str | None = None
    endpoint: MetricsEndpoint | None = None
    try:
        if settings.metrics.enabled:
            remove_orphaned_metrics_dirs(tempfile.gettempdir())
            metrics_dir = tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-")
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=metrics_dir)  # type: ignore[no-untyped-call]
            try:
                endpoint = start_metrics_endpoint(settings.metrics.listen, registry)
            except (OSError, ValueError) as error:
                raise SupervisorError(
                    f"metrics.listen: cannot listen on {settings.metrics.listen}: {error}"
                ) from error
            log.info(
                "metrics of all workers on http://%s/metrics (their files in %s)",
                settings.metrics.listen,
                metrics_dir,
            )
        host = settings.listen.rpartition(":")[0]
        log.info("supervisor holds %s:%d; starting %d workers", host, port, settings.workers)
        worker_settings = settings.model_copy(
            update={
                "listen": f"{host}:{port}",
                "http": settings.http.model_copy(update={"listen": http_listen}),
            }
        )
        return await Supervisor(worker_settings, metrics_dir).run()
    finally:
        if endpoint is not None:
            endpoint.close()
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)
        for holder in held:
            holder.close()
