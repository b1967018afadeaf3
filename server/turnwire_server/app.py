"""Assemble and run the sidecar: store, providers, tools, middleware, engine, gRPC server.

This module, :mod:`turnwire_server.assembly` (what the sidecar is built from) and
:mod:`turnwire_server.background` (what runs beside its RPCs) are the only places that name
concrete implementations; the engine sees interfaces. ``serve`` runs until SIGTERM or SIGINT,
then shuts down gracefully: health goes NOT_SERVING (overall and for ChatService; the liveness
status, :data:`~turnwire_server.api.standard_services.LIVENESS`, stays SERVING) while calls are
still taken for ``limits.drain_seconds`` (the drain window: readiness probes and load balancers
move traffic away first; a second SIGTERM/SIGINT ends it), then no new calls are accepted,
running turns get ``limits.shutdown_grace_seconds`` to finish, the rest are cancelled and store
their partial replies; once every ChatService call has ended, the streams that never end on their
own (health ``Watch``, reflection) are cancelled, the connections are closed within what is left
of the stop's deadline (:mod:`turnwire_server.closing`), and the process exits 0. SIGHUP re-reads
the ``tls:`` files (:mod:`turnwire_server.api.tls`) and the ``auth:`` token sources
(:mod:`turnwire_server.api.authentication`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from turnwire_client.v1 import chat_service_pb2, chat_service_pb2_grpc
from turnwire_server.api.access import AccessInterceptor
from turnwire_server.api.admission import CallGate
from turnwire_server.api.authentication import Authenticator
from turnwire_server.api.chat_service import ChatService
from turnwire_server.api.rpc_logging import quiet_grpc_call_noise
from turnwire_server.api.rpc_observer import RpcObserver
from turnwire_server.api.standard_services import LIVENESS, add_standard_services
from turnwire_server.api.status import status_of
from turnwire_server.api.tls import ServerTls
from turnwire_server.assembly import (
    Preflight,
    StartupError,
    check_listen,
    configure_session,
    engine_settings,
    load_middlewares,
    open_configured_store,
    open_tools,
    open_tracing,
    preflight,
    warn_of_demo_tools,
    warn_of_sections_left_off,
)
from turnwire_server.background import (
    build_scheduler,
    deliver_detached_answers,
    recover_turns,
    start_maintenance,
    start_webhooks,
    sweep_detached_answers,
)
from turnwire_server.cache_budget import CACHES
from turnwire_server.closing import close_within
from turnwire_server.collector import tune_collector
from turnwire_server.config import Settings
from turnwire_server.engine import TurnEngine
from turnwire_server.engine.detached_subagents import DetachedResults
from turnwire_server.engine.maintenance import Maintenance
from turnwire_server.engine.replica import Replica
from turnwire_server.engine.schedules import Scheduler
from turnwire_server.engine.settings import new_replica_id
from turnwire_server.engine.submissions import Submissions
from turnwire_server.event_loop import running_loop_name
from turnwire_server.hooks.chain import MiddlewareChain
from turnwire_server.http.calls import InProcessCalls, MethodTable
from turnwire_server.http.doors import DoorContext
from turnwire_server.http.server import HttpListener, HttpListenError, start_http
from turnwire_server.log_context import name_replica
from turnwire_server.metrics_endpoint import MetricsEndpoint, start_metrics_endpoint
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.remote_hooks import RemoteMiddleware
from turnwire_server.store import Store, store_label
from turnwire_server.store_health import StoreHealth
from turnwire_server.subagent_loading import SubagentConfigError, build_subagents
from turnwire_server.tools.tool_set import ToolSet
from turnwire_server.webhooks import WebhookOutbox

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


log = logging.getLogger("turnwire.server")


_TURN_END_MARGIN_SECONDS = 5.0

_UNBOUNDED = 2**31 - 1

SERVICE_NAME = chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"].full_name


@dataclass(kw_only=True)
class Sidecar:
    """A started sidecar: its gRPC server, engine and what it runs with. Use :func:`start`.

    The providers and the remote hook servers are the engine's (:attr:`providers`,
    :attr:`remote_hooks`); ``store`` is the engine's store, kept here as its :class:`Store` to
    close it; ``tools`` is the live tool set the engine reads, kept here as its :class:`ToolSet`
    to close it."""

    server: grpc.aio.Server
    engine: TurnEngine
    store: Store
    tools: ToolSet
    health: health_aio.HealthServicer
    port: int
    settings: Settings
    gate: CallGate
    maintenance: Maintenance
    replica: Replica
    scheduler: Scheduler | None = None
    store_health: StoreHealth | None = None
    metrics_endpoint: MetricsEndpoint | None = None
    tracer_provider: TracerProvider | None = None
    tls: ServerTls | None = None
    authenticator: Authenticator | None = None
    http: HttpListener | None = None
    webhooks: WebhookOutbox | None = None

    @property
    def providers(self) -> ProviderRegistry:
        """The engine's providers."""
        return self.engine.providers

    @property
    def remote_hooks(self) -> list[RemoteMiddleware]:
        """The chain's remote hook servers, closed at :meth:`stop`."""
        return [m for m in self.engine.chain.middlewares if isinstance(m, RemoteMiddleware)]

    def reload(self) -> None:
        """SIGHUP: re-read the ``tls:`` files (:meth:`ServerTls.reload`) and the ``auth:`` token
        sources (:meth:`Authenticator.reload`) now; a file that does not load is logged and the
        one in use kept."""
        if self.tls is not None:
            self.tls.reload()
        if self.http is not None:
            self.http.reload()
        if self.authenticator is not None:
            self.authenticator.reload()

    async def drain_window(self, cut_short: asyncio.Event) -> None:
        """The drain window before :meth:`stop` (see the module docstring): health reports
        NOT_SERVING, overall and for each service, while calls are still taken, for
        ``limits.drain_seconds`` or until ``cut_short`` is set. Kubernetes' readiness and load
        balancers act on the health service; a replica that stopped taking calls at once would
        refuse the calls sent before they noticed."""
        if self.store_health is not None:
            await self.store_health.stop()  # draining owns the health status from here
        seconds = self.settings.limits.drain_seconds
        if seconds <= 0 or cut_short.is_set():
            return
        for service in ("", SERVICE_NAME):
            await self.health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        log.info(
            "draining: health is NOT_SERVING; still taking calls for %.1f s (a second SIGTERM or "
            "SIGINT ends this now)",
            seconds,
        )
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await cut_short.wait()

    async def stop(self, cut_short: asyncio.Event | None = None) -> None:
        """Graceful stop (see the module docstring). The maintenance loop stops first, so no
        sweep deletes or expires anything while turns drain. ``cut_short`` set (a signal during
        the grace) cancels the running turns at once instead of at the end of the grace."""
        await self.maintenance.stop()
        if self.scheduler is not None:  # no fire is made while turns drain: the next replica makes it
            await self.scheduler.stop()
        if self.store_health is not None:
            await self.store_health.stop()
        grace = self.settings.limits.shutdown_grace_seconds
        # What a supervisor waits after the drain window (docs/operate/stopping.md): the closes
        # at the end get what is left of it, so no other process can hold the exit.
        deadline = asyncio.get_running_loop().time() + grace + _TURN_END_MARGIN_SECONDS
        # A person at a terminal waits on this line: say how not to wait, when a signal can do it.
        hint = "" if cut_short is None else " (a second SIGINT/Ctrl-C or SIGTERM cancels them now)"
        log.info("shutting down: running turns have %.1f s to finish%s", grace, hint)
        await self.health.enter_graceful_shutdown()
        # gRPC takes no new call from here on. Its grace is only the backstop: it
        # gets a little longer than the engine so that turns cancelled at the end
        # of the grace period can still send their TurnEnd(ABORTED).
        stopping = asyncio.ensure_future(self.server.stop(grace + _TURN_END_MARGIN_SECONDS))
        if self.http is not None:
            self.http.stop_accepting()  # open HTTP calls go on, as gRPC's do
        try:
            # The engine's drain waits for the turn tasks themselves: they store
            # partial replies even after gRPC has cancelled their calls.
            await self.engine.drain(grace, cut_short)
            # Every turn has ended; its call may still be sending its last events.
            if not await self.gate.wait_idle(_TURN_END_MARGIN_SECONDS):
                log.warning(
                    "shutdown: %d ChatService call(s) still open %.1f s after the turns ended",
                    self.gate.tracked_calls,
                    _TURN_END_MARGIN_SECONDS,
                )
            if self.gate.open_calls:
                # What is left never ends on its own (health Watch, reflection): end it now.
                await self.server.stop(None)
        finally:
            await stopping
            if self.http is not None:
                # Every turn has ended: what is left (a health Watch) is closed.
                await self.http.stop(_TURN_END_MARGIN_SECONDS if self.gate.open_calls else 0.5)
        if self.webhooks is not None:
            await self.webhooks.stop()  # calls cut short lapse and are made again (docs/webhooks.md)
        # Renewed until the turns ended; those left running (for the next start) lapse.
        await self.replica.stop()
        closes: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            *((f"remote hook server {remote.name!r}", remote.aclose) for remote in self.remote_hooks),
            *((f"{source.kind} {source.name!r}", source.aclose) for source in self.tools.sources),
            ("the store", self.store.close),
            ("the providers", self.providers.aclose),
        ]
        await close_within(closes, deadline)
        if self.tracer_provider is not None:
            # Exports the spans still queued (bounded by the exporter's timeout).
            await asyncio.to_thread(self.tracer_provider.shutdown)
        if self.metrics_endpoint is not None:
            # Last: a scrape during the drain still answers.
            self.metrics_endpoint.close()
        log.info("stopped")


