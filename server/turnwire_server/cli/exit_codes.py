"""The ``turnwire`` command's exit codes, the same for every command that talks to a sidecar."""

from __future__ import annotations

__all__ = ["EXIT_CALL_FAILED", "EXIT_OK", "EXIT_TURN_FAILED", "EXIT_UNREACHABLE"]

EXIT_OK = 0
"""Exit code: the turn completed (``run_chat``) or the history was printed."""
EXIT_TURN_FAILED = 1
"""Exit code: the turn ended other than COMPLETED (ERROR, ABORTED, INTERRUPTED, SKIPPED)."""
EXIT_CALL_FAILED = 2
"""Exit code: the sidecar rejected the call (bad input, not found, overloaded, ...)."""
EXIT_UNREACHABLE = 3
"""Exit code: the sidecar could not be reached."""
