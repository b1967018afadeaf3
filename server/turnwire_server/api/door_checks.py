"""What an HTTP door checked already of the calls one HTTP request makes, so the interceptors do not
check it again.

A door (:mod:`turnwire_server.http`) reaches the RPCs in process, through the gRPC server's own
interceptors (:class:`~turnwire_server.http.calls.InProcessCalls`), often several calls per HTTP
request (a token check before the body, an idempotent retry's look-up, the turn). Two checks would
otherwise run more than once per request:

* **The bearer token.** :class:`~turnwire_server.api.access.AccessInterceptor` verifies it on the
  request's first call (``InProcessCalls.refusal`` before the body is read, or the first call of a
  request that reads no body) and records the caller here; the request's later calls with the same
  metadata use it (with JWT authentication a verification is a signature check). A call whose
  metadata is not the very tuple verified is verified afresh.
* **JSON nesting.** A door that bounded the nesting of its parsed JSON body
  (``openai_request.check_nesting``, every JSON value of its requests comes from that body, never
  wrapped deeper than it was there) sets :attr:`DoorChecks.json_depth`;
  :class:`~turnwire_server.api.admission.CallGate` then does not walk the request again. The
  Connect door decodes requests itself and never sets it.

The record travels on the in-process call's handler call details and servicer context as their
``door_checks`` attribute (:func:`door_checks`). A call over gRPC has neither, so every check runs
on it; nothing a client sends can set one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from turnwire_server.api.caller import Caller

__all__ = ["DoorChecks", "door_checks"]


class DoorChecks:
    """What was checked already of one HTTP request's in-process calls (see the module docstring).

    ``json_depth``: every JSON value of the request's messages comes from a body whose nesting the
    door bounded by :data:`~turnwire_server.api.json_depth.MAX_JSON_DEPTH`."""

    __slots__ = ("_caller", "_metadata", "json_depth")

    def __init__(self, *, json_depth: bool = False) -> None:
        self.json_depth = json_depth
        self._metadata: object = None
        self._caller: Caller | None = None

    def caller_for(self, metadata: Sequence[tuple[str, Any]]) -> Caller | None:
        """The caller ``metadata`` (the very tuple, not an equal one) was verified as; None when it
        was not."""
        return self._caller if metadata is self._metadata else None

    def verified(self, metadata: Sequence[tuple[str, Any]], caller: Caller) -> None:
        """Record that ``metadata``'s token was verified as ``caller``."""
        self._metadata, self._caller = metadata, caller


def door_checks(carrier: Any) -> DoorChecks | None:
    """The :class:`DoorChecks` of an in-process door call: ``carrier`` is its handler call details
    or its servicer context (or a wrapper of it that passes attributes through); None for a call
    over gRPC."""
    found = getattr(carrier, "door_checks", None)
    return found if isinstance(found, DoorChecks) else None
