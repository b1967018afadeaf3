"""The Prometheus scrape endpoint: ``GET /metrics`` on its own HTTP port (``metrics.listen``).

prometheus-client's WSGI server on a daemon thread, serving its default registry (every
``*/metrics.py`` of the sidecar, plus the client's ``process_*`` and ``python_*`` collectors);
a scrape never waits for the event loop, nor the loop for a scrape. Any path answers (the
client's server does not route); ``?name[]=…`` selects metric families. Counters carry no
``_created`` series.

Under ``serve --workers N`` the supervisor serves it alone, with a registry that adds up the
workers' prometheus-client multiprocess files (:mod:`turnwire_server.supervisor`).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, disable_created_metrics, start_http_server


@dataclass
class MetricsEndpoint:
    """A running endpoint; ``port`` is the one bound (useful with port 0)."""

    server: WSGIServer
    thread: threading.Thread
    port: int

    def close(self) -> None:
        """Stop serving and release the port (waits for a scrape in progress)."""
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def start_metrics_endpoint(listen: str, registry: CollectorRegistry = REGISTRY) -> MetricsEndpoint:
    """Serve ``registry`` (default: this process's metrics) on ``listen`` (``HOST:PORT``;
    ``[::1]:PORT`` for IPv6). Raises ``OSError`` when the address cannot be bound."""
    host, _, port = listen.rpartition(":")
    # No *_created series: they double a scrape's size and Prometheus ignores them by default.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in prometheus-client
    server, thread = start_http_server(int(port), addr=host.strip("[]"), registry=registry)
    return MetricsEndpoint(server, thread, int(server.server_port))
