"""The README's first command runs: ``turnwire demo`` starts a real sidecar on its embedded defaults,
holds a conversation that calls tools, prints the stored transcript and stops the sidecar cleanly.

Before: the demo started the sidecar as ``python -m server`` (the pre-rename module), which
exited at once, and the demo waited 30 s before failing with a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def _demo(tmp_path: Path, *flags: str) -> tuple[int, str]:
    """Run ``turnwire demo FLAGS`` in ``tmp_path``: its exit code and output."""
    result = subprocess.run(
        [sys.executable, "-m", "turnwire_server", "demo", *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return result.returncode, result.stdout + result.stderr


def test_the_demo_calls_tools_and_stops_the_sidecar_cleanly(tmp_path: Path) -> None:
    returncode, output = _demo(tmp_path)
    assert returncode == 0, output
    assert "→ get_weather" in output and "→ calculator" in output
    assert "= 294." in output  # (12 + 30) * 7, computed by the calculator tool
    assert "sidecar stopped cleanly" in output
    assert (tmp_path / "turnwire.db").exists()


def test_the_overflow_demo_recovers_a_turn_that_outgrew_the_window(tmp_path: Path) -> None:
    """``turnwire demo --overflow`` (docs/context-overflow.md's demo): the scripted model's
    small window overflows on a later turn, which is compacted and run again; every turn
    completes and the stored transcript keeps every message."""
    returncode, output = _demo(tmp_path, "--overflow")
    assert returncode == 0, output
    assert "(context compacted, reactive, summarize:" in output
    assert "(attempt 2 after context overflow: starting the reply over)" in output
    assert output.count("COMPLETED ·") == 5 and "ERROR" not in output
    assert "10 messages" in output  # five questions, five replies: nothing lost, no partial kept
    assert (tmp_path / "turnwire-overflow-demo.db").exists()


def test_the_demo_listens_where_asked(tmp_path: Path) -> None:
    """Trial 3: ``turnwire demo`` had no ``--listen``; a port in use (or one to reach from
    elsewhere) could not be chosen."""
    from turnwire_server.cli.demo import free_port

    listen = f"127.0.0.1:{free_port()}"
    returncode, output = _demo(tmp_path, "--listen", listen)
    assert returncode == 0, output
    assert f"starting turnwire serve --listen {listen}" in output
    assert "sidecar stopped cleanly" in output
