"""A child process that serves on a fixed port of 127.0.0.1, so a test can kill it (SIGKILL,
as a crash would) and start it again where its client expects it."""

from __future__ import annotations

import socket
import subprocess


class PortProcess:
    """The process behind ``127.0.0.1:port``; subclasses spawn it into :attr:`process`."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def listening(self) -> bool:
        """True once the port accepts connections; raises if the process exited."""
        if not self.running:
            raise AssertionError(f"{type(self).__name__} exited: {self.exit_details()}")
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def exit_details(self) -> str:
        """What to show when the process exited unexpectedly (its log, in subclasses)."""
        return "" if self.process is None else f"code {self.process.returncode}"

    def kill(self) -> None:
        """SIGKILL and reap, if it runs."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