def grpc_options(settings: Settings, *, shared_port: bool = False) -> list[tuple[str, int]]:
    """Server channel arguments, each set on purpose.

    Admission is the product's (:class:`~turnwire_server.api.admission.CallGate`:
    RESOURCE_EXHAUSTED with ErrorInfo and RetryInfo past
    ``limits.max_concurrent_rpcs`` turn calls), so gRPC core must hand every
    call of a burst to it rather than drop any first. Core parks the calls the
    application has not asked for yet in a pending queue, and the asyncio server
    asks for one call at a time (per method), so a burst waits there even though
    each call is answered in microseconds once picked up. Past
    ``grpc.server.max_pending_requests`` (default 1000) core starts failing
    queued calls at random, and past ``..._hard_limit`` (default 3000) all of
    them; the client sees CANCELLED, without details. Both are therefore
    unbounded. What bounds the queue instead: it drains as fast as the gate
    answers; a call not picked up within
    ``grpc.server_max_unrequested_time_in_server`` (30 s, only when the event
    loop is stuck) is still failed; and core's resource quota bounds its memory.
    There is no ``grpc.max_pending_requests`` and no ``maximum_concurrent_rpcs``
    here: the latter counts every call, health checks included.
    ``so_reuseport`` is off so a second server on the same port fails loudly, except for a
    worker of ``serve --workers N`` (``shared_port``: :mod:`turnwire_server.supervisor`), which
    shares the port its supervisor holds.
    ``grpc.http2.bdp_probe`` is off: with it, core grows each connection's HTTP/2 receive window
    to its bandwidth-delay estimate (megabytes on a fast link), and every new stream may send
    that much before the server reads anything, so a caller refused without a token
    (:mod:`turnwire_server.api.refusal`) still made the server hold about 2 MiB per call
    (``bench/refused_uploads.md``). Off, a stream may send 64 KiB before the server reads; a
    request the server does read gets a window for its whole message once its length prefix
    has arrived (a 900 KiB upload over a 50 ms round trip took as long either way).
    """
    limits = settings.limits
    return [
        ("grpc.max_receive_message_length", limits.max_receive_message_bytes),
        # Sends are bounded by what the server builds (a reply, a page: 3 MiB; an event), not by
        # the limit on what it takes: a lower receive limit must not fail a long reply's TurnEnd.
        ("grpc.max_send_message_length", -1),
        ("grpc.server.max_pending_requests", _UNBOUNDED),
        ("grpc.server.max_pending_requests_hard_limit", _UNBOUNDED),
        ("grpc.server_max_unrequested_time_in_server", 30),
        ("grpc.so_reuseport", 1 if shared_port else 0),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.bdp_probe", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
    ]


