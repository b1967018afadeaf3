"""Turn slots: how the engine reports a turn that runs without its caller, so it keeps counting.

A turn started by a call counts against its tenant's share of turn slots while that call is open
(the API layer's admission). A turn that runs on without a caller (disconnect policy CONTINUE, a
reader too slow for it, a submission, a recovery) would otherwise count nowhere, and one tenant
could run any number of them (docs/operate/authentication.md, "Tenants share the server"). So
the engine holds a slot of :class:`TurnSlots` for such a turn from the moment it has no caller
until it ends. The engine knows only this interface and conversation keys, never tenants: the
implementation (``api/admission.py``'s ``CallGate``) reads the tenant from the key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class TurnSlots(Protocol):
    """Counts the turns that run without a caller."""

    def hold_turn(self, conversation_id: str) -> Callable[[], None]:
        """Count one turn of ``conversation_id`` (a store key) running without its caller, now and
        whatever the share (it is running already). Returns the release, which the engine calls
        exactly once, when the turn ends. Never raises."""
        ...


def _release_nothing() -> None:
    return None


class Uncounted:
    """:class:`TurnSlots` that counts nothing (in-process engines, tests)."""

    def hold_turn(self, conversation_id: str) -> Callable[[], None]:
        """The no-op release (see :meth:`TurnSlots.hold_turn`)."""
        return _release_nothing


UNCOUNTED = Uncounted()
"""The :class:`TurnSlots` of an engine nobody limits."""
