"""The README's first command runs: ``turnwire demo`` starts a real sidecar on its embedded defaults,
holds a conversation that calls tools, prints the stored transcript and stops the sidecar cleanly.

Before: the demo started the sidecar as ``python -m server`` (the pre-rename module), which
exited at once, and the demo waited 30 s before failing with a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_the_demo_calls_tools_and_stops_the_sidecar_cleanly(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "turnwire_server", "demo"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "→ get_weather" in output and "→ calculator" in output
    assert "= 294." in output  # (12 + 30) * 7, computed by the calculator tool
    assert "sidecar stopped cleanly" in output
    assert (tmp_path / "turnwire.db").exists()
