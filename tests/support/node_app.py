"""The Node.js example app (``clients/node-example``) as a child process for end-to-end tests.

It runs ``tests/support/node_app.mjs`` (the example's hooks and tools plus test-only faults and a
``nested_chat`` tool) on a fixed port, so a test can kill it (SIGKILL) and start it again where
the sidecar expects it. Every hook and tool call it answers is appended to its journal
(JSON lines, written before the answer), which :meth:`NodeApp.journal` reads.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

from support.port_process import PortProcess
from support.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "tests" / "support" / "node_app.mjs"
NODE = shutil.which("node") or "node"


class NodeApp(PortProcess):
    """``node tests/support/node_app.mjs`` listening on ``127.0.0.1:port``; ``sidecar`` is the
    sidecar's target for the app's own calls (follow-up turns, ``nested_chat``)."""

    def __init__(self, workdir: Path, port: int, sidecar: str) -> None:
        super().__init__(port)
        self.workdir = workdir
        self.sidecar = sidecar
        self.journal_path = workdir / "node-app-journal.jsonl"
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> NodeApp:
        """Start the process and wait until it accepts connections."""
        self._spawn()
        await wait_until(self.listening, timeout=20, what=f"the Node app listening on {self.address}")
        return self

    def _spawn(self) -> None:
        # Popen returns once the child is forked; it does not wait for it.
        self.starts += 1
        command = [NODE, str(SCRIPT), "--listen", self.address, "--sidecar", self.sidecar]
        command += ["--journal", str(self.journal_path)]
        with (self.workdir / f"node-app-{self.starts}.log").open("wb") as log:
            self.process = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def start_blocking(self) -> NodeApp:
        """:meth:`start` for synchronous code (module-scoped fixtures), on a private event loop."""
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="node-app-start") as pool:
            return pool.submit(asyncio.run, self.start()).result()

    def exit_details(self) -> str:
        return f"{super().exit_details()}\n{self.log_text()}"

    def journal(self, request_id: str | None = None) -> list[dict[str, Any]]:
        """The calls recorded so far (those of turn ``request_id``, when given)."""
        if not self.journal_path.exists():
            return []
        entries = [json.loads(line) for line in self.journal_path.read_text().splitlines() if line]
        return [e for e in entries if request_id is None or e.get("requestId") == request_id]

    def rpcs(self, request_id: str) -> list[str]:
        """The RPC names of turn ``request_id``, in the order they arrived."""
        return [e["rpc"] for e in self.journal(request_id)]

    def log_text(self) -> str:
        path = self.workdir / f"node-app-{self.starts}.log"
        return path.read_text(errors="replace") if path.exists() else ""
