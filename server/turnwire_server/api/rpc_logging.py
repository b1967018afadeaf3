"""Logging of per-call events a client controls: one short line each, never a traceback.

A malformed request, a client that goes away mid-call and a call refused for
overload are things any client can cause as often as it likes. Logged the way
gRPC logs them by default (an ERROR with a full traceback per call), a flood of
them turns into a flood of log output. The rules here:

* **Client cancellations** (cancel, deadline, dropped connection) are routine:
  DEBUG, one line per call.
* **Malformed requests** (bytes that do not decode as the method's request
  message) point at a broken or hostile client, which an operator wants to hear
  about, but not once per request: WARNING at most once per
  :data:`REPORT_INTERVAL_SECONDS` per kind, saying how many more there were since
  the last report; every single one at DEBUG.
* **Overload refusals** follow the same throttled-WARNING rule.

:func:`quiet_grpc_call_noise` applies the first two rules to what gRPC itself
logs (``grpc._cython.cygrpc``); the interceptor in
:mod:`turnwire_server.api.admission` answers malformed requests before gRPC
would log them at all, so the filter is the net for what gets past it.
Exceptions raised by a servicer for any other reason keep their traceback: that
is a bug to debug, not client noise.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from google.protobuf.message import DecodeError

GRPC_LOGGER = "grpc._cython.cygrpc"
"""The logger gRPC's asyncio server logs servicer exceptions on."""

REPORT_INTERVAL_SECONDS = 10.0
"""The least time between two WARNING lines about one kind of client-caused event."""

_MAX_DETAIL_CHARS = 200

log = logging.getLogger("turnwire.api")


def short(text: object) -> str:
    """``text`` on one line, at most 200 characters (an error message a client may have shaped)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= _MAX_DETAIL_CHARS else flat[: _MAX_DETAIL_CHARS - 1] + "…"


class Throttled:
    """Report one kind of event at ``level`` at most once per ``interval`` seconds.

    Every event is logged at DEBUG; at most one per ``interval`` is logged at
    ``level`` instead, with how many were only logged at DEBUG since the last
    report. Either way an event makes one line.
    """

    def __init__(
        self,
        logger: logging.Logger,
        level: int = logging.WARNING,
        interval: float = REPORT_INTERVAL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.level = level
        self.interval = interval
        self.clock = clock
        self._next_report = float("-inf")
        self._folded = 0

    def event(self, message: str, *args: object) -> None:
        """Log one event (``message % args``, one line)."""
        now = self.clock()
        if now < self._next_report:
            self._folded += 1
            self.logger.debug(message, *args)
            return
        self._next_report = now + self.interval
        if self._folded:
            message += " (and %d more like it since the last report, logged at DEBUG)"
            args = (*args, self._folded)
            self._folded = 0
        self.logger.log(self.level, message, *args)


malformed_requests = Throttled(log)
"""Reports requests that do not decode (see the module docstring)."""


def client_gone_types() -> tuple[type[BaseException], ...]:
    """The exceptions a servicer sees when its client went away (cancel, deadline, dropped
    connection): ``asyncio.CancelledError`` and gRPC's ``ExecuteBatchError``."""
    # ExecuteBatchError: a write or the final status failed because the peer went away
    # (gRPC logs it with a traceback when its own cancellation notice has not arrived yet).
    from grpc._cython import cygrpc

    found: list[type[BaseException]] = [asyncio.CancelledError]
    error = getattr(cygrpc, "ExecuteBatchError", None)
    if isinstance(error, type) and issubclass(error, BaseException):
        found.append(error)
    return tuple(found)


class _GrpcCallNoise(logging.Filter):
    """Turns gRPC's per-call tracebacks for client-caused events into one line (see the module)."""

    def __init__(self) -> None:
        super().__init__()
        self.client_gone = client_gone_types()

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if error is None:
            return True
        if isinstance(error, DecodeError):
            message = f"malformed request: {short(record.getMessage())}: {short(error)}"
            record.exc_info = record.exc_text = None
            malformed_requests.event("%s", message)
            return False
        if isinstance(error, self.client_gone):
            if not record.name or not logging.getLogger(record.name).isEnabledFor(logging.DEBUG):
                return False
            record.msg = "%s (%s: the client went away)"
            record.args = (short(record.getMessage()), type(error).__name__)
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            record.exc_info = record.exc_text = None
        return True


def quiet_grpc_call_noise() -> None:
    """Install the filter on gRPC's server logger (once; later calls do nothing)."""
    logger = logging.getLogger(GRPC_LOGGER)
    if not any(isinstance(f, _GrpcCallNoise) for f in logger.filters):
        logger.addFilter(_GrpcCallNoise())


__all__ = [
    "GRPC_LOGGER",
    "REPORT_INTERVAL_SECONDS",
    "Throttled",
    "client_gone_types",
    "malformed_requests",
    "quiet_grpc_call_noise",
    "short",
]
