"""A test that hangs fails with its stack after the per-test timeout (pyproject.toml's
``timeout``, pytest-timeout) instead of holding the whole run until CI's limit: the sample was a
test awaiting a gRPC read that never came (stop 72)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

HANGING = """
import asyncio


async def test_awaits_forever() -> None:
    await asyncio.Event().wait()
"""


def test_a_hanging_async_test_fails_at_the_timeout(tmp_path: Path) -> None:
    test = tmp_path / "test_hangs.py"
    test.write_text(HANGING)
    config = ["-c", str(REPO / "pyproject.toml"), "--rootdir", str(tmp_path), "-o", "timeout=2"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *config, str(test)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Failed: Timeout (>2.0s) from pytest-timeout" in done.stdout
    assert "1 failed" in done.stdout
    assert "test_awaits_forever" in done.stdout


def test_every_test_has_a_timeout_well_within_cis_limit() -> None:
    options = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert 0 < int(options["timeout"]) <= 30 * 60  # CI stops at 90 min for the whole run
