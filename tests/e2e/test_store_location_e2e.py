"""Where ``turnwire serve`` keeps its SQLite store, through the real command. Fresh-user trial:
``serve --store sqlite:////nonexistent/dir/x.db`` created the directories, migrated a new database
and served an empty store, so a mistyped path silently gave a new, empty store. It is now refused
at start (exit 2, the configuration errors' status), naming the missing directory and saying to
create it, with nothing created; without ``--store`` the store is ``turnwire.db`` in the working
directory as before, and ``turnwire demo --workdir`` still makes its directory. In process:
``tests/test_store_location.py``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support.sidecar import SidecarProcess, free_port, run_turnwire

from turnwire_client import TurnwireClient, collect


class DefaultStoreSidecar(SidecarProcess):
    """A sidecar started without ``--store``: the embedded default store, ``turnwire.db`` in its
    working directory (``workdir``)."""

    @property
    def command(self) -> list[str]:
        command = super().command
        at = command.index("--store")
        return command[:at] + command[at + 2 :]


async def test_serve_refuses_a_store_whose_directory_does_not_exist(tmp_path: Path) -> None:
    missing = tmp_path / "missing" / "dir"
    run = await run_turnwire(
        "serve", "--listen", f"127.0.0.1:{free_port()}", "--store", f"sqlite:///{missing}/x.db", timeout=60
    )
    assert run.code == 2, run
    assert (
        f"store.url: the directory {missing} does not exist: create it first (mkdir -p {missing})"
        in run.stderr
    ), run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    assert not (tmp_path / "missing").exists(), "nothing is created for a mistyped path"


async def test_serve_without_a_store_keeps_turnwire_db_in_its_working_directory(tmp_path: Path) -> None:
    sidecar = DefaultStoreSidecar(tmp_path / "work")
    assert "--store" not in sidecar.command
    await sidecar.start()
    try:
        async with TurnwireClient(sidecar.target) as client:
            assert (await collect(client.chat("default-store", "hello"))).ok
    finally:
        assert await sidecar.terminate() == 0, sidecar.log_text()
    assert (tmp_path / "work" / "turnwire.db").is_file()


def test_the_demo_makes_its_workdir_and_keeps_its_store_there(tmp_path: Path) -> None:
    workdir = tmp_path / "new" / "demo"
    done = subprocess.run(
        [sys.executable, "-m", "turnwire_server", "demo", "--workdir", str(workdir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (workdir / "turnwire.db").is_file()
