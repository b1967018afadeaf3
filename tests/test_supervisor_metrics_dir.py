"""The supervisor's multiprocess metrics directory: one left by a SIGKILLed supervisor (its
``finally`` never ran) is removed at the next start; a live supervisor's is kept."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from turnwire_server.supervisor import METRICS_DIR_PREFIX, remove_orphaned_metrics_dirs


def _dead_pid() -> int:
    """The pid of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_only_the_directories_of_gone_supervisors_are_removed(tmp_path: Path) -> None:
    orphan = tmp_path / f"{METRICS_DIR_PREFIX}{_dead_pid()}-abc123"
    orphan.mkdir()
    (orphan / "counter_1234.db").write_bytes(b"\0" * 64)
    live = tmp_path / f"{METRICS_DIR_PREFIX}{os.getpid()}-def456"
    live.mkdir()
    unrelated = [
        tmp_path / "turnwire-metrics-notapid-x",
        tmp_path / "other-123-x",
        tmp_path / f"{METRICS_DIR_PREFIX}1",
    ]
    for path in unrelated:
        path.mkdir()

    assert remove_orphaned_metrics_dirs(str(tmp_path)) == [str(orphan)]
    assert not orphan.exists()
    assert live.exists()
    assert all(path.exists() for path in unrelated)


def test_a_missing_parent_removes_nothing(tmp_path: Path) -> None:
    assert remove_orphaned_metrics_dirs(str(tmp_path / "absent")) == []
