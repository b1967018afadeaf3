"""What the sidecar is built from before it serves, and the checks of it: middlewares, providers,
access, TLS, tools, the session's configuration, the store, tracing and the engine's settings
(docs/configuration.md). Each raises :class:`StartupError` with a message that says what to fix;
:mod:`turnwire_server.app` assembles them and serves."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from turnwire.hooks import Middleware, SessionConfig, SessionContext
from turnwire.providers import Provider
from turnwire.testing import BUILTIN_SCRIPTS
from turnwire_server.api.access import HEALTH_SERVICE, REFLECTION_SERVICES, AccessInterceptor
from turnwire_server.api.authentication import AuthConfigError, Authenticator
from turnwire_server.api.rate_limits import RateLimits
from turnwire_server.api.tls import ServerTls, TlsFileError
from turnwire_server.config import MiddlewareEntry, Settings, StoreSettings
from turnwire_server.engine import EngineSettings
from turnwire_server.engine.cost import PriceBook
from turnwire_server.engine.fallback import Fallbacks
from turnwire_server.engine.store_outage import until_stored
from turnwire_server.engine.tracing import TRACING_OFF, Tracing
from turnwire_server.hooks.chain import MiddlewareChain, session_failure
from turnwire_server.importing import import_object
from turnwire_server.listen_check import ListenAddressError, check_listen_address
from turnwire_server.providers.registry import ProviderRegistry, UnknownModel
from turnwire_server.providers.settings import ProviderConfigError, ScriptedProviderSettings, build_provider
from turnwire_server.redaction import redactor_for
from turnwire_server.remote_hooks import RemoteMiddleware
from turnwire_server.store import Store, open_store, store_label
from turnwire_server.store.errors import StoreUnreachable
from turnwire_server.tools.demo import DEMO_TOOLS
from turnwire_server.tools.grpc_host import RemoteToolHost, ToolHostError
from turnwire_server.tools.loading import ToolLoadError, load_tools
from turnwire_server.tools.tool_set import ToolSet
from turnwire_server.webhooks import MissingSecret, Signers

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "Preflight",
    "StartupError",
    "StartupStopped",
    "build_access",
    "build_providers",
    "check_listen",
    "check_models",
    "configure_session",
    "engine_settings",
    "load_middlewares",
    "metric_models",
    "open_configured_store",
    "open_tls",
    "open_tools",
    "open_tracing",
    "preflight",
    "warn_of_demo_tools",
    "warn_of_sections_left_off",
]

log = logging.getLogger("turnwire.server")


class StartupError(Exception):
    """The sidecar cannot start; the message says what to fix."""


class StartupStopped(StartupError):
    """A stop signal (SIGTERM, SIGINT) ended the start while it waited for the store's database:
    nothing was served, and the process exits 0."""


def load_middlewares(entries: Sequence[MiddlewareEntry]) -> list[Middleware]:
    """Instantiate the configured middlewares in order: a ``path`` entry by importing its class,
    a ``remote`` entry as a :class:`RemoteMiddleware` (connected in ``configure_session``).
    Raises :class:`StartupError`."""
    middlewares: list[Middleware] = []
    for index, entry in enumerate(entries):
        if entry.remote is not None:
            middlewares.append(RemoteMiddleware(entry.remote))
            continue
        assert entry.path is not None  # MiddlewareEntry: exactly one of path and remote
        try:
            factory = import_object(entry.path)
        except (ModuleNotFoundError, AttributeError, ValueError) as error:
            # import_object's message already says what is missing and the close name, if any
            raise StartupError(f"middleware[{index}] {entry.path}: {error}") from error
        except Exception as error:  # the module itself raised while importing
            raise StartupError(
                f"middleware[{index}] {entry.path}: importing it raised {type(error).__name__}: {error}"
            ) from error
        try:
            middleware = factory(**entry.options)
        except Exception as error:
            raise StartupError(
                f"middleware[{index}] {entry.path}: {type(error).__name__}: {error}"
            ) from error
        if not isinstance(middleware, Middleware):
            raise StartupError(f"middleware[{index}] {entry.path} is not a turnwire.hooks.Middleware")
        middlewares.append(middleware)
    return middlewares


def build_providers(settings: Settings) -> ProviderRegistry:
    """The configured providers by name. Raises :class:`StartupError` listing every provider that
    cannot be built (all missing API keys at once, not the first only)."""
    providers: dict[str, Provider] = {}
    problems: list[str] = []
    for name, config in settings.providers.items():
        try:
            providers[name] = build_provider(name, config)
        except ProviderConfigError as error:
            problems.append(str(error))
    if len(problems) == 1:
        raise StartupError(problems[0])
    if problems:
        raise StartupError(
            "\n".join([f"{len(problems)} providers cannot start:", *(f"  {p}" for p in problems)])
        )
    return ProviderRegistry(providers)


def build_access(settings: Settings) -> AccessInterceptor | None:
    """The interceptor for ``auth:`` and ``rate_limits:``; None when both are off. Raises
    :class:`StartupError` for a token file, variable or key set that cannot be used."""
    auth, limits = settings.auth, settings.rate_limits
    if not auth.enabled and not limits.enabled:
        return None
    authenticator = None
    if auth.enabled:
        try:
            authenticator = Authenticator.from_settings(auth)
        except AuthConfigError as error:
            raise StartupError(str(error)) from error
    open_services: set[str] = set()
    if auth.open_health:
        open_services.add(HEALTH_SERVICE)
    if auth.open_reflection:
        open_services |= REFLECTION_SERVICES
    return AccessInterceptor(
        authenticator,
        RateLimits(limits) if limits.enabled else None,
        open_services=frozenset(open_services),
    )


def metric_models(settings: Settings, session: SessionConfig) -> frozenset[str]:
    """The model ids the configuration names (``default_model``, each scripted provider's scripts,
    each SDK provider's ``models`` allow-list, the compaction summary model, the ids
    ``pricing.models`` prices, those ``fallback.models`` names on either side, each sub-agent's
    ``model``): the ones the metrics label by name (``EngineSettings.metric_models``). A step a
    fallback ran is counted under the fallback's id, so leaving those out put a configured
    fallback's tokens and cost under ``<provider>:other``."""
    known = {settings.default_model}
    for name, entry in settings.providers.items():
        if isinstance(entry, ScriptedProviderSettings):
            models: Iterable[str] = (*BUILTIN_SCRIPTS, *entry.scripts)
        else:
            models = entry.models
        known.update(f"{name}:{model}" for model in models)
    known.update(settings.pricing.models)
    for primary, fallbacks in settings.fallback.models.items():
        known.update((primary, *fallbacks))
    known.update(agent.model for agent in settings.subagents if agent.model is not None)
    summary_model = getattr(session.compaction.strategy, "model", None) if session.compaction else None
    if isinstance(summary_model, str):
        known.add(summary_model)
    return frozenset(known)


