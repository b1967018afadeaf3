"""A local HTTP server that replays recorded provider responses and records the requests it gets.

Stdlib only (``http.server`` in a daemon thread, HTTP/1.1 keep-alive). Queue
:class:`Reply` objects with :meth:`ReplayServer.enqueue`; each request takes the
next one (FIFO; a 599 error when none is queued). A reply is a status, headers
and a body sent either whole (``Content-Length``) or, for streams, as chunks
(``Transfer-Encoding: chunked``, one chunk per SSE event by default), with
optional pacing, a connection drop after N chunks (no terminating chunk: the
client sees the body cut), or an endless stream that runs until the client
disconnects (:attr:`ReplayServer.disconnected` is set then, and
``chunks_after_close`` counts what it still managed to write).

Run as a script (``python tests/providers/replay.py FILE.sse``) it serves that
file for every request until killed, printing its URL; the benchmark uses that.
"""

from __future__ import annotations

import http.server
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

CASES = Path(__file__).resolve().parent / "cases"
"""The provider cases: a copy of the planning folder's ``shared/cases/providers`` (kept identical by
``test_shared_cases.py::test_the_cases_copy_matches_the_shared_folder`` wherever that folder is beside
the repository), so the suite runs from a clone alone."""


def split_events(body: bytes) -> list[bytes]:
    """An SSE body cut into its events (each keeps its trailing blank line)."""
    events = [part + b"\n\n" for part in body.split(b"\n\n") if part.strip()]
    return events


@dataclass
class Reply:
    """One response. ``chunks`` (streamed) wins over ``body`` (whole)."""

    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks: list[bytes] | None = None
    delay: float = 0.0  # seconds before each chunk
    drop_after: int | None = None  # close the connection after this many chunks
    endless: Callable[[int], bytes] | None = None  # chunk n of a stream that never ends

    @classmethod
    def sse(cls, body: bytes | str, **kwargs: Any) -> Reply:
        """A 200 ``text/event-stream`` reply of ``body`` (bytes, or a case file name), one chunk per event."""
        if isinstance(body, str):
            body = (CASES / "sse" / body).read_bytes()
        return cls(headers={"content-type": "text/event-stream"}, chunks=split_events(body), **kwargs)

    @classmethod
    def error(
        cls, status: int, body: bytes | str | dict[str, Any], headers: dict[str, str] | None = None
    ) -> Reply:
        """An error response with a JSON (dict) or raw body."""
        if isinstance(body, dict):
            raw = orjson.dumps(body)
            content_type = "application/json"
        else:
            raw = body.encode() if isinstance(body, str) else body
            content_type = "application/json" if raw[:1] in (b"{", b"[") else "text/plain"
        return cls(status=status, headers={"content-type": content_type, **(headers or {})}, body=raw)


@dataclass
class Recorded:
    """A request the server received. ``headers`` keys are lower case."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body parsed as JSON."""
        return orjson.loads(self.body) if self.body else None


class ReplayServer:
    """Start with :meth:`start` (or use as a context manager); ``url`` is its base URL."""

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self.default: Reply | None = None
        self.disconnected = threading.Event()
        self.chunks_written = 0
        self.chunks_after_close = 0
        self._server: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def enqueue(self, *replies: Reply) -> None:
        """Queue replies for the next requests, in order."""
        self.replies.extend(replies)

    def start(self) -> ReplayServer:
        """Listen on 127.0.0.1 (a free port) in a daemon thread."""
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def next_reply(self) -> Reply:
        if self.replies:
            return self.replies.popleft()
        if self.default is not None:
            return self.default
        return Reply.error(599, {"error": {"type": "replay_error", "message": "no reply queued"}})


def _handler(owner: ReplayServer) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def setup(self) -> None:
            super().setup()
            # Like real API servers: no Nagle delay between the headers and the first small event.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def handle(self) -> None:
            try:
                super().handle()
            except OSError:  # the client hung up between requests
                owner.disconnected.set()

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            owner.requests.append(
                Recorded(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            reply = owner.next_reply()
            try:
                self._send(reply)
            except (BrokenPipeError, ConnectionResetError, OSError):
                owner.disconnected.set()
                self.close_connection = True

        do_GET = do_POST

        def _send(self, reply: Reply) -> None:
            self.send_response(reply.status)
            for key, value in reply.headers.items():
                self.send_header(key, value)
            if reply.chunks is None and reply.endless is None:
                self.send_header("content-length", str(len(reply.body)))
                self.end_headers()
                self.wfile.write(reply.body)
                self.wfile.flush()
                return
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.flush()
            for index, chunk in enumerate(self._chunks(reply)):
                if reply.drop_after is not None and index >= reply.drop_after:
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if reply.delay:
                    time.sleep(reply.delay)
                try:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                except OSError:
                    if owner.disconnected.is_set():
                        raise
                    owner.disconnected.set()
                    raise
                owner.chunks_written += 1
                if owner.disconnected.is_set():
                    owner.chunks_after_close += 1
                if reply.endless is not None and _peer_closed(self.connection):
                    owner.disconnected.set()
                    self.close_connection = True
                    return
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        @staticmethod
        def _chunks(reply: Reply) -> Iterator[bytes]:
            if reply.chunks is not None:
                yield from reply.chunks
                return
            assert reply.endless is not None
            index = 0
            while True:
                yield reply.endless(index)
                index += 1

    return Handler


def _peer_closed(sock: socket.socket) -> bool:
    """True when the client closed its end (a readable socket with nothing to read)."""
    try:
        sock.setblocking(False)
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        finally:
            sock.setblocking(True)
    except BlockingIOError:
        return False
    except OSError:
        return True


def main() -> None:
    """Serve one SSE file (argv[1]) for every request until killed; prints the URL."""
    body = Path(sys.argv[1]).read_bytes()
    server = ReplayServer()
    server.default = Reply.sse(body)
    server.start()
    print(server.url, flush=True)
    try:
        while True:
            time.sleep(3600)
            server.requests.clear()
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
