"""Configuration: one YAML file plus ``TURNWIRE_*`` environment variables.

Precedence, highest first: command-line flags, environment variables
(``TURNWIRE_LISTEN``, nested fields with ``__``: ``TURNWIRE_LIMITS__MAX_STEPS``),
the YAML file (``--config``), the defaults below. With no file and no keys the
sidecar runs on SQLite in the working directory with the offline scripted model.
Validation errors name the field and what is wrong (:func:`load_settings`).
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import (
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    YamlConfigSettingsSource,
)

from turnwire.hooks import HOOK_NAMES
from turnwire_server.access_settings import AuthSettings, RateLimitSettings
from turnwire_server.config_hints import unknown_field_message
from turnwire_server.config_section import ConfigSection
from turnwire_server.engine.settings import (
    DurabilitySettings,
    EventsSettings,
    LimitsSettings,
    StoreCheckpointSettings,
)
from turnwire_server.event_loop import EventLoopChoice
from turnwire_server.providers.settings import (
    PROVIDER_TYPES,
    ProviderSettings,
    default_providers,
    entry_location,
)
from turnwire_server.redaction import secret
from turnwire_server.store.postgres_url import is_postgres_url
from turnwire_server.tools.settings import ToolsSettings


class StoreSettings(ConfigSection):
    """Where conversations live: ``sqlite:///PATH`` (relative to the working directory) or
    ``postgresql://user[:password]@host[:port]/database`` (also ``postgres://``).

    For PostgreSQL the password comes from the URL, else from the environment variable
    ``password_env`` names, else libpq's ``PGPASSWORD``; it is never logged or shown in an
    error. ``pool_size`` bounds the PostgreSQL store's connections (ignored by SQLite).
    """

    url: str = Field("sqlite:///turnwire.db", json_schema_extra=secret("url"))
    password_env: str | None = Field(
        None,
        min_length=1,
        description="environment variable holding the PostgreSQL password",
        json_schema_extra=secret("env"),
    )
    pool_size: int = Field(10, ge=1, le=1000, description="PostgreSQL connections the store holds at most")

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, value: str) -> str:
        if not value.startswith("sqlite:///") and not is_postgres_url(value):
            raise ValueError(
                "must be sqlite:///PATH (for example sqlite:///turnwire.db) or "
                "postgresql://user@host:port/database"
            )
        return value


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
    absent means plaintext; ``deadline_seconds`` bounds every unary call (and the wait for an
    ``OnChunks`` call to close); ``include_messages`` overrides what the server's
    ``GetHookSubscriptions`` asked for (None: as asked); ``hooks`` is used when the server
    cannot be reached at start (None: start-up then fails).
    """

    address: str = Field(min_length=1)
    name: str | None = Field(None, min_length=1)
    tls: RemoteTlsSettings | None = None
    deadline_seconds: float = Field(5.0, gt=0, le=600)
    failure_mode: FailureModes = Field(default_factory=FailureModes)
    include_messages: bool | None = None
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


