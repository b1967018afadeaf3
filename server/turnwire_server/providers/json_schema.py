"""JSON Schema validation of structured output (``TurnConfig.output``), by the ``jsonschema`` library.

The whole of Draft 2020-12 (the dialect the providers' structured-output modes
speak), whatever ``$schema`` says. ``format`` and other annotations are not
asserted, as the draft's default is. ``$ref`` resolves within the schema (and to
the meta-schemas the library ships): nothing is fetched, so a remote ``$ref`` is
unresolvable.

:func:`validate` returns a list of problems (empty when valid), each the RFC 6901
JSON pointer of the offending value, then what is wrong: ``/items/0/name: 3 is
not of type 'string'``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import islice
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from referencing import Registry
from referencing.exceptions import Unresolvable

_MAX_MESSAGE_CHARS = 200
"""Messages quote the offending value: a longer one loses its middle, so what is wrong (at the end) stays."""


def validate(value: Any, schema: Mapping[str, Any] | bool, *, limit: int = 10) -> list[str]:
    """Problems of ``value`` against ``schema`` (empty list: valid), at most ``limit`` of them.

    Each problem is ``"POINTER: message"``; the pointer escapes ``~`` as ``~0`` and
    ``/`` as ``~1`` (RFC 6901); the whole value is shown as ``/`` (RFC 6901 writes it
    as the empty string, which reads badly before the colon).

    Raises :class:`ValueError` when ``schema`` is not a valid Draft 2020-12 schema
    (say a misspelt type or a broken ``pattern``) or has a ``$ref`` that does not
    resolve within it; the message says which.
    """
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as error:
        raise ValueError(f"invalid JSON Schema at {error.json_path}: {_shorten(error.message)}") from None
    # An empty registry: a $ref outside the schema is unresolvable rather than fetched.
    validator = Draft202012Validator(schema, registry=Registry())
    try:
        return [
            f"{_pointer(error.absolute_path)}: {_shorten(error.message)}"
            for error in islice(validator.iter_errors(value), limit)
        ]
    except Unresolvable as error:
        raise ValueError(f"$ref {error.ref!r} does not resolve within the schema (none is fetched)") from None
    except RecursionError:  # a value nested deeper than Python recurses, or $refs that loop
        return ["/: nested too deeply to check (or the schema's $refs loop without end)"]


def _pointer(path: Iterable[str | int]) -> str:
    return "/" + "/".join(str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _shorten(message: str) -> str:
    if len(message) <= _MAX_MESSAGE_CHARS:
        return message
    half = (_MAX_MESSAGE_CHARS - 1) // 2
    return f"{message[:half]}…{message[-half:]}"


def object_schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why ``schema`` cannot be a tool's input schema (None: it can): it must be a valid Draft
    2020-12 schema whose ``type`` is ``object`` (what every provider API accepts for a tool)."""
    if schema.get("type") != "object":
        return 'must be a JSON Schema of an object: set "type": "object" (and its "properties")'
    try:
        validate({}, schema, limit=1)
    except ValueError as error:
        return f"is not a valid JSON Schema (Draft 2020-12): {error}"
    return None
