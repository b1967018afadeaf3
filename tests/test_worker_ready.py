"""A worker of ``serve --workers N`` logs its replica id before it tells the supervisor it serves
(turnwire_server/worker.py ``announce_ready``): the supervisor's "N workers serving" line then
follows every worker's own line in the shared log, which is what readers of it (operators, the
workers e2e tests) count on."""

from __future__ import annotations

import logging
import os
import select

import pytest

from turnwire_server.worker import announce_ready


class _PipeAtEmit(logging.Handler):
    """Records, for each record, whether the pipe's read end had data when it was emitted."""

    def __init__(self, read_fd: int) -> None:
        super().__init__()
        self.read_fd = read_fd
        self.seen: list[tuple[str, bool]] = []

    def emit(self, record: logging.LogRecord) -> None:
        readable, _, _ = select.select([self.read_fd], [], [], 0)
        self.seen.append((record.getMessage(), bool(readable)))


def test_the_serving_line_is_logged_before_the_ready_byte(caplog: pytest.LogCaptureFixture) -> None:
    read_fd, write_fd = os.pipe()
    handler = _PipeAtEmit(read_fd)
    logger = logging.getLogger("turnwire.supervisor")
    logger.addHandler(handler)
    caplog.set_level(logging.INFO, logger="turnwire.supervisor")
    try:
        announce_ready(write_fd, 2, 3, "replica-abc")
        assert os.read(read_fd, 8) == b"r"
        assert os.read(read_fd, 8) == b"", "the write end was closed"
    finally:
        logger.removeHandler(handler)
        os.close(read_fd)
    assert handler.seen == [(f"worker 2 of 3 (pid {os.getpid()}) serving as replica replica-abc", False)]
