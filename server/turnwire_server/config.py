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

from turnwire_server.access_settings import AuthSettings, RateLimitSettings, TenantShareSettings
from turnwire_server.api.tls_settings import ServerTlsSettings
from turnwire_server.cache_budget import DEFAULT_CACHE_BYTES
from turnwire_server.config_hints import unknown_field_message
from turnwire_server.config_section import ConfigSection
from turnwire_server.engine.budget_settings import BudgetLimit, BudgetSettings
from turnwire_server.engine.cost_settings import PricingSettings
from turnwire_server.engine.fallback import FallbackSettings
from turnwire_server.engine.schedule_settings import ScheduleSettings
from turnwire_server.engine.settings import (
    DurabilitySettings,
    EventsSettings,
    LimitsSettings,
    StoreCheckpointSettings,
)
from turnwire_server.event_loop import EventLoopChoice
from turnwire_server.http.settings import HttpSettings
from turnwire_server.listen_check import host_port
from turnwire_server.providers.settings import (
    PROVIDER_TYPES,
    ProviderSettings,
    default_providers,
    entry_location,
)
from turnwire_server.redaction import secret
from turnwire_server.remote_hooks.settings import RemoteHookSettings
from turnwire_server.store.postgres_url import is_postgres_url
from turnwire_server.store.sqlite_location import SQLITE_PREFIX, url_missing_directory
from turnwire_server.tools.settings import ToolsSettings
from turnwire_server.tracing_settings import TracingSettings
from turnwire_server.webhooks.settings import WebhookSettings


class StoreSettings(ConfigSection):
    """Where conversations live: ``sqlite:///PATH`` (relative to the working directory) or
    ``postgresql://user[:password]@host[:port]/database`` (also ``postgres://``).

    An SQLite path's directory must exist (the store creates its file, never a directory: a
    mistyped path is refused, not served as a new empty store; :mod:`.store.sqlite_location`).

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
        if not value.startswith(SQLITE_PREFIX) and not is_postgres_url(value):
            raise ValueError(
                "must be sqlite:///PATH (for example sqlite:///turnwire.db) or "
                "postgresql://user@host:port/database"
            )
        if (missing := url_missing_directory(value)) is not None:
            raise ValueError(missing)
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


class SubagentSettings(ConfigSection):
    """One sub-agent (docs/subagents.md): offered to the model as the tool ``name``
    (``description`` tells the model when to call it), it runs a child turn on ``model``
    (``provider:model``; default: the calling turn's) with ``system_prompt`` (default: the
    top-level one), the ``tools`` it may call by name (server tools and other sub-agents), its
    own ``middleware`` chain (entries as in the top-level ``middleware:``), at most ``max_steps``
    model steps (default: ``limits.max_steps``), and, with ``output`` (a JSON Schema object), a
    structured answer that is the call's result as JSON. ``detached``: a call returns a handle at
    once, the child runs on, and its answer is submitted to the calling conversation."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$", description="the tool name the model calls it by")
    description: str = Field(min_length=1, description="what it does, for the model")
    model: str | None = Field(None, description="provider:model (default: the calling turn's)")
    system_prompt: str | None = Field(None, description="its system prompt (default: system_prompt)")
    tools: list[str] = Field(default_factory=list, description="the tools and sub-agents it may call")
    middleware: list[MiddlewareEntry] = Field(default_factory=list)
    max_steps: int | None = Field(None, ge=1, le=1000)
    output: dict[str, Any] | None = Field(None, description="a JSON Schema its answer follows")
    detached: bool = Field(
        False, description="a call returns a handle at once; the answer comes as a submission"
    )

    @field_validator("model")
    @classmethod
    def _model_id(cls, value: str | None) -> str | None:
        return value if value is None else _model_id(value)


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
        return host_port(value, "127.0.0.1:9464")


