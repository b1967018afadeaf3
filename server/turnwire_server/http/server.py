"""The HTTP listener (``http.listen``): uvicorn serving the doors in the sidecar's event loop.

uvicorn runs in the sidecar's own process and event loop (uvloop when on), beside the gRPC
server, so a door's call runs the same interceptor instances and shares the call gate, the rate
limit windows and the tenants' shares with gRPC (:mod:`turnwire_server.http.calls`). Why uvicorn:
it is the most used ASGI server, embeds in a running loop (``Server.serve`` with sockets we
bind), parses HTTP/1.1 with httptools (C) for the least CPU per request, and browsers, curl and
connect-web reach Connect and gRPC-Web over HTTP/1.1 (docs/architecture.md "The HTTP listener").
Its own signal handlers are not installed: the sidecar's signal handling stops it
(:meth:`HttpListener.stop`). httptools sets no bound on a request's head, so the protocol is
uvicorn's with one (:class:`_BoundedHeadProtocol`: 431 past :data:`MAX_HEAD_BYTES`).

The socket is bound here: with ``SO_REUSEPORT`` under ``serve --workers N`` (each worker listens
on the port the supervisor holds, as for gRPC), without it otherwise, so a second sidecar on the
same port fails at start with the gRPC listener's message.

TLS: with ``tls:``, the listener is HTTPS with the same files and the same ``client_auth``
(mutual TLS: no handshake without a client certificate signed by ``tls.client_ca_file``). A
renewed file is served from the next handshake on (checked at each handshake, as the gRPC
listener does; SIGHUP re-reads at once); a replacement that does not load is logged and the files
in use kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
from collections.abc import Generator, Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from turnwire_server.api.tls_settings import ServerTlsSettings
from turnwire_server.http.doors import (
    DoorContext,
    DoorFactory,
    ag_ui_door,
    ai_sdk_door,
    build_app,
    connect_door,
    health_door,
    inspector_door,
    openai_door,
    openai_unserved_door,
)
from turnwire_server.http.settings import HttpSettings
from turnwire_server.listen_check import ListenAddressError, check_listen_address, hold_listen_address

log = logging.getLogger("turnwire.http")

DOORS: tuple[DoorFactory, ...] = (
    health_door,
    connect_door,
    openai_door,
    ag_ui_door,
    ai_sdk_door,
    inspector_door,
    openai_unserved_door,
)
"""The doors of the listener, in route order (docs/http.md#adding-a-door)."""


MAX_HEAD_BYTES = 64 << 10
"""The most a request's head (its request line and headers) may take: past it the answer is 431
and the connection is closed (docs/api/http.md#errors). gRPC refuses metadata over 8 KiB; a
browser's or an SDK's headers, a JWT included, take a few KiB."""

_HEAD_TOO_LARGE = (
    b"the request line and headers are larger than the sidecar takes (%d bytes)\n" % MAX_HEAD_BYTES
)

LINGER_SECONDS = 2.0
"""After an answer that closes the connection while the caller may still be sending (a head past
the bound, a request that does not parse), the answer's end is sent (FIN) and what the caller
still sends is read and dropped for at most this long before the socket closes. Closed at once
with input unread, the caller's kernel would get a RST, which can discard the answer before the
caller reads it (RFC 9112 §9.6, "Tear-down")."""


class _BoundedHeadProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a bound on each request's head (:data:`MAX_HEAD_BYTES`).

    httptools keeps a header's bytes until the header ends and sets no limit of its own, so
    without this a caller, with no token, could make the listener hold a header of any size
    (three connections sending 100 MB headers took the sidecar from 110 to 485 MB). The bytes of
    every read that leaves the head unfinished are counted; once past the bound the caller gets
    431 and the connection is closed. The read that finishes a head is not counted, so the bound
    holds to within one read."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between a request's end (or the connection's start) and its head's
        self._head_bytes = 0
        self._edges = 0  # heads and requests ended so far
        self._linger: asyncio.TimerHandle | None = None  # set once closing (_close_lingering)

    def data_received(self, data: bytes) -> None:
        """Parse ``data``; refuse the request once its unfinished head passes the bound."""
        if self._linger is not None:
            return  # answered and closing: what the caller still sends is dropped
        edges = self._edges
        super().data_received(data)
        # Only a read that lies wholly inside one head counts: one that ended a head or a
        # request also holds bytes of a body or of the request before.
        if (
            self._linger is not None
            or edges != self._edges
            or not self._in_head
            or self.transport.is_closing()
        ):
            return
        self._head_bytes += len(data)
        if self._head_bytes > MAX_HEAD_BYTES:
            self.transport.write(
                b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                b"content-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_HEAD_TOO_LARGE), _HEAD_TOO_LARGE)
            )
            self._close_lingering()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request that does not parse (the same bytes), closed as
        :meth:`_close_lingering` closes."""
        body = msg.encode("ascii")
        headers = b"".join(
            name + b": " + value + b"\r\n" for name, value in self.server_state.default_headers
        )
        self.transport.write(
            STATUS_LINE[400] + headers + b"content-type: text/plain; charset=utf-8\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
        )
        self._close_lingering()

    def _close_lingering(self) -> None:
        """Close after the answer written last (:data:`LINGER_SECONDS`): its end is sent now (a
        TLS transport cannot half-close: its ``content-length`` ends it), then the socket closes
        when the caller closes its side (the transport's own end of file) or the time is up."""
        if self._linger is not None or self.transport.is_closing():
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._linger = asyncio.get_running_loop().call_later(LINGER_SECONDS, self.transport.close)

    def connection_lost(self, exc: Exception | None) -> None:
        """The connection closed: no lingering left to end."""
        if self._linger is not None:
            self._linger.cancel()
        super().connection_lost(exc)

    def on_headers_complete(self) -> None:
        """The head ended: its body is not counted."""
        self._in_head = False
        self._head_bytes = 0
        self._edges += 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """The request ended: what comes next is the next request's head."""
        self._in_head = True
        self._head_bytes = 0
        self._edges += 1
        super().on_message_complete()


class HttpListenError(Exception):
    """``http.listen`` cannot be listened on; the message says why and what to do."""


class _TlsContexts:
    """An ``ssl.SSLContext`` for the ``tls:`` files, rebuilt when they change (see the module
    docstring): each handshake's SNI callback swaps in the newest context."""

    def __init__(self, settings: ServerTlsSettings) -> None:
        self._settings = settings
        self._stamp = self._current_stamp()
        self.context = self._build()
        self.context.sni_callback = self._on_handshake

    def _current_stamp(self) -> tuple[tuple[int, int, int] | None, ...]:
        stamps: list[tuple[int, int, int] | None] = []
        for path in (self._settings.cert_file, self._settings.key_file, self._settings.client_ca_file):
            try:
                info = os.stat(path) if path is not None else None
            except OSError:
                info = None
            stamps.append(None if info is None else (info.st_mtime_ns, info.st_size, info.st_ino))
        return tuple(stamps)

    def _build(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self._settings.cert_file, self._settings.key_file)
        if self._settings.client_auth == "require":
            assert self._settings.client_ca_file is not None  # checked by the settings
            context.load_verify_locations(self._settings.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["http/1.1"])
        return context

    def reload(self, *, changed_only: bool = False) -> None:
        """Rebuild the context from the files (only when their stamps changed, with
        ``changed_only``); a failure is logged and the context in use kept."""
        stamp = self._current_stamp()
        if changed_only and stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            fresh = self._build()
        except (OSError, ssl.SSLError) as error:
            log.error(
                "tls: the renewed files do not load (%s); the HTTP listener keeps the files in use", error
            )
            return
        fresh.sni_callback = self._on_handshake
        self.context = fresh
        log.info("tls: the HTTP listener serves the renewed certificate files")

    def _on_handshake(
        self, connection: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        self.reload(changed_only=True)
        if connection.context is not self.context:
            connection.context = self.context


class _EmbeddedServer(uvicorn.Server):
    """uvicorn without its own signal handlers (the sidecar's stop it)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def _bind(listen: str, *, shared_port: bool) -> tuple[list[socket.socket], int]:
    try:
        if not shared_port:
            check_listen_address(listen)
        held, port = hold_listen_address(listen)
    except ListenAddressError as error:
        raise HttpListenError(f"http.listen: {error}".replace("--listen or listen:", "http.listen")) from None
    if not shared_port:
        # Alone on the port, as the gRPC listener is (app.grpc_options): a second sidecar fails.
        for held_socket in held:
            held_socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 0)
    for held_socket in held:
        held_socket.listen(1024)
        held_socket.setblocking(False)
    return held, port


class HttpListener:
    """The started listener: its ``port`` and ``app``. Use :func:`start_http`."""

    def __init__(
        self,
        server: _EmbeddedServer,
        task: asyncio.Task[None],
        app: Starlette,
        port: int,
        tls: _TlsContexts | None,
    ) -> None:
        self._server = server
        self._task = task
        self.app = app
        self.port = port
        self._tls = tls

    def reload(self) -> None:
        """SIGHUP: re-read the ``tls:`` files now."""
        if self._tls is not None:
            self._tls.reload()

    def stop_accepting(self) -> None:
        """Take no new connection; idle keep-alive connections close, open calls go on."""
        self._server.should_exit = True

    async def stop(self, timeout: float) -> None:  # noqa: ASYNC109
        """Stop accepting, wait up to ``timeout`` seconds for open calls, then close the rest."""
        self.stop_accepting()
        try:
            async with asyncio.timeout(timeout):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._server.force_exit = True
            for connection in list(self._server.server_state.connections):
                connection.shutdown()
            for task in list(self._server.server_state.tasks):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def start_http(
    settings: HttpSettings,
    context: DoorContext,
    tls: ServerTlsSettings | None,
    *,
    shared_port: bool,
    doors: Sequence[DoorFactory] = DOORS,
) -> HttpListener:
    """Bind ``settings.listen`` and serve ``doors`` on it (see the module docstring); returns
    once it accepts connections. Raises :class:`HttpListenError` when the address cannot be
    bound; ``ssl.SSLError`` / ``OSError`` for ``tls:`` files that do not load (checked before,
    by the gRPC listener's start)."""
    assert settings.listen is not None
    # uvicorn's own start and stop lines repeat what the sidecar logs; its errors still show.
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    app = build_app(context, doors, settings.cors)
    sockets, port = _bind(settings.listen, shared_port=shared_port)
    contexts = _TlsContexts(tls) if tls is not None else None
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_config=None,
        access_log=False,
        http=_BoundedHeadProtocol,
        ws="none",
        # The sidecar's own stop bounds the wait (HttpListener.stop); uvicorn's only matters
        # should that wait be skipped.
        timeout_graceful_shutdown=None,
        server_header=False,
        # X-Forwarded-For/-Proto name the client only behind the proxies the operator names
        # (http.trusted_proxies); uvicorn's default believes any local process's.
        proxy_headers=bool(settings.trusted_proxies),
        forwarded_allow_ips=list(settings.trusted_proxies),
    )
    config.load()
    if contexts is not None:
        config.ssl = contexts.context  # uvicorn's own TLS settings cannot re-read renewed files
    server = _EmbeddedServer(config)
    task = asyncio.ensure_future(server.serve(sockets=sockets))
    while not server.started:
        if task.done():
            task.result()  # raises what stopped it
            raise HttpListenError(f"http.listen: the listener on {settings.listen} did not start")
        await asyncio.sleep(0.01)
    host = settings.listen.rpartition(":")[0]
    scheme = "https" if tls is not None else "http"
    log.info("HTTP listener on %s://%s:%d (%s)", scheme, host, port, ", ".join(app.state.doors))
    return HttpListener(server, task, app, port, contexts)


__all__ = ["DOORS", "HttpListenError", "HttpListener", "start_http"]
