"""A non-conforming kit fixture, for the kit suite's own test: the Python fixture
(clients/conformance/kits/python/fixture.py) whose tool host writes integers beyond 2^53 as
doubles, as a kit that parses JSON into IEEE numbers would. Same flags as the fixture."""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path
from typing import Any

import turnwire.kit.tool_host

EXACT = 2**53


def _rounded(value: Any) -> Any:
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and abs(value) > EXACT:
        return float(value)
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(_rounded(value), separators=(",", ":"))


turnwire.kit.tool_host.dumps = _dumps  # type: ignore[attr-defined]  # what a non-conforming kit would do
FIXTURE = Path(__file__).resolve().parents[2] / "clients" / "conformance" / "kits" / "python" / "fixture.py"
sys.argv[0] = str(FIXTURE)
runpy.run_path(str(FIXTURE), run_name="__main__")
