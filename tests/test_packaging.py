"""The product namespace as a user sees it: imports from the installed packages, not the repository layout.

docs/architecture.md ("Packages"): each distribution has one source root, so
the editable install is a plain path entry; a folder named ``turnwire`` next to
a user's script (typically the clone itself) must not shadow the packages.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import turnwire, turnwire_client
from turnwire.hooks import Middleware, ToolCallDecision, TurnConfig
from turnwire.tools import tool
from turnwire.testing import ScriptedProvider
from turnwire_client import TurnwireClient, collect
print(turnwire.__file__)
print(turnwire_client.__file__)
"""


def test_a_script_beside_a_clone_named_turnwire_imports_the_packages(tmp_path: Path) -> None:
    (tmp_path / "turnwire").symlink_to(REPO, target_is_directory=True)  # the clone, as users name it
    script = tmp_path / "my_app.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    extension_api, client = result.stdout.split()
    assert Path(extension_api) == REPO / "middleware" / "turnwire" / "__init__.py"
    assert Path(client) == REPO / "clients" / "python" / "src" / "turnwire_client" / "__init__.py"


def test_importing_the_engine_loads_no_grpc_and_no_backend() -> None:
    probe = (
        "import sys, turnwire_server.engine\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in {'grpc', 'anthropic', 'openai', "
        "'sqlite3'} or m.startswith(('turnwire_server.store.sqlite', 'turnwire_server.tools.demo', "
        "'turnwire_server.api')))\n"
        "print(loaded)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"
