"""Shared fixtures. ``sidecar_factory`` runs real ``turnwire serve`` processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.engine_harness import EngineFactory, engine_factory
from support.sidecar import SidecarFactory, SidecarProcess
from support.stores import BACKENDS, StoreBackend, postgres_database

from turnwire_client import TlsOptions
from turnwire_server.store import Store


@pytest.fixture
def sidecar_factory(tmp_path: Path) -> Iterator[SidecarFactory]:
    """A factory ``(config=None, env=None, workdir=tmp_path, store_url=None, tls=None) ->
    SidecarProcess`` (not started; ``await sidecar.start()``; ``store_url`` None: SQLite in
    ``workdir``; ``tls``: the client options to reach it). Every process it made is killed at
    teardown."""
    created: list[SidecarProcess] = []

    def factory(
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        workdir: Path | None = None,
        store_url: str | None = None,
        tls: TlsOptions | None = None,
    ) -> SidecarProcess:
        sidecar = SidecarProcess(workdir or tmp_path, config, env, store_url=store_url, tls=tls)
        created.append(sidecar)
        return sidecar

    yield factory
    for sidecar in created:
        sidecar.kill()


@pytest.fixture
async def make_engine(tmp_path: Path) -> AsyncIterator[EngineFactory]:
    """``await make_engine(scripts=..., tools=..., middlewares=..., **EngineSettings fields)``:
    an in-process engine on a SQLite store in ``tmp_path`` (see ``support.engine_harness``)."""
    async with engine_factory(tmp_path) as factory:
        yield factory


@pytest.fixture(params=BACKENDS)
async def store_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreBackend]:
    """This test's database on each store backend in turn (``sqlite``, ``postgres``): see
    ``support.stores``. PostgreSQL tests fail (never skip) when no server is reachable."""
    if request.param == "sqlite":
        backend = StoreBackend("sqlite", path=tmp_path / "db" / "turnwire.db")
        try:
            yield backend
        finally:
            await backend.close()
        return
    with postgres_database() as url:
        backend = StoreBackend("postgres", url=url)
        try:
            yield backend
        finally:
            await backend.close()


@pytest.fixture
async def store(store_backend: StoreBackend) -> AsyncIterator[Store]:
    """An open store on ``store_backend``'s database, closed at teardown."""
    opened = store_backend.new_store()
    await opened.open()
    yield opened
    await opened.close()