async def start(
    settings: Settings, *, worker: bool = False, stop_requested: asyncio.Event | None = None
) -> Sidecar:
    """Check the configuration, open the store, recover crashed turns and start serving.

    Everything that can be checked without the store is checked first, so a
    bad configuration touches no file. Raises :class:`StartupError` with a
    message that says what to fix. ``worker``: one of ``serve --workers N``'s processes
    (:mod:`turnwire_server.supervisor`): the supervisor checked and holds the port and serves
    the metrics, so this process binds the port with ``SO_REUSEPORT`` and opens no metrics endpoint.
    ``stop_requested`` set while the start waits for the store's database ends the wait:
    :class:`~turnwire_server.assembly.StartupStopped`.
    """
    CACHES.resize(settings.memory.cache_bytes)
    # Before the port: a configuration error (a missing API key, an unknown model) is what to
    # fix, even while another process (a draining sidecar) still holds the port.
    checked = await preflight(settings)
    endpoint = None
    try:
        if not worker:  # else the supervisor checked it, and holds it
            # Before the metrics port: a second `serve` on the same configuration reports the gRPC
            # port it cannot have, not the metrics one (the supervisor checks in the same order).
            check_listen(settings.listen)
            endpoint = _metrics_endpoint(settings)
        tools = await open_tools(settings)
        try:
            sidecar = await _start(
                settings, checked, tools, shared_port=worker, stop_requested=stop_requested
            )
        except BaseException:
            await tools.aclose()
            raise
    except BaseException:
        if endpoint is not None:
            endpoint.close()
        await checked.providers.aclose()
        raise
    sidecar.metrics_endpoint = endpoint
    return sidecar


