"""Validation of the client tools a request offers (``repeated ClientTool client_tools``).

docs/semantics.md §6. Each tool needs a name of 1-64 characters of ``[A-Za-z0-9_-]``
(what every provider API accepts), unique within the request, and an input schema that is
a valid JSON Schema (Draft 2020-12, :mod:`turnwire_server.providers.json_schema`) of an
object (``"type": "object"``); an unset schema is ``{"type": "object"}``. Every problem is a
``BadRequest`` field violation (INVALID_ARGUMENT); nothing is stored.
"""

from __future__ import annotations

from collections.abc import Sequence

from turnwire.tools import TOOL_NAME_PATTERN, ClientTool
from turnwire.values import NotJsonError, from_struct, normalize
from turnwire_client.v1 import chat_service_pb2
from turnwire_server.providers.json_schema import object_schema_problem


def check_client_tools(
    tools: Sequence[chat_service_pb2.ClientTool],
    field: str,
    violations: list[tuple[str, str]],
) -> list[ClientTool]:
    """The request's client tools as :class:`~turnwire.tools.ClientTool` objects; adds a violation
    (``client_tools[i].name`` …) for each problem. ``field`` is the repeated field's name."""
    result: list[ClientTool] = []
    seen: set[str] = set()
    for index, tool in enumerate(tools):
        where = f"{field}[{index}]"
        ok = True
        if not TOOL_NAME_PATTERN.fullmatch(tool.name):
            shown = tool.name if len(tool.name) <= 40 else tool.name[:40] + "…"
            violations.append(
                (f"{where}.name", f"{shown!r} is not a valid tool name; use 1-64 of [A-Za-z0-9_-]")
            )
            ok = False
        elif tool.name in seen:
            violations.append((f"{where}.name", f"duplicates an earlier client tool {tool.name!r}"))
            ok = False
        seen.add(tool.name)
        schema: dict[str, object] = {"type": "object"}
        if tool.HasField("input_schema"):
            try:
                schema = normalize(from_struct(tool.input_schema))
            except NotJsonError as error:
                violations.append((f"{where}.input_schema", f"is not JSON: {error}"))
                continue
            problem = object_schema_problem(schema)
            if problem is not None:
                violations.append((f"{where}.input_schema", problem))
                ok = False
        if ok:
            result.append(ClientTool(tool.name, tool.description, schema))
    return result