class MemorySettings(ConfigSection):
    """What the process may hold in memory by its own count. ``cache_bytes``: one budget, in
    bytes, shared by every cache that grows with conversations (the store's decoded messages, the
    provider adapters' conversions, prefix states and JSON bodies, the open-call searches), least
    recently used out first (``turnwire_server.cache_budget``; docs/limits.md, "Memory"). Per
    process: ``serve --workers N`` holds N budgets. 0 keeps nothing (every turn reads and converts
    its whole history)."""

    cache_bytes: int = Field(
        DEFAULT_CACHE_BYTES,
        ge=0,
        description="bytes the caches of conversations may hold together in one process",
    )


class LoggingSettings(ConfigSection):
    """Log output on stderr. ``level``: the least severity logged; ``format``: ``text`` lines or
    ``json`` (one object per line, with ``conversation_id``, ``request_id``, ``trace_id`` and
    ``span_id`` when known). Secrets are masked in both (docs/operate/logs.md)."""

    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["text", "json"] = "text"


def _model_id(value: str) -> str:
    """``value`` when it is a model id (``provider:model``); raises :class:`ValueError`."""
    if ":" not in value:
        raise ValueError("must be provider:model, for example scripted:demo")
    return value


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
    subagents: list[SubagentSettings] = Field(default_factory=list)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    pricing: PricingSettings = Field(default_factory=PricingSettings)
    fallback: FallbackSettings = Field(default_factory=FallbackSettings)
    budgets: BudgetSettings = Field(default_factory=BudgetSettings)
    events: EventsSettings = Field(default_factory=EventsSettings)
    checkpoint: StoreCheckpointSettings = Field(default_factory=StoreCheckpointSettings)
    durability: DurabilitySettings = Field(default_factory=DurabilitySettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    memory: MemorySettings = Field(default_factory=MemorySettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    tls: ServerTlsSettings | None = None
    auth: AuthSettings = Field(default_factory=AuthSettings)
    rate_limits: RateLimitSettings = Field(default_factory=RateLimitSettings)
    tenant_shares: TenantShareSettings = Field(default_factory=TenantShareSettings)
    schedules: ScheduleSettings = Field(default_factory=ScheduleSettings)
    webhooks: WebhookSettings = Field(default_factory=WebhookSettings)

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str) -> str:
        return host_port(value, "127.0.0.1:50051")

    @field_validator("subagents")
    @classmethod
    def _distinct_subagents(cls, value: list[SubagentSettings]) -> list[SubagentSettings]:
        names = [entry.name for entry in value]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(f"sub-agent names must differ; {', '.join(map(repr, twice))} is given twice")
        return value

    @model_validator(mode="after")
    def _deprecated_log_level(self) -> Settings:
        # log_level (before logging.level existed) still sets the level, unless logging.level is given.
        if self.log_level is not None and "level" not in self.logging.model_fields_set:
            self.logging.level = self.log_level
        return self

    @field_validator("budgets")
    @classmethod
    def _dollar_budgets_need_prices(cls, value: BudgetSettings, info: ValidationInfo) -> BudgetSettings:
        # pricing.enabled: false makes every cost unknown, and a step of unknown cost is refused
        # under a dollar budget: every turn ended BUDGET_EXHAUSTED, told to price its model under
        # pricing.models, which pricing.enabled: false ignores (developer trial).
        pricing = info.data.get("pricing")
        if pricing is None or pricing.enabled:
            return value
        scopes: list[tuple[str, BudgetLimit]] = [("turn", value.turn), ("conversation", value.conversation)]
        for name, periods in (("tenant", value.tenant), ("principal", value.principal)):
            scopes += [(f"{name}.day", periods.day), (f"{name}.month", periods.month)]
        dollars = [f"budgets.{scope}.usd" for scope, limit in scopes if limit.usd is not None]
        if dollars:
            raise ValueError(
                f"{', '.join(dollars)} {'limits' if len(dollars) == 1 else 'limit'} US dollars, but "
                "pricing.enabled is false, so no step has a price and every turn would end "
                "BUDGET_EXHAUSTED; turn pricing on, or limit tokens instead"
            )
        return value

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
        return _model_id(value)

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
