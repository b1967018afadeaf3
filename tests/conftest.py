"""Shared fixtures and the suite's markers.

``sidecar_factory`` runs real ``turnwire serve`` processes. Markers (``pyproject.toml``) say what a
test needs beyond this process; ``make check`` runs only the tests with none of them:

- ``e2e``: starts processes (sidecars, the CLI, Node.js, Go, a Python subprocess); every test under
  ``tests/e2e/`` and ``tests/stress/`` by its path, elsewhere by a module's ``pytestmark``.
- ``postgres``: needs the PostgreSQL server of ``support.stores``; the ``postgres`` case of the
  ``store_backend`` fixture is marked here, other users by ``pytestmark``.
- ``packaging``: builds or installs packages (virtual environments, wheels, ``npm pack``).
- ``stress``: the stress, crash and fuzz suites (``tests/stress/``), sized by
  ``TURNWIRE_STRESS_SCALE`` (``make stress``: full size).
"""

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

_MARKED_BY_PATH: dict[str, tuple[str, ...]] = {"e2e": ("e2e",), "stress": ("e2e", "stress")}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark tests by what they need (see the module docstring): ``tests/e2e/`` and
    ``tests/stress/`` by path, the PostgreSQL case of ``store_backend`` by its parameter.

    Under pytest-xdist (``--dist loadgroup``), the tests of a module that share a module-scoped
    fixture (a sidecar started once for the module) are grouped onto one worker, so the fixture
    is made once; every other test goes to whichever worker is free. First among the hooks: the
    worker's own hook reads the ``xdist_group`` marks to group by, so they must be on already."""
    tests = Path(__file__).parent
    for item in items:
        parts = item.path.relative_to(tests).parts
        for name in _MARKED_BY_PATH.get(parts[0], ()) if len(parts) > 1 else ():
            item.add_marker(name)
        callspec = getattr(item, "callspec", None)
        if callspec is not None and callspec.params.get("store_backend") == "postgres":
            item.add_marker("postgres")
        if _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.relative_to(tests).as_posix()))


def _uses_module_fixture(item: pytest.Item) -> bool:
    """True when ``item`` needs a fixture of module scope defined in this suite."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        definition.scope == "module" and str(definition.baseid or "").startswith("tests")
        for definitions in info.name2fixturedefs.values()
        for definition in definitions
    )


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
    """``await make_engine(scripts=..., tools=..., middlewares=..., **settings)``, the settings
    flat (``support.engine_harness.engine_settings``): an in-process engine on a SQLite store in
    ``tmp_path`` (see ``support.engine_harness``)."""
    async with engine_factory(tmp_path) as factory:
        yield factory


@pytest.fixture(params=BACKENDS)
async def store_backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[StoreBackend]:
    """This test's database on each store backend in turn (``sqlite``, ``postgres``): see
    ``support.stores``. PostgreSQL tests fail (never skip) when no server is reachable."""
    if request.param == "sqlite":
        # A folder of its own (beside a test's other files); the store never creates one.
        (tmp_path / "db").mkdir()
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
