"""Shared fixtures. ``sidecar_factory`` runs real ``turnwire serve`` processes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.engine_harness import EngineFactory, engine_factory
from support.sidecar import SidecarFactory, SidecarProcess


@pytest.fixture
def sidecar_factory(tmp_path: Path) -> Iterator[SidecarFactory]:
    """A factory ``(config=None, env=None, workdir=tmp_path) -> SidecarProcess`` (not started;
    ``await sidecar.start()``). Every process it made is killed at teardown."""
    created: list[SidecarProcess] = []

    def factory(
        config: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        workdir: Path | None = None,
    ) -> SidecarProcess:
        sidecar = SidecarProcess(workdir or tmp_path, config, env)
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
