"""Shared fixtures. ``sidecar_factory`` runs real ``turnwire serve`` processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
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
