"""gRPC metadata keys of the Turnwire contract."""

from __future__ import annotations

PARENT_REQUEST_METADATA = "turnwire-parent-request-id"
"""The request id of the turn a call comes from (docs/semantics.md §5, nesting). The sidecar
sends it on every remote hook and tool host call; a hook or tool that calls back into the
sidecar forwards it, so a blocking turn on its own conversation is refused with
``FAILED_PRECONDITION`` instead of waiting forever for the turn that called it."""

EVENT_BATCHES_METADATA = "turnwire-event-batches"
"""A caller that sends ``turnwire-event-batches: 1`` on a turn-streaming call reads a response's
``more_events`` after its ``event``: the sidecar may then send the events that are ready at
once in one message (docs/semantics.md §10, "Event batches"). Without it, one event a message."""

AUTHORIZATION_METADATA = "authorization"
"""The bearer token of a call, ``Bearer <token>`` (RFC 6750 §2.1), when the sidecar's ``auth:``
is on."""
