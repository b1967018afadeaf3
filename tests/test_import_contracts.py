"""The import contracts (``[tool.importlinter]`` in ``pyproject.toml``, docs/architecture.md
"Layers") catch what they mean to forbid: a copy of the tree with one forbidden import added to an
engine or hooks module fails ``lint-imports``, naming the broken contract; the tree as it is passes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
SOURCE_ROOTS = ("server", "middleware", "clients/python/src")
#: Copied beside the roots: the configuration and the contract type it registers.
CONFIGURATION = ("pyproject.toml", "tools/import_contracts.py")


def _copy_tree(destination: Path) -> Path:
    """The three source roots and the contracts' configuration copied under ``destination``."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for root in SOURCE_ROOTS:
        shutil.copytree(REPO / root, destination / root, ignore=ignore)
    for name in CONFIGURATION:
        (destination / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, destination / name)
    return destination


def _lint_imports(tree: Path) -> subprocess.CompletedProcess[str]:
    # The copy's roots first on the path, ahead of the editable installs of this checkout.
    path = os.pathsep.join(str(tree / root) for root in SOURCE_ROOTS)
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env={**os.environ, "PYTHONPATH": path, "COLUMNS": "500"},  # one contract name a line
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_tree_keeps_its_contracts(tmp_path: Path) -> None:
    run = _lint_imports(_copy_tree(tmp_path))
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(
    ("module", "forbidden", "contract"),
    [
        # A store driver, whole or one of its modules (docs/architecture.md: drivers in packages).
        ("engine/turn.py", "turnwire_server.store.sqlite", "The engine knows interfaces: no gRPC"),
        ("engine/turn.py", "turnwire_server.store.sqlite.writer", "only the interfaces named"),
        ("engine/step_loop.py", "turnwire_server.store.postgres.admission", "only the interfaces named"),
        # The store's shared implementation (store/core/), by package.
        ("engine/transcript.py", "turnwire_server.store.core.reads", "only the interfaces named"),
        ("hooks/chain.py", "turnwire_server.store.core", "The engine knows interfaces: no gRPC"),
        # A provider adapter no list names: the allow-list forbids it all the same.
        ("engine/step_loop.py", "turnwire_server.providers.anthropic_request", "only the interfaces named"),
        ("hooks/chain.py", "turnwire_server.tools.demo", "only the interfaces named"),
        ("engine/events.py", "google.rpc.status_pb2", "no google.rpc"),
        ("hooks/chain.py", "google.rpc.error_details_pb2", "no google.rpc"),
        ("hooks/chain.py", "turnwire_server.api.status", "The engine knows interfaces: no gRPC"),
        ("engine/engine.py", "grpc", "The engine knows interfaces: no gRPC"),
        # A floor importing one above it.
        ("store/base.py", "turnwire_server.engine", "The server's floors"),
        ("api/status.py", "turnwire_server.app", "The server's floors"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(
    tmp_path: Path, module: str, forbidden: str, contract: str
) -> None:
    tree = _copy_tree(tmp_path)
    target = tree / "server" / "turnwire_server" / module
    target.write_text(target.read_text() + f"\nimport {forbidden}  # noqa: E402,F401\n")
    run = _lint_imports(tree)
    assert run.returncode != 0, f"lint-imports passed with `import {forbidden}` in {module}"
    assert "BROKEN" in run.stdout and contract in run.stdout, run.stdout
