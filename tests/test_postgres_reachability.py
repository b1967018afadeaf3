"""The PostgreSQL store's view of whether its database answers (store/postgres/replicas.py,
"Reachability"; docs/operate/outages.md): a store whose database came back serves again as soon
as a caller asks, not a reconnect backoff later.

The store reaches the test server through a loopback proxy (``support.tcp_proxy``) whose link
the test cuts and restores; the server itself stays up (other tests share it).
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from support.stores import postgres_database
from support.tcp_proxy import TcpProxy
from support.waiting import wait_until

from turnwire_server.store.errors import StoreUnreachable
from turnwire_server.store.postgres import PostgresStore, replicas

pytestmark = pytest.mark.postgres


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh database of its own on the test server (dropped afterwards)."""
    with postgres_database() as url:
        yield url


async def test_a_refused_call_cuts_the_listeners_reconnect_backoff_short(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The listener's backoff made a minute long: without the refused call's nudge the store
    would refuse work for that minute after the database answers again (chaos probe: a read right
    after a restart met a replica whose listener still waited out its backoff)."""
    monkeypatch.setattr(replicas, "_RECONNECT_SECONDS", (0.1, 60.0))
    server = urlsplit(pg_url)
    with TcpProxy(server.hostname or "127.0.0.1", server.port or 5432) as proxy:
        through_proxy = server._replace(netloc=f"{server.username}@127.0.0.1:{proxy.port}").geturl()
        store = PostgresStore(through_proxy)
        await store.open()
        try:
            assert await store.get_turn("r-none") is None
            await wait_until(store._listener.connected.is_set, what="the listener is connected")
            attempts = proxy.connections_accepted
            proxy.cut("reset")  # the database is gone: the listener's connection resets
            await wait_until(lambda: not store.reachable, what="the store counts the database gone")
            await wait_until(
                lambda: proxy.connections_accepted >= attempts + 2,
                what="the listener's second reconnect attempt (refused): it waits out 60 s now",
            )
            proxy.restore()
            with pytest.raises(StoreUnreachable):  # refused at once, and the listener nudged
                await store.get_turn("r-none")
            await wait_until(lambda: store.reachable, timeout=10, what="the store serves again")
            assert await store.get_turn("r-none") is None
        finally:
            await store.close()