def open_tls(settings: Settings) -> ServerTls | None:
    """The server's TLS credentials (None: plaintext), its files checked. Raises
    :class:`StartupError`."""
    if settings.tls is None:
        return None
    try:
        return ServerTls(settings.tls)
    except TlsFileError as error:
        raise StartupError(str(error)) from error


async def open_tools(settings: Settings) -> ToolSet:
    """The tool set: in-process tools, then tool hosts and MCP servers in config order, each
    listed once (concurrently) before serving (docs/semantics.md §2). A source that does not
    answer is logged and joins once it does; a ``tools.require_approval`` name that no source
    could list is an error only when every source answered. Raises :class:`StartupError`."""
    config = settings.tools
    try:
        local = load_tools(config.demo, config.python)
    except ToolLoadError as error:
        raise StartupError(f"tools: {error}") from error
    tool_set = ToolSet(local, config.require_approval)
    timeout = settings.limits.tool_timeout_seconds
    try:
        tool_set.sources.extend(
            RemoteToolHost(entry, default_timeout_seconds=timeout, on_change=tool_set.refresh)
            for entry in config.hosts
        )
    except ToolHostError as error:
        await tool_set.aclose()
        raise StartupError(f"tools.hosts: {error}") from error
    if config.mcp:
        # Imported only when configured: the MCP SDK costs about half a second of every start.
        from turnwire_server.tools.mcp_server import McpServer

        tool_set.sources.extend(
            McpServer(
                entry,
                default_timeout_seconds=timeout,
                max_result_bytes=settings.limits.max_tool_output_bytes,
                on_change=tool_set.refresh,
            )
            for entry in config.mcp
        )
    missing = await tool_set.start()
    unknown = [name for name in config.require_approval if name not in tool_set]
    if unknown and not missing:
        known = ", ".join(sorted(tool_set)) or "none"
        await tool_set.aclose()
        raise StartupError(
            f"tools: require_approval names {', '.join(map(repr, unknown))}, which is no loaded tool "
            f"(loaded: {known})"
        )
    if unknown:
        log.warning(
            "tools.require_approval names %s, not listed yet (%s not answering); it applies once listed",
            ", ".join(map(repr, unknown)),
            ", ".join(f"{source.kind} {source.name!r}" for source in missing),
        )
    return tool_set


OPT_IN_SECTIONS: dict[str, tuple[str, str, str]] = {
    "auth": ("enabled", "true", "false"),
    "metrics": ("enabled", "true", "false"),
    "tracing": ("enabled", "true", "false"),
    "http": ("listen", "HOST:PORT", "null"),
}
"""The sections that are off unless their switch is set, whatever else they set: section →
(switch field, the value that turns it on, the one that keeps it off)."""


