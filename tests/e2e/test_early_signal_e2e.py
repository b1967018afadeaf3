"""A SIGTERM that lands the moment ``turnwire serve`` says it is listening stops it cleanly (exit 0),
against a real process (a fresh-user trial: the signal handlers were installed after the
"listening" line and health SERVING, so a signal right then killed it outright, exit 143)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from support.sidecar import free_port, spawn_turnwire


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_right_after_the_listening_line_is_a_clean_stop(
    tmp_path: Path, signum: signal.Signals
) -> None:
    store = f"sqlite:///{tmp_path / 'early.db'}"
    process = await spawn_turnwire(
        "serve",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--store",
        store,
        env={"TURNWIRE_LIMITS__DRAIN_SECONDS": "0"},
    )
    assert process.stderr is not None
    seen: list[str] = []
    try:
        while True:
            line = (await asyncio.wait_for(process.stderr.readline(), timeout=60)).decode()
            assert line, f"serve exited before listening: {''.join(seen)}"
            seen.append(line)
            if "turnwire listening on" in line:
                process.send_signal(signum)  # at once: no wait for anything else
                break
        rest = (await asyncio.wait_for(process.stderr.read(), timeout=60)).decode()
        code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 0, "".join(seen) + rest
