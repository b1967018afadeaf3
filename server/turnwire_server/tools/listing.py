"""Checks shared by the tool sources in other processes (tool hosts, MCP servers) on what they list."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from turnwire.tools import TOOL_NAME_PATTERN
from turnwire_server.providers.json_schema import object_schema_problem

OBJECT_SCHEMA: Mapping[str, Any] = {"type": "object"}
"""The input schema of a listed tool that gives none."""


def listing_problem(name: str, input_schema: Mapping[str, Any]) -> str | None:
    """Why a listed tool cannot be offered to the model (None: it can): its name must be 1-64
    of ``[A-Za-z0-9_-]`` (what every provider API accepts) and its input schema a valid JSON
    Schema of an object. Such a tool is left out, with a warning naming the source."""
    if not TOOL_NAME_PATTERN.fullmatch(name):
        return f"its name {name[:70]!r} is not 1-64 of [A-Za-z0-9_-]"
    problem = object_schema_problem(input_schema)
    return None if problem is None else f"its input schema {problem}"