def warn_of_sections_left_off(settings: Settings) -> None:
    """Warn of each section of :data:`OPT_IN_SECTIONS` that sets fields but leaves its switch
    unset, so stays off: ``auth: {tokens_file: …}`` alone ran every call unauthenticated, as the
    default tenant, ``metrics: {listen: …}`` served nothing and ``http: {inspector: true}`` served
    no page, all without a word (developer trial). A switch set to off is not warned of. Called
    once start-up succeeded."""
    for name, (switch, on, off) in OPT_IN_SECTIONS.items():
        section = getattr(settings, name)
        given = sorted(section.model_fields_set - {switch})
        if given and switch not in section.model_fields_set:
            log.warning(
                "%s is off: %s %s set but %s.%s is not; set %s.%s: %s to turn it on "
                "(or %s.%s: %s to keep it off without this warning)",
                name,
                ", ".join(f"{name}.{field}" for field in given),
                "is" if len(given) == 1 else "are",
                name,
                switch,
                name,
                switch,
                on,
                name,
                switch,
                off,
            )


def warn_of_demo_tools(settings: Settings) -> None:
    """Warn when the demo tools are on by default while the default model is a real one: their
    made-up data (get_weather) would reach it. An explicit ``tools.demo: true`` is not warned of.
    Called once start-up succeeded, never before a fatal start-up error."""
    if not settings.tools.demo or "demo" in settings.tools.model_fields_set:
        return
    provider = settings.providers.get(settings.default_model.partition(":")[0])
    if provider is None or isinstance(provider, ScriptedProviderSettings):
        return
    log.warning(
        "the demo tools (%s) are on and are offered to %s, a real model; set tools.demo: false to "
        "turn them off (or tools.demo: true to keep them without this warning)",
        ", ".join(tool.name for tool in DEMO_TOOLS),
        settings.default_model,
    )


@dataclass(frozen=True)
class Preflight:
    """What ``serve`` builds from the configuration before it opens anything (no port, store,
    tool or import of the operator's code): ``tls`` (the ``tls:`` files read), ``providers``
    (every provider built, their models checked: :func:`check_models`), ``access`` (the
    ``auth:`` tokens and key set, ``rate_limits:``), ``signers`` (the webhook signing secrets)."""

    tls: ServerTls | None
    providers: ProviderRegistry
    access: AccessInterceptor | None
    signers: Signers


async def preflight(settings: Settings) -> Preflight:
    """Every check ``serve`` makes before it opens anything, in its order, so a bad
    configuration touches no file and ``config show`` refuses what ``serve`` would: the ``tls:``
    files, the providers and models, the ``auth:`` and ``rate_limits:`` sections, the webhook
    signing secrets, the store URL and its password variable (parsed, not opened). Raises
    :class:`StartupError` with a message that says what to fix (the providers closed again)."""
    tls = open_tls(settings)
    providers = build_providers(settings)
    try:
        check_models(providers, settings)
        access = build_access(settings)
        try:
            signers = Signers(settings.webhooks)
        except MissingSecret as error:
            raise StartupError(str(error)) from None
        store = settings.store
        try:
            open_store(store.url, pool_size=store.pool_size, password_env=store.password_env)  # not opened
        except ValueError as error:
            raise StartupError(f"store.url: {error}") from error
    except BaseException:
        await providers.aclose()
        raise
    return Preflight(tls, providers, access, signers)


def check_models(providers: ProviderRegistry, settings: Settings) -> None:
    """:func:`_check_model` of ``default_model``, of every model ``fallback.models`` names and of
    every model ``pricing.models`` prices, and that each ``pricing.provider_ids`` key is a
    configured provider entry: a price under a misspelt id priced nothing, silently, and a dollar
    budget then refused the model as unpriced (developer trial).
    A ``default_model`` whose provider is not configured is also told to name a configured one
    (and, when it was left unset, that it is the embedded ``scripted:demo``)."""
    field = "default_model"
    if field not in settings.model_fields_set:
        field = f"default_model (not set, so the embedded {settings.default_model})"
    configured = sorted(providers.providers)
    other = ""
    if configured and settings.default_model.partition(":")[0] not in providers.providers:
        example = "scripted:demo" if "scripted" in configured else f"{configured[0]}:<model>"
        other = f"; or set default_model to a model of a configured provider (for example {example})"
    _check_model(providers, settings.default_model, field, other)
    for model, fallbacks in settings.fallback.models.items():
        for model_id in (model, *fallbacks):
            _check_model(providers, model_id, f"fallback.models[{model!r}]")
    for model_id in settings.pricing.models:
        _check_model(providers, model_id, f"pricing.models[{model_id!r}]", "; it would price nothing")
    for name in settings.pricing.provider_ids:
        if name not in providers.providers:
            raise StartupError(
                f"pricing.provider_ids[{name!r}]: no provider entry is named {name!r} (configured: "
                f"{configured}); key provider_ids by the entry's name under providers:"
            )