class MiddlewareEntry(ConfigSection):
    """One middleware of the chain: either ``path`` (``package.module:Class``) with its
    ``options``, or ``remote`` (a hook server reached over gRPC, :class:`RemoteHookSettings`).
    A plain string entry (``- myapp.hooks:Audit``) is short for ``- path: myapp.hooks:Audit``,
    as ``tools.python`` entries are strings."""

    path: str | None = None
    # Free-form: values under secret-looking keys (api_key, token …) are masked in output.
    options: dict[str, Any] = Field(default_factory=dict, json_schema_extra=secret("keys"))
    remote: RemoteHookSettings | None = None

    @model_validator(mode="before")
    @classmethod
    def _plain_path(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {"path": value}
        if not isinstance(value, dict | MiddlewareEntry):
            raise ValueError(
                "each entry is `- path: package.module:Class` (with optional `options:`), "
                "`- remote: {target: HOST:PORT}`, or just the path as a string"
            )
        return value

    @field_validator("path")
    @classmethod
    def _dotted(cls, value: str | None) -> str | None:
        if value is not None and ":" not in value:
            raise ValueError("must be package.module:ClassName")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> MiddlewareEntry:
        if (self.path is None) == (self.remote is None):
            raise ValueError("give either path (an in-process middleware) or remote (a hook server)")
        if self.remote is not None and self.options:
            raise ValueError("options go with path; a remote entry is configured inside remote")
        return self


class MetricsSettings(ConfigSection):
    """The Prometheus endpoint (``GET /metrics`` in the text exposition format, on its own HTTP
    port). Off by default: the sidecar opens no port beyond its gRPC one unless asked, and which
    port a scraper may reach is the deployment's choice. 9464 is the port OpenTelemetry's
    Prometheus exporter uses by default."""

    enabled: bool = Field(False, description="serve /metrics on listen")
    listen: str = Field("127.0.0.1:9464", description="HOST:PORT of the metrics endpoint (HTTP)")

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return _host_port(value, "127.0.0.1:9464")


class LoggingSettings(ConfigSection):
    """Log output on stderr. ``level``: the least severity logged; ``format``: ``text`` lines or
    ``json`` (one object per line, with ``conversation_id``, ``request_id``, ``trace_id`` and
    ``span_id`` when known). Secrets are masked in both (docs/operate/logs.md)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


def _host_port(value: str, example: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"must be HOST:PORT, for example {example}")
    return value


class TracingSettings(ConfigSection):
    """OpenTelemetry traces, exported over OTLP/gRPC (off by default; docs/operate/traces.md).

    A span per turn, model call, tool call and hook call, by the GenAI semantic conventions
    (:mod:`turnwire_server.engine.tracing`). A field left unset falls back to the SDK's
    standard variable: ``endpoint`` to ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` /
    ``OTEL_EXPORTER_OTLP_ENDPOINT`` (else ``http://localhost:4317``), ``headers`` to
    ``OTEL_EXPORTER_OTLP_(TRACES_)HEADERS``, ``insecure`` to the endpoint's scheme (``http``:
    plaintext) or ``OTEL_EXPORTER_OTLP_(TRACES_)INSECURE``, ``ca_file`` to
    ``OTEL_EXPORTER_OTLP_(TRACES_)CERTIFICATE``, ``service_name`` to ``OTEL_SERVICE_NAME``
    (else ``turnwire``), ``sampler_ratio`` to ``OTEL_TRACES_SAMPLER`` (else every trace, or as
    the caller's ``traceparent`` decided). ``headers`` values are secrets: never logged or shown.
    ``capture_message_content`` records prompts, replies and tool inputs and outputs in spans
    (the conventions' opt-in attributes).
    """

    enabled: bool = False
    endpoint: str | None = Field(
        None, min_length=1, description="OTLP/gRPC collector, e.g. http://127.0.0.1:4317"
    )
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="sent with every export")
    insecure: bool | None = Field(None, description="plaintext gRPC to the collector")
    ca_file: Path | None = Field(
        None, description="PEM file of the CA that signed the collector's certificate"
    )
    service_name: str | None = Field(None, min_length=1, description="the service.name resource attribute")
    sampler_ratio: float | None = Field(
        None, ge=0, le=1, description="share of new traces recorded (parent-based: a caller's decision wins)"
    )
    capture_message_content: bool = Field(False, description="record message content in spans")

    @field_validator("ca_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"{value} is not a readable file")
        return value


ClientAuth = Literal["none", "require"]
"""Whether the server asks for a client certificate: ``none`` (plain TLS) or ``require`` (mutual
TLS: a certificate signed by ``tls.client_ca_file`` or no connection). grpcio's server credentials
offer only these two of gRPC core's modes (``require_client_auth``), so there is no ``request``."""


class ServerTlsSettings(ConfigSection):
    """TLS for the gRPC server (absent: plaintext). PEM files: ``cert_file`` the certificate chain
    (leaf first), ``key_file`` its unencrypted private key, ``client_ca_file`` the CAs whose client
    certificates ``client_auth: require`` accepts. The files are re-read when they change (checked
    at each new connection) and on SIGHUP; a bad replacement is logged and the old one kept.
    Their contents are checked at start (:mod:`turnwire_server.api.tls`)."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None = None
    client_auth: ClientAuth = Field("none", description="none: plain TLS; require: mutual TLS")

    @model_validator(mode="after")
    def _client_ca(self) -> ServerTlsSettings:
        if self.client_auth == "require" and self.client_ca_file is None:
            raise ValueError(
                "client_auth: require needs client_ca_file (the CA that signs client certificates)"
            )
        if self.client_auth == "none" and self.client_ca_file is not None:
            raise ValueError(
                "client_ca_file is used only with client_auth: require (mutual TLS); "
                "set that or drop the file"
            )
        return self


class Settings(BaseSettings):
    """Everything the sidecar reads at start."""

    model_config = SettingsConfigDict(env_prefix="TURNWIRE_", env_nested_delimiter="__", extra="forbid")
    _yaml_file: ClassVar[Path | None] = None

    listen: str = "127.0.0.1:50051"
    default_model: str = "scripted:demo"
    system_prompt: str = "You are a helpful assistant."
    log_level: Literal["debug", "info", "warning", "error"] | None = Field(
        None, description="deprecated: use logging.level (which wins when both are given)"
    )
    store: StoreSettings = Field(default_factory=StoreSettings)
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="processes serving the listen port (SO_REUSEPORT) under one supervisor; "
        "more than 1 needs the PostgreSQL store",
    )
    event_loop: EventLoopChoice = Field(
        "auto",
        description="the sidecar's event loop: auto (uvloop when it can be imported, else asyncio), "
        "uvloop (required) or asyncio",
    )
    providers: dict[str, ProviderSettings] = Field(default_factory=default_providers)
    tools: ToolsSettings = Field(default_factory=ToolsSettings)
    middleware: list[MiddlewareEntry] = Field(default_factory=list)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    events: EventsSettings = Field(default_factory=EventsSettings)
    checkpoint: StoreCheckpointSettings = Field(default_factory=StoreCheckpointSettings)
    durability: DurabilitySettings = Field(default_factory=DurabilitySettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    tls: ServerTlsSettings | None = None
    auth: AuthSettings = Field(default_factory=AuthSettings)
    rate_limits: RateLimitSettings = Field(default_factory=RateLimitSettings)

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return _host_port(value, "127.0.0.1:50051")

    @model_validator(mode="after")
    def _deprecated_log_level(self) -> Settings:
        # log_level (before logging.level existed) still sets the level, unless logging.level is given.
        if self.log_level is not None and "level" not in self.logging.model_fields_set:
            self.logging.level = self.log_level
        return self

    @field_validator("workers")
    @classmethod
    def _workers_share_a_store(cls, value: int, info: ValidationInfo) -> int:
        # The SQLite store is one process's file (its writer, its locks); several processes
        # share a store only as PostgreSQL replicas (docs/semantics.md §5).
        store = info.data.get("store")
        if value > 1 and store is not None and store.url.startswith("sqlite:"):
            raise ValueError(
                f"{value} worker processes need the PostgreSQL store; the SQLite store "
                f"({store.url}) is one process's file. Serve it with one worker (--workers 1), or "
                f"copy it with `turnwire migrate --from {store.url} --to postgresql://…` and serve that"
            )
        return value

    @field_validator("default_model")
    @classmethod
    def _model_id(cls, value: str) -> str:
        if ":" not in value:
            raise ValueError("must be provider:model, for example scripted:demo")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags, then environment, then the YAML file given to :func:`load_settings`."""
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if cls._yaml_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=cls._yaml_file))
        return tuple(sources)


class ConfigError(Exception):
    """The configuration is invalid; the message names each bad field and what is wrong."""


def _describe(error: ValidationError, origin: str) -> str:
    lines = [f"invalid configuration ({origin}):"]
    for item in error.errors():
        location = ".".join(str(part) for part in entry_location(item["loc"])) or "(top level)"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = unknown_field_message(Settings, item["loc"])
        elif item["type"] == "value_error":
            message = str(message).removeprefix("Value error, ")
        elif item["type"] in ("union_tag_invalid", "union_tag_not_found") and location.startswith(
            "providers."
        ):
            message = _provider_type_problem(item)
        lines.append(f"  {location}: {message}")
    return "\n".join(lines)


def _provider_type_problem(item: Any) -> str:
    """What to fix in a ``providers:`` entry whose ``type`` is missing or unknown."""
    known = sorted(PROVIDER_TYPES)
    tag = (item.get("ctx") or {}).get("tag")
    if tag is None:
        name = str(item["loc"][1]) if len(item["loc"]) > 1 else ""
        guess = name if name in PROVIDER_TYPES else "openai"
        return f"no `type:` given; add `type: {guess}` (one of {', '.join(known)})"
    close = difflib.get_close_matches(str(tag), known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"unknown type {tag!r}; {hint}use one of {', '.join(known)}"


def _top_level_problem(config_file: Path) -> str | None:
    """Why ``config_file`` cannot be a configuration before pydantic reads it, or None: the top level
    must be a mapping of sections (``listen:``, ``providers:``, ...)."""
    try:
        data = yaml.safe_load(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None  # reported with its own message when pydantic-settings reads the file
    if data is None or isinstance(data, dict):
        return None
    kinds: dict[type, str] = {list: "a list", str: "a single string"}
    kind = kinds.get(type(data), f"a {type(data).__name__}")
    return (
        f"{config_file}: the top level is {kind}; it must be a mapping of sections, "
        "e.g. `listen: 127.0.0.1:50051` and `providers:` on their own lines, not `- item` entries"
    )


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Read and validate the configuration.

    ``overrides`` (command-line flags) win over everything else. Raises
    :class:`ConfigError` when the file is missing or unreadable, or any field is
    invalid.
    """
    if config_file is not None and not config_file.is_file():
        raise ConfigError(f"config file {config_file} does not exist")
    if config_file is not None and (problem := _top_level_problem(config_file)) is not None:
        raise ConfigError(problem)
    Settings._yaml_file = config_file
    origin = "flags, TURNWIRE_* variables" + (f" and {config_file}" if config_file else "")
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as error:
        raise ConfigError(_describe(error, origin)) from None
    except SettingsError as error:
        # pydantic-settings: an environment value it could not parse (a list or mapping needs JSON).
        raise ConfigError(
            f"invalid configuration ({origin}): {error}; a list or mapping in a TURNWIRE_* variable "
            """is JSON, e.g. TURNWIRE_TOOLS__REQUIRE_APPROVAL='["get_current_time"]'"""
        ) from None
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read {config_file}: {error}") from None
    finally:
        Settings._yaml_file = None
