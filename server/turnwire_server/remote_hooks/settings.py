"""The configuration of one remote hook server, a ``middleware: - remote: {...}`` entry
(:class:`RemoteHookSettings`; docs/semantics.md §4), with its failure modes, circuit breaker and
``on_chunk`` batching. :mod:`turnwire_server.config` places it in the middleware list."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from turnwire.hooks import HOOK_NAMES
from turnwire_server.config_section import ConfigSection

FailureMode = Literal["open", "closed"]
"""What a failed remote hook call does (docs/semantics.md §4): ``open`` behaves as if the hook
answered None; ``closed`` blocks the tool call (``before_tool_call``) or fails the turn."""

REMOTE_HOOKS = tuple(hook for hook in HOOK_NAMES if hook != "configure_session")
"""The hooks a remote server can implement (docs/semantics.md §3; ``on_chunk`` is ``OnChunks``)."""

DECIDING_HOOKS = ("before_turn", "before_step", "before_tool_call")
"""The remote hooks whose failure mode can be ``closed``; every other hook only observes."""

OBSERVING_HOOKS = tuple(hook for hook in REMOTE_HOOKS if hook not in DECIDING_HOOKS)


class RemoteTlsSettings(ConfigSection):
    """TLS to a remote hook server. ``ca_file``: PEM roots to trust (None: the system's);
    ``cert_file`` and ``key_file`` (both or neither): the sidecar's client certificate for
    mutual TLS; ``server_name``: the name the server's certificate must carry, when it differs
    from the address's host."""

    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    server_name: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _files(self) -> RemoteTlsSettings:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file go together (mutual TLS): give both or neither")
        for name in ("ca_file", "cert_file", "key_file"):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise ValueError(f"{name} {path} is not a readable file")
        return self


class FailureModes(ConfigSection):
    """Per-hook failure modes of a remote hook server. ``default`` applies to the deciding hooks
    not named here; the observing hooks always fail open (docs/semantics.md §4). A plain string
    (``failure_mode: closed``) sets ``default``."""

    default: FailureMode = "open"
    before_turn: FailureMode | None = None
    before_step: FailureMode | None = None
    before_tool_call: FailureMode | None = None

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"default": value}
        if isinstance(value, dict):
            observing = sorted(key for key in value if key in OBSERVING_HOOKS)
            if observing:
                raise ValueError(
                    f"{', '.join(observing)}: observing hooks always fail open (they never fail a "
                    f"turn); a failure mode is set only for {', '.join(DECIDING_HOOKS)} and default"
                )
        return value

    def of(self, hook: str) -> FailureMode:
        """The failure mode of ``hook`` (``open`` for every observing hook)."""
        if hook not in DECIDING_HOOKS:
            return "open"
        mode: FailureMode | None = getattr(self, hook)
        return self.default if mode is None else mode


class BreakerSettings(ConfigSection):
    """The circuit breaker of one remote hook server: after ``failure_threshold`` failed calls
    in a row (any hook) it opens, and for ``open_seconds`` every hook of that server gets its
    failure mode's outcome at once, without an RPC; then one call probes (half-open): success
    closes it, failure opens it again."""

    failure_threshold: int = Field(5, ge=1, le=1000)
    open_seconds: float = Field(10.0, gt=0, le=3600)


class ChunkBatchSettings(ConfigSection):
    """How a remote ``on_chunk`` is fed: one client-streaming ``OnChunks`` call per turn, a
    request per batch of at most ``max_events`` events or ``max_delay_ms`` after the batch's
    first event, whichever comes first; at most ``buffer_events`` wait to be sent (more are
    dropped and counted, so a slow hook server never slows a turn)."""

    max_events: int = Field(64, ge=1, le=10_000)
    max_delay_ms: float = Field(50.0, gt=0, le=10_000)
    buffer_events: int = Field(4096, ge=1, le=1_000_000)


class RemoteHookSettings(ConfigSection):
    """A remote hook server (``turnwire.v1.TurnHooksService``) as one entry of the chain.

    ``address`` is ``HOST:PORT`` (or any gRPC target such as ``unix:PATH``); ``name`` labels it
    in logs, timelines and ``HOOK_FAILED`` metadata (default ``remote:<address>``); ``tls``
    absent means plaintext; ``startup_timeout_seconds`` bounds connecting and asking
    ``GetHookSubscriptions`` at start (a server still starting is waited for; like a tool host's,
    ``tools/settings.py``); ``deadline_seconds`` bounds every other unary call (and the wait for
    an ``OnChunks`` call to close); ``include_messages`` overrides what the server's
    ``GetHookSubscriptions`` asked for (None: as asked); ``hooks`` is used when the server
    cannot be reached at start (None: start-up then fails); ``hook_session: false`` keeps a
    unary RPC per call even for a server that offers ``HookSession`` (for example behind a
    proxy without bidirectional streams; docs/semantics.md §4).
    """

    address: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1)
    tls: RemoteTlsSettings | None = None
    startup_timeout_seconds: float = Field(10.0, gt=0, le=600)
    deadline_seconds: float = Field(5.0, gt=0, le=600)
    failure_mode: FailureModes = Field(default_factory=FailureModes)
    include_messages: bool | None = None
    hook_session: bool = True
    hooks: list[str] | None = None
    breaker: BreakerSettings = Field(default_factory=BreakerSettings)
    chunks: ChunkBatchSettings = Field(default_factory=ChunkBatchSettings)

    @field_validator("hooks")
    @classmethod
    def _hook_names(cls, value: list[str] | None) -> list[str] | None:
        unknown = [name for name in value or () if name not in REMOTE_HOOKS]
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not a hook; hooks are {', '.join(REMOTE_HOOKS)}")
        return value

    @field_validator("address")
    @classmethod
    def _target(cls, value: str) -> str:
        if ":" not in value:
            raise ValueError("must be HOST:PORT (for example 127.0.0.1:7001) or unix:PATH")
        return value
