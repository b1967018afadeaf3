"""The README's first command runs: ``turnwire demo`` starts a real sidecar on its embedded defaults,
holds a conversation that calls tools, prints the stored transcript and stops the sidecar cleanly.

Before: the demo started the sidecar as ``python -m server`` (the pre-rename module), which
exited at once, and the demo waited 30 s before failing with a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


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
    # Issue 39's "Done means": the plain demo names the way to see its turns as pictures.
    assert "inspector page: turnwire demo --inspect" in output


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


async def test_demo_inspect_without_a_built_page_says_how_to_build_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stop 46's gap: in a checkout whose page was never built, ``demo --inspect`` started a sidecar
    whose page answered 503. It now stops before starting anything and says what to run."""
    from turnwire_server.cli import demo
    from turnwire_server.http import inspector_door

    monkeypatch.setattr(inspector_door, "PAGE_DIR", tmp_path / "not-built")
    assert await demo.run_demo(tmp_path, inspect=True) == 2
    output = capsys.readouterr().out
    assert "the inspector page is not built" in output and "make build-inspector" in output
    assert not (tmp_path / "turnwire-demo.log").exists()  # no sidecar was started


async def test_a_demo_whose_store_is_held_names_the_way_to_run_it_elsewhere(tmp_path: Path) -> None:
    """A fresh user's trial (stop 48): ``make demo`` beside a running ``turnwire serve`` in the same
    folder failed with a hint at ``--workdir``, an option ``make demo`` did not pass on. The hint
    now gives both spellings, and ``make demo DEMO_ARGS=…`` passes them."""
    import asyncio

    from turnwire_server.store.sqlite import SqliteStore

    held = SqliteStore(tmp_path / "turnwire.db")  # what a running sidecar in this folder holds
    await held.open()
    try:
        returncode, output = await asyncio.to_thread(_demo, tmp_path)
    finally:
        await held.close()
    assert returncode == 1, output
    assert "is in use by another turnwire process" in output
    assert "turnwire demo --workdir DIR" in output
    assert "make demo DEMO_ARGS='--workdir DIR'" in output
    makefile = (Path(__file__).parents[2] / "Makefile").read_text()
    assert "turnwire demo $(DEMO_ARGS)" in makefile