async def check_startable(settings: Settings) -> None:
    """What :func:`start` checks before it opens anything (:func:`~turnwire_server.assembly.
    preflight`), for ``turnwire config show`` to refuse what ``serve`` would. Raises
    :class:`StartupError` with ``serve``'s message."""
    checked = await preflight(settings)
    await checked.providers.aclose()


def _metrics_endpoint(settings: Settings) -> MetricsEndpoint | None:
    """The Prometheus endpoint when ``metrics.enabled``. Raises :class:`StartupError`."""
    if not settings.metrics.enabled:
        return None
    try:
        endpoint = start_metrics_endpoint(settings.metrics.listen)
    except (OSError, ValueError) as error:
        raise StartupError(f"metrics.listen: cannot listen on {settings.metrics.listen}: {error}") from error
    host = settings.metrics.listen.rpartition(":")[0]
    log.info("metrics on http://%s:%d/metrics", host, endpoint.port)  # the bound port (0: any free)
    return endpoint


async def _start(
    settings: Settings,
    checked: Preflight,
    tools: ToolSet,
    *,
    shared_port: bool,
    stop_requested: asyncio.Event | None = None,
) -> Sidecar:
    """The start-up after the providers are built and the tools listed, in order: everything
    else checkable without the store, then the store, the engine with its recoveries, the gRPC
    server, and the background loops; each step is one function below. The store is closed
    again when a step after it fails."""
    providers, access, tls, signers = checked.providers, checked.access, checked.tls, checked.signers
    chain = MiddlewareChain(load_middlewares(settings.middleware))
    session = await configure_session(settings, chain, providers, tools)
    try:
        detached_results = DetachedResults()
        subagents = await build_subagents(settings, providers, tools, load_middlewares, detached_results)
    except SubagentConfigError as error:
        raise StartupError(str(error)) from error
    replica_id = new_replica_id()
    name_replica(replica_id)  # every log line from here on, as its spans name it
    store = await open_configured_store(
        settings.store,
        patience_seconds=settings.durability.store_outage_seconds,
        replica_id=replica_id,
        stop_requested=stop_requested,
    )
    try:
        tracing, tracer_provider = open_tracing(settings, replica_id)
        # Before the engine: the turns it recovers count against their tenants' shares already.
        gate = CallGate(settings.limits.max_concurrent_rpcs, tenant_shares=settings.tenant_shares)
        engine = TurnEngine(
            store=store,
            providers=providers,
            tools=subagents.all_tools,
            chain=chain,
            settings=engine_settings(settings, session, replica_id),
            error_status=status_of,
            tracing=tracing,
            turn_slots=gate,
        )
        subagents.bind(engine)
        submissions = await recover_turns(settings, engine, store)
        detached_results.bind(submissions, store)
        await deliver_detached_answers(settings, detached_results)
        scheduler = build_scheduler(settings, store, submissions)
        server, health, port, calls = await _serve(
            settings,
            engine,
            submissions,
            gate,
            tls,
            access=access,
            shared_port=shared_port,
            scheduler=scheduler,
        )
        try:
            http = await _start_http(settings, calls, shared_port=shared_port)
        except BaseException:
            await server.stop(None)
            raise
    except BaseException:
        await store.close()
        raise
    maintenance = start_maintenance(settings.durability, engine, submissions)
    sweep_detached_answers(settings, detached_results, maintenance)
    webhooks = start_webhooks(settings.webhooks, store, signers, replica_id, maintenance)
    replica = Replica(engine, resume=settings.durability.recover_on_start, submissions=submissions)
    replica.start()
    scheduler.start()
    store_health = StoreHealth(store, health, ("", SERVICE_NAME))
    sidecar = Sidecar(
        server=server,
        engine=engine,
        store=store,
        tools=tools,
        health=health,
        port=port,
        settings=settings,
        gate=gate,
        maintenance=maintenance,
        replica=replica,
        scheduler=scheduler,
        tracer_provider=tracer_provider,
        tls=tls,
        authenticator=access.authenticator if access is not None else None,
        http=http,
        store_health=store_health,
        webhooks=webhooks,
    )
    await _announce(sidecar)
    store_health.start()  # after SERVING: from here NOT_SERVING follows the store's database
    return sidecar


