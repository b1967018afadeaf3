"""What a hook or tool call carries besides its request: :func:`call_info`, set for each call."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field

PARENT_REQUEST_METADATA = "turnwire-parent-request-id"
"""The metadata key of the turn's request id on every call the sidecar makes (docs/semantics.md §5)."""

TRACE_KEYS = ("traceparent", "tracestate")
"""The W3C trace context's keys."""


@dataclass(frozen=True, slots=True)
class CallInfo:
    """One call from the sidecar: its gRPC ``metadata`` (lowercase keys) and its W3C
    ``trace_context`` (``traceparent``, ``tracestate``; empty when the sidecar does not trace)."""

    metadata: Mapping[str, str] = field(default_factory=dict)
    trace_context: Mapping[str, str] = field(default_factory=dict)

    @property
    def parent_request_id(self) -> str:
        """The turn's request id: forward it as ``turnwire-parent-request-id`` when calling back
        into the sidecar, so the nesting rule applies (docs/semantics.md §5)."""
        return self.metadata.get(PARENT_REQUEST_METADATA, "")


_CURRENT: ContextVar[CallInfo] = ContextVar("turnwire_kit_call")


def call_info() -> CallInfo:
    """The call the running hook or tool serves. To continue the turn's trace with OpenTelemetry:
    ``opentelemetry.propagate.extract(call_info().trace_context)``.

    Raises :class:`LookupError` outside a hook or tool call of the kit.
    """
    return _CURRENT.get()


def metadata_of(pairs: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """gRPC invocation metadata as a dict (binary values decoded as UTF-8, replacing errors)."""
    return {
        key: value if isinstance(value, str) else value.decode(errors="replace") for key, value in pairs or ()
    }


def enter(metadata: Mapping[str, str], trace_context: Mapping[str, str] | None = None) -> None:
    """Make :func:`call_info` answer for the current task: ``trace_context`` given (HookSession's
    per-call context), or taken from ``metadata`` (unary RPCs, tool calls)."""
    if trace_context is None:
        trace_context = {key: metadata[key] for key in TRACE_KEYS if key in metadata}
    _CURRENT.set(CallInfo(metadata, trace_context))
