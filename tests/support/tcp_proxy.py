"""A loopback TCP proxy whose link can be cut, for outage and partition tests.

``TcpProxy(upstream_host, upstream_port)`` listens on ``127.0.0.1:<free port>`` and forwards every
connection to the upstream, in a thread of its own (its own asyncio loop), so sync and async tests
and separate processes (a sidecar pointed at ``proxy.port``) can all use it::

    with TcpProxy("127.0.0.1", 5432) as proxy:
        ... start a sidecar with the store at 127.0.0.1:{proxy.port} ...
        proxy.cut("reset")      # open connections reset, new ones refused: the database is gone
        proxy.cut("blackhole")  # open connections stall, new ones accepted and never answered
        proxy.restore()         # forwards again (connections cut stay cut, as after a real outage)

``reset`` is what a restarted server or a closed port looks like; ``blackhole`` is a partition (a
dropped route: nothing answers and nothing fails until a timeout). Bytes are forwarded as they
come (64 KiB reads), so the proxy adds no buffering beyond one read per direction.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

Mode = Literal["pass", "reset", "blackhole"]
T = TypeVar("T")


class TcpProxy:
    """A cuttable TCP forwarder from ``127.0.0.1:port`` to ``(upstream_host, upstream_port)``."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode: Mode = "pass"
        self.port = 0
        self.connections_accepted = 0
        self._loop = asyncio.new_event_loop()
        self._links: set[asyncio.StreamWriter] = set()
        self._stalled: set[asyncio.StreamWriter] = set()
        self._server: asyncio.base_events.Server | None = None
        self._flowing = asyncio.Event()  # set while mode == "pass"; only touched on the proxy's loop
        self._loop.call_soon_threadsafe(self._flowing.set)
        self._thread = threading.Thread(target=self._loop.run_forever, name="tcp-proxy", daemon=True)

    def __enter__(self) -> TcpProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, what a client is pointed at instead of the upstream."""
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        """Listen on a free loopback port (``self.port``) and start forwarding."""
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]

    def cut(self, mode: Literal["reset", "blackhole"] = "reset") -> None:
        """Cut the link: ``reset`` resets every open connection and every new one; ``blackhole``
        stops forwarding (open connections and new ones stall, unanswered)."""
        self._call(self._set_mode(mode))

    def restore(self) -> None:
        """Forward new connections again; stalled ones are reset (their peers would have timed
        out; a resumed route does not revive a TCP stream whose bytes were dropped)."""
        self._call(self._set_mode("pass"))

    def close(self) -> None:
        """Stop listening, reset every connection and stop the thread."""
        if self._server is not None:
            # On the proxy's loop: asyncio.Server is not thread-safe (closed from this thread while
            # a connection ends on that loop, Python 3.11 wakes its waiters twice: a TypeError).
            self._call(self._shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout=10)

    async def _shut(self) -> None:
        assert self._server is not None
        self._server.close()
        await self._reset_all()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _set_mode(self, mode: Mode) -> None:
        self.mode = mode
        if mode == "pass":
            await self._reset_all()  # the stalled ones
            self._flowing.set()
        else:
            self._flowing.clear()
            if mode == "reset":
                await self._reset_all()

    async def _reset_all(self) -> None:
        for writer in [*self._links, *self._stalled]:
            _reset(writer)
        self._links.clear()
        self._stalled.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections_accepted += 1
        if self.mode == "reset":
            _reset(writer)
            return
        if self.mode == "blackhole":
            self._stalled.add(writer)
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            _reset(writer)
            return
        self._links.update((writer, up_writer))
        # Cancelled only by close(); ending quietly keeps asyncio's stream callback from logging it.
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))
        self._links.difference_update((writer, up_writer))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if not self._flowing.is_set():  # a partition: hold the bytes, answer nothing
                    self._stalled.add(writer)
                    await self._flowing.wait()
                if writer.is_closing():
                    return
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a crashed peer would, not with an orderly FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    with contextlib.suppress(Exception):
        writer.close()
