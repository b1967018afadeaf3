"""One worker of ``turnwire serve --workers N``, started by :mod:`turnwire_server.supervisor` as
``python -m turnwire_server.worker READY_FD NUMBER COUNT``.

It reads its settings (pickled :class:`~turnwire_server.config.Settings`) from stdin, serves them
as a single sidecar does but binding the port with ``SO_REUSEPORT`` and without a metrics endpoint
(:func:`turnwire_server.app.serve` with ``worker=True``), logs its replica id and then writes
one byte to ``READY_FD`` once serving (:func:`announce_ready`), and stops as on SIGTERM when its
stdin closes (the supervisor is gone). Exit status 1 when it cannot start (the reason on stderr,
as ``turnwire serve`` prints it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import sys
from collections.abc import Callable

from turnwire_server.app import Sidecar, serve
from turnwire_server.assembly import StartupError, StartupStopped
from turnwire_server.config import Settings
from turnwire_server.event_loop import EventLoopUnavailable, run
from turnwire_server.logs import configure_process_logging, report_exit

log = logging.getLogger("turnwire.supervisor")

_STDIN = 0


def main(argv: list[str]) -> int:
    """Run one worker (arguments as in the module docstring); its exit status."""
    ready_fd, number, count = (int(value) for value in argv)
    settings = pickle.load(sys.stdin.buffer)  # from the supervisor, our parent: trusted
    if not isinstance(settings, Settings):
        raise TypeError(f"expected Settings on stdin, got {type(settings).__name__}")
    configure_process_logging(settings)

    def on_ready(sidecar: Sidecar, stop: Callable[[], None]) -> None:
        announce_ready(ready_fd, number, count, sidecar.engine.settings.replica_id)
        loop = asyncio.get_running_loop()

        def supervisor_gone() -> None:
            if not os.read(_STDIN, 64):  # end of file: the supervisor's end of the pipe closed
                loop.remove_reader(_STDIN)
                log.warning("worker %d: the supervisor is gone; stopping", number)
                stop()

        loop.add_reader(_STDIN, supervisor_gone)

    try:
        run(serve(settings, worker=True, on_ready=on_ready), settings.event_loop)
    except StartupStopped as stopped:
        report_exit(settings, f"worker {number}: {stopped}", level=logging.INFO)
        return 0
    except (StartupError, EventLoopUnavailable) as error:
        report_exit(settings, f"worker {number} cannot start: {error}")
        return 1
    return 0


def announce_ready(ready_fd: int, number: int, count: int, replica_id: str) -> None:
    """Log that worker ``number`` of ``count`` serves as ``replica_id``, then write the ready
    byte to ``ready_fd`` and close it. In this order: the supervisor logs "N workers serving"
    once every worker's byte came, so a reader of the shared log who sees that line also sees
    every worker's own line (its pid and replica id) before it."""
    log.info("worker %d of %d (pid %d) serving as replica %s", number, count, os.getpid(), replica_id)
    os.write(ready_fd, b"r")
    os.close(ready_fd)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