async def _serve(
    settings: Settings,
    engine: TurnEngine,
    submissions: Submissions,
    gate: CallGate,
    tls: ServerTls | None,
    *,
    access: AccessInterceptor | None,
    shared_port: bool,
    scheduler: Scheduler | None = None,
) -> tuple[grpc.aio.Server, health_aio.HealthServicer, int, InProcessCalls]:
    """The gRPC server with its interceptors (``access`` None: no authentication and no rate
    limits), ChatService and the standard services, bound to
    ``listen`` and started; returns it, its health servicer (not SERVING yet), the bound
    port and the same servicers behind the same interceptors for the HTTP doors
    (:class:`~turnwire_server.http.InProcessCalls`). Raises :class:`StartupError` when the
    address cannot be bound."""
    quiet_grpc_call_noise()
    # The observer first: it sees each call as the client does, the refusals of the access
    # interceptor (authentication, rate limits) and of the gate included. Access before the
    # gate: a refused caller takes no turn slot.
    interceptors: list[grpc.aio.ServerInterceptor] = [RpcObserver(), gate]
    if access is not None:
        interceptors.insert(1, access)
    server = grpc.aio.server(
        interceptors=interceptors, options=grpc_options(settings, shared_port=shared_port)
    )
    servicer = ChatService(
        engine,
        engine.store,
        submissions,
        default_model=settings.default_model,
        max_message_bytes=settings.limits.max_message_bytes,
        progress_interval=settings.limits.progress_interval_seconds,
        scheduler=scheduler,
        webhooks=settings.webhooks,
    )
    chat_service_pb2_grpc.add_ChatServiceServicer_to_server(servicer, server)
    health = add_standard_services(server, (SERVICE_NAME,))
    # The HTTP doors' methods: the same servicer objects, registered the same way.
    table = MethodTable()
    chat_service_pb2_grpc.add_ChatServiceServicer_to_server(servicer, table)
    health_pb2_grpc.add_HealthServicer_to_server(health, table)
    try:
        if tls is None:
            port = server.add_insecure_port(settings.listen)
        else:
            port = server.add_secure_port(settings.listen, tls.server_credentials())
    except RuntimeError as error:
        raise StartupError(f"cannot listen on {settings.listen}: {error}") from error
    if port == 0:
        raise StartupError(f"cannot listen on {settings.listen}: the address is in use or not local")
    await server.start()
    return server, health, port, InProcessCalls(table, interceptors)


async def _start_http(settings: Settings, calls: InProcessCalls, *, shared_port: bool) -> HttpListener | None:
    """The HTTP listener (``http.listen``; None when unset) serving ``calls``. Raises
    :class:`StartupError` when its address cannot be bound."""
    if settings.http.listen is None:
        return None
    services = (
        chat_service_pb2.DESCRIPTOR.services_by_name["ChatService"],
        health_pb2.DESCRIPTOR.services_by_name["Health"],
    )
    context = DoorContext(
        calls, services, settings.limits.max_receive_message_bytes, inspector=settings.http.inspector
    )
    try:
        return await start_http(settings.http, context, settings.tls, shared_port=shared_port)
    except HttpListenError as error:
        raise StartupError(str(error)) from None


