"""A throwaway PostgreSQL cluster of a test's own, to stop and restart under a live sidecar.

The suite's shared server (``support.stores``) must never be restarted: other tests and helpers
use it. :class:`PgCluster` runs ``initdb`` into a temporary directory and ``pg_ctl`` on a free
loopback port (trust auth, ``fsync=off``: a test cluster, not a durable one)::

    with PgCluster() as cluster:
        url = cluster.url                 # postgresql://postgres@127.0.0.1:<port>/postgres
        cluster.stop()                    # pg_ctl stop -m fast: connections closed, port closed
        cluster.start()                   # same data, same port
        cluster.restart()                 # both

``initdb`` and ``postgres`` refuse to run as root: as root, the directory is given to the
``postgres`` user and the commands run through ``runuser`` (the directory is made under the
system's temporary folder, not pytest's ``tmp_path``, whose parents only root may enter).
Calls ``pytest.fail`` (never skip) when ``initdb``/``pg_ctl`` are missing, like the store tests
without a server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.sidecar import free_port

__all__ = ["PgCluster"]

_PG_TIMEOUT_SECONDS = 60  # pg_ctl -w waits up to this for a start or a stop (a loaded machine)


class PgCluster:
    """One PostgreSQL 15 cluster in a new temporary directory (removed by :meth:`close`)."""

    def __init__(self) -> None:
        self.directory = Path(tempfile.mkdtemp(prefix="turnwire-pg-"))
        self.port = free_port()
        self._data = self.directory / "data"
        self._log = self.directory / "server.log"
        self._owner: list[str] = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.running = False

    @property
    def url(self) -> str:
        """The cluster's ``postgres`` database as superuser ``postgres`` (no password)."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def __enter__(self) -> PgCluster:
        self.create()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        """``initdb`` the data directory (UTF-8, trust auth)."""
        if shutil.which("initdb") is None or shutil.which("pg_ctl") is None:
            pytest.fail("these tests need initdb and pg_ctl (PostgreSQL 15) on the PATH", pytrace=False)
        self.directory.mkdir(parents=True, exist_ok=True)
        if self._owner:
            shutil.chown(self.directory, "postgres")
        self._run("initdb", "-D", str(self._data), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        """Start the server (waits until it accepts connections)."""
        options = f"-p {self.port} -k {self.directory} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run("pg_ctl", "-D", str(self._data), "-l", str(self._log), "-w", "-s",
                  "-t", str(_PG_TIMEOUT_SECONDS), "-o", options, "start")  # fmt: skip
        self.running = True

    def stop(self, mode: str = "fast") -> None:
        """Stop the server: ``fast`` (sessions disconnected, as a restart does) or ``immediate``
        (a crash: no checkpoint, recovery at the next start)."""
        self._run(
            "pg_ctl", "-D", str(self._data), "-m", mode, "-w", "-s", "-t", str(_PG_TIMEOUT_SECONDS), "stop"
        )
        self.running = False

    def restart(self, mode: str = "fast") -> None:
        """:meth:`stop`, then :meth:`start` on the same port and data."""
        self.stop(mode)
        self.start()

    def log_text(self) -> str:
        """The server's log (for failure messages)."""
        return self._log.read_text(errors="replace") if self._log.exists() else ""

    def close(self) -> None:
        """Stop the server if it runs and delete the directory."""
        try:
            if self.running:
                self.stop("immediate")
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _run(self, *command: str) -> None:
        result = subprocess.run(
            [*self._owner, *command],
            capture_output=True,
            text=True,
            timeout=_PG_TIMEOUT_SECONDS + 30,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{' '.join(command[:1])} failed ({result.returncode}): {result.stderr or result.stdout}\n"
                f"{self.log_text()[-2000:]}"
            )