def _check_model(providers: ProviderRegistry, model: str, field: str, fix: str = "") -> None:
    """Raise :class:`StartupError` naming ``field`` (and ending with ``fix``) when no configured
    provider serves ``model``."""
    try:
        providers.resolve(model)
    except UnknownModel as error:
        raise StartupError(f"{field}: {error}{fix}") from error


async def configure_session(
    settings: Settings, chain: MiddlewareChain, providers: ProviderRegistry, tools: ToolSet
) -> SessionConfig:
    """The chain's ``configure_session`` answer (docs/semantics.md §3), its compaction summary
    model checked against the providers. Raises :class:`StartupError`."""
    try:
        session = await chain.configure_session(
            SessionContext(
                default_model=settings.default_model, system=settings.system_prompt, tools=dict(tools)
            )
        )
    except Exception as error:
        raise StartupError(session_failure(error)) from error
    summary_model = getattr(session.compaction.strategy, "model", None) if session.compaction else None
    if summary_model is not None:
        try:
            providers.resolve(summary_model)
        except UnknownModel as error:
            raise StartupError(
                f"compaction summary model: {error}; configure that provider under providers:, or set "
                "the summary model (ContextCompaction's summary_model) to a configured one "
                "(offline: scripted:summarizer)"
            ) from error
    return session


def check_listen(listen: str) -> None:
    """Raise :class:`StartupError` when ``listen`` cannot be bound (:func:`check_listen_address`)."""
    try:
        check_listen_address(listen)
    except ListenAddressError as error:
        raise StartupError(str(error)) from error


async def open_configured_store(
    config: StoreSettings,
    *,
    patience_seconds: float,
    replica_id: str,
    stop_requested: asyncio.Event | None = None,
) -> Store:
    """The configured store, opened (migrated, locked). While the database is unreachable
    (:class:`StoreUnreachable`: restarting, not yet up, cut off) the opening is retried with
    backoff for up to ``patience_seconds`` (``durability.store_outage_seconds``), as a turn's
    final write is (docs/operate/outages.md): a replica started during a database restart comes
    up once the database does. A refusal (no such database or role, a wrong password) fails at
    once. ``replica_id`` names its database sessions (this process's turns' owner).
    ``stop_requested`` set (a stop signal) ends the wait at once: :class:`StartupStopped`. Raises
    :class:`StartupError` naming no store address (:func:`store_label`)."""
    try:
        store = open_store(
            config.url, pool_size=config.pool_size, password_env=config.password_env, replica_id=replica_id
        )
    except ValueError as error:
        raise StartupError(f"store.url: {error}") from error
    try:
        await until_stored(
            store.open,
            patience_seconds=patience_seconds,
            what="opening the store",
            retry_on=StoreUnreachable,
            give_up=stop_requested,
        )
    except Exception as error:
        if stop_requested is not None and stop_requested.is_set():
            raise StartupStopped(
                f"stopped by a signal while waiting for the store ({store_label(config.url)}): {error}"
            ) from error
        raise StartupError(f"cannot open the store ({store_label(config.url)}): {error}") from error
    return store


def open_tracing(settings: Settings, replica_id: str = "") -> tuple[Tracing, TracerProvider | None]:
    """The engine's span starter and the SDK provider to shut down at stop, its spans'
    ``service.instance.id`` the process's ``replica_id``; tracing off (and no SDK imported)
    unless ``tracing.enabled``. Raises :class:`StartupError`."""
    if not settings.tracing.enabled:
        return TRACING_OFF, None
    # Imported only when on: the OpenTelemetry SDK and its exporter cost every start.
    from turnwire_server.trace_export import start_tracing

    try:
        return start_tracing(settings.tracing, replica_id)
    except OSError as error:
        raise StartupError(f"tracing.ca_file: {error}") from error


def engine_settings(settings: Settings, session: SessionConfig, replica_id: str) -> EngineSettings:
    """The engine's settings: its validated sections as they are, and what start-up decided."""
    return EngineSettings(
        replica_id=replica_id,
        default_model=settings.default_model,
        system_prompt=settings.system_prompt,
        limits=settings.limits,
        events=settings.events,
        checkpoint=settings.checkpoint,
        durability=settings.durability,
        compaction=session.compaction,
        metric_models=metric_models(settings, session),
        redact=redactor_for(settings).redact,
        prices=PriceBook(settings.pricing),
        fallbacks=Fallbacks(settings.fallback),
        budgets=settings.budgets,
    )