async def _announce(sidecar: Sidecar) -> None:
    """Health SERVING (overall, for ChatService and the liveness status), then the start-up
    warnings and the "listening" lines. Only now: a start that fails (a missing API key, say)
    says what to fix and nothing else."""
    settings = sidecar.settings
    for service in ("", SERVICE_NAME, LIVENESS):
        await sidecar.health.set(service, health_pb2.HealthCheckResponse.SERVING)
    warn_of_demo_tools(settings)
    warn_of_sections_left_off(settings)
    host = settings.listen.rpartition(":")[0]
    log.info(
        "turnwire listening on %s:%d, %s (store %s, default model %s, replica %s, event loop %s)",
        host,
        sidecar.port,
        _transport(settings),
        store_label(settings.store.url),
        settings.default_model,
        sidecar.engine.settings.replica_id,  # the owner the store records for its turns
        running_loop_name(),
    )
    log.info(
        "tools: %s; sub-agents: %s; middleware: %s",
        ", ".join(sidecar.tools) or "none",
        ", ".join(f"{a.name} (detached)" if a.detached else a.name for a in settings.subagents) or "none",
        ", ".join(m.name for m in sidecar.engine.chain.middlewares) or "none",
    )


def _transport(settings: Settings) -> str:
    if settings.tls is None:
        return "plaintext"
    return "mutual TLS" if settings.tls.client_auth == "require" else "TLS"


_HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
"""The signals :func:`serve` handles, from its first line on."""


async def serve(
    settings: Settings,
    *,
    worker: bool = False,
    on_ready: Callable[[Sidecar, Callable[[], None]], None] | None = None,
) -> None:
    """Run until SIGTERM/SIGINT, then stop gracefully. Raises :class:`StartupError`.

    SIGTERM opens the drain window (``limits.drain_seconds``) first; SIGINT (Ctrl-C) skips it.
    A second signal ends the drain window early, or, during the shutdown grace, cancels the
    running turns at once (they store their partial replies). ``worker`` as for :func:`start`;
    ``on_ready(sidecar, stop)`` runs once serving, ``stop()`` acting as SIGTERM does.
    """
    # The handlers go in before start-up announces anything (health SERVING, the "listening"
    # line): a signal from then on is a graceful stop, never the default kill (exit 143, or 129
    # for SIGHUP). One that lands during start-up is kept and acted on once the sidecar is up,
    # except that a stop signal ends a wait for the store's database at once (StartupStopped):
    # nothing is served yet, and that wait may last durability.store_outage_seconds.
    loop = asyncio.get_running_loop()
    early: list[signal.Signals] = []
    stop_requested = asyncio.Event()

    def on_early_signal(signum: signal.Signals) -> None:
        early.append(signum)
        if signum != signal.SIGHUP:
            stop_requested.set()

    for signum in _HANDLED:
        loop.add_signal_handler(signum, on_early_signal, signum)
    try:
        sidecar = await start(settings, worker=worker, stop_requested=stop_requested)
    except BaseException:
        for signum in _HANDLED:
            loop.remove_signal_handler(signum)
        raise
    tune_collector()
    stop = asyncio.Event()
    hurry = asyncio.Event()  # a signal during the drain window: skip what is left of it
    now = asyncio.Event()  # a signal during the shutdown grace: cancel the running turns now
    draining = True

    def on_signal(signum: signal.Signals) -> None:
        if not stop.is_set():
            stop.set()
            if signum == signal.SIGINT:
                hurry.set()  # Ctrl-C is a person at a terminal, not a load balancer: no drain window
        elif draining:
            hurry.set()
        elif not now.is_set():
            log.warning("second signal: cancelling the running turns now (their partial replies are stored)")
            now.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    loop.add_signal_handler(signal.SIGHUP, sidecar.reload)
    for signum in early:
        if signum == signal.SIGHUP:
            sidecar.reload()  # files renewed while it started
        else:
            on_signal(signum)
    if on_ready is not None:
        on_ready(sidecar, lambda: on_signal(signal.SIGTERM))
    await stop.wait()
    await sidecar.drain_window(hurry)
    draining = False
    await sidecar.stop(now)
