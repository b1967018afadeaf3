"""Running a conformance runner (the client suite's or the kit suite's) as a process, the way
`make conformance` does, for the tests that check it reports failures."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_suite(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``argv`` from the repository root with ``env`` added to this process's environment
    (5 minutes at most); its exit code and its stdout and stderr together."""
    result = subprocess.run(
        argv, cwd=REPO, env={**os.environ, **env}, capture_output=True, text=True, timeout=300, check=False
    )
    return result.returncode, result.stdout + result.stderr
