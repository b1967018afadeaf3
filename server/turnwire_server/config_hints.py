"""What to suggest for a misspelt configuration key, in the file or in a ``TURNWIRE_*`` variable.

The settings models are the only source of truth: the keys a section accepts are read from its
pydantic model at the error's location (through ``dict`` values, list items and the ``type:`` tag
of a discriminated union such as a ``providers:`` entry).
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

#: TURNWIRE_* variables that are not settings: the CLI's and the tests' own.
NOT_SETTINGS = frozenset(
    {
        "TURNWIRE_CONFIG",
        "TURNWIRE_LISTEN",
        "TURNWIRE_TARGET",
        "TURNWIRE_TOKEN",
        "TURNWIRE_TLS_CA",
        "TURNWIRE_TLS_CERT",
        "TURNWIRE_TLS_KEY",
        "TURNWIRE_TLS_SERVER_NAME",
    }
)

_FIXED_MESSAGES = {
    ("providers", "api_key"): (
        "API keys are never read from the file; put the key in an environment variable and name "
        "that variable here, e.g. api_key_env: OPENAI_API_KEY"
    ),
}


def unknown_field_message(root: type[BaseModel], loc: Sequence[int | str]) -> str:
    """The message for the unknown key at ``loc`` (pydantic's location, union tags included):
    a "did you mean" when a known key of that section is close to it."""
    key = str(loc[-1])
    if (fixed := _FIXED_MESSAGES.get((str(loc[0]), key))) is not None:
        return fixed
    known = fields_at(root, loc[:-1])
    close = difflib.get_close_matches(key, known or [], n=1, cutoff=0.6)
    if close:
        return f"unknown field; did you mean {close[0]!r}?"
    if known:
        return f"unknown field; this section takes {', '.join(known)}"
    return "unknown field (check its spelling and its section)"


def fields_at(root: type[BaseModel], path: Sequence[int | str]) -> list[str] | None:
    """The keys the section at ``path`` accepts (sorted), or None when that is not a section."""
    annotation: Any = root
    for part in path:
        annotation = _step(annotation, part)
        if annotation is None:
            return None
    names = {name for model in _models(annotation) for name in model.model_fields}
    return sorted(names) or None


def unknown_variables(
    environ: Mapping[str, str], root: type[BaseModel], named: Iterable[str] = ()
) -> list[str]:
    """One warning per ``TURNWIRE_*`` variable that names no setting (pydantic-settings ignores
    them silently). Sections are joined by ``__``; names are case-insensitive. ``named``: the
    variables the loaded settings read by name (:func:`variables_named`), never warned about."""
    warnings = []
    used = {name.upper() for name in named}
    for variable in sorted(environ):
        upper = variable.upper()
        if (
            not upper.startswith("TURNWIRE_")
            or upper in NOT_SETTINGS
            or upper in used
            or upper.startswith("TURNWIRE_TEST_")
        ):
            continue
        path = [part.lower() for part in upper.removeprefix("TURNWIRE_").split("__")]
        for depth, part in enumerate(path):
            known = fields_at(root, path[:depth]) if depth else sorted(root.model_fields)
            if known is None:
                break  # a mapping or a value: its own keys are free-form
            if part not in known:
                close = difflib.get_close_matches(part, known, n=1, cutoff=0.6)
                where = "__".join(p.upper() for p in path[:depth]) or "the top level"
                hint = (
                    f"; did you mean TURNWIRE_{'__'.join([*path[:depth], close[0]]).upper()}?"
                    if close
                    else ""
                )
                warnings.append(f"{variable} is ignored: {where} has no setting {part!r}{hint}")
                break
    return warnings


def variables_named(settings: BaseModel) -> set[str]:
    """The environment variables ``settings`` reads by name: the values of its ``*_env`` fields
    (``api_key_env``, ``tokens_env``, ``secret_env``, ``password_env`` …) at any depth, in lists
    and mappings too."""
    found: set[str] = set()

    def visit(value: Any) -> None:
        if isinstance(value, BaseModel):
            for name in type(value).model_fields:
                field = getattr(value, name)
                if name.endswith("_env") and isinstance(field, str):
                    found.add(field)
                else:
                    visit(field)
        elif isinstance(value, Mapping):
            for item in value.values():
                visit(item)
        elif isinstance(value, list | tuple):
            for item in value:
                visit(item)

    visit(settings)
    return found


def _step(annotation: Any, part: int | str) -> Any:
    """The annotation one level down ``part``, or None."""
    for candidate in _members(annotation):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            if isinstance(part, str) and part in candidate.model_fields:
                return candidate.model_fields[part].annotation
            continue
        origin = get_origin(candidate)
        if origin in (dict, Mapping) and isinstance(part, str):
            return get_args(candidate)[1]
        if origin in (list, tuple, Sequence) and isinstance(part, int):
            return get_args(candidate)[0]
    tagged = [model for model in _models(annotation) if _tag(model) == part]
    return tagged[0] if tagged else None


def _members(annotation: Any) -> Iterable[Any]:
    """``annotation`` unwrapped: the members of a union, the type inside ``Annotated``."""
    origin = get_origin(annotation)
    if origin is Annotated:
        yield from _members(get_args(annotation)[0])
    elif origin in (Union, types.UnionType):
        for member in get_args(annotation):
            yield from _members(member)
    else:
        yield annotation


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in _members(annotation) if isinstance(m, type) and issubclass(m, BaseModel)]


def _tag(model: type[BaseModel]) -> str | None:
    """The ``type:`` literal of a discriminated union's member."""
    field = model.model_fields.get("type")
    if field is None or get_origin(field.annotation) is not Literal:
        return None
    values = get_args(field.annotation)
    return str(values[0]) if len(values) == 1 else None
