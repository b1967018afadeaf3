"""A built browser example's ``dist/`` served over HTTP on a loopback port of its own: another
origin than the sidecar's listener, so the browser tests exercise CORS (docs/api/http.md#browsers).
Used by ``tests/e2e/test_web_example_e2e.py`` and ``tests/e2e/test_ai_sdk_page_e2e.py``."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Nothing: the request lines would print the page's query (the token) into the test log."""


@contextmanager
def serving(directory: Path) -> Iterator[str]:
    """Serves the files under ``directory`` until the block ends; yields the origin
    (``http://127.0.0.1:PORT``, a free port)."""
    handler = functools.partial(_QuietHandler, directory=str(directory))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
