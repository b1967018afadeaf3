"""Import an object named in configuration by ``package.module:attribute``."""

from __future__ import annotations

import difflib
import importlib
import pkgutil
import sys
from typing import Any


def import_object(path: str) -> Any:
    """Import ``package.module:attribute`` (the attribute may be dotted).

    Raises :class:`ModuleNotFoundError` when a module of the path does not exist: for a missing
    top-level package it says to put its folder on PYTHONPATH; for a missing submodule of a
    package that imports it names the module that does not exist and suggests close names
    (the parent's modules and attributes), since PYTHONPATH cannot help there. Raises
    :class:`AttributeError` with a "did you mean" over the module's public names, and
    :class:`ValueError` when ``path`` has no ``:``. Any other error raised while importing
    (a module that imports something missing, a syntax error) propagates unchanged.
    """
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{path!r} is not of the form package.module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        missing = error.name
        if missing is None or not _is_prefix(missing, module_name):
            raise  # the module exists; something it imports is missing
        raise _missing_module(missing, attribute) from None
    for depth, name in enumerate(attribute.split(".")):
        try:
            target = getattr(target, name)
        except AttributeError:
            owner = f"{module_name}:{'.'.join(attribute.split('.')[:depth])}" if depth else module_name
            raise AttributeError(
                f"{owner} has no attribute {name!r}{_did_you_mean(name, _public_names(target))}"
            ) from None
    return target


def _is_prefix(name: str, dotted: str) -> bool:
    """Whether module ``name`` is ``dotted`` or one of its parent packages."""
    return dotted == name or dotted.startswith(name + ".")


def _missing_module(missing: str, attribute: str) -> ModuleNotFoundError:
    """The error for module ``missing`` that does not exist, with the fix that can help."""
    parent_name, _, last = missing.rpartition(".")
    if not parent_name:
        return ModuleNotFoundError(
            f"No module named {missing!r}: put the folder that holds {missing}.py (or the {missing}/ "
            "package) on PYTHONPATH, or install it into this environment",
            name=missing,
        )
    parent = sys.modules.get(parent_name)
    if parent is None:  # pragma: no cover - import_module imports each parent before its child
        parent = importlib.import_module(parent_name)
    where = f" ({parent.__file__})" if getattr(parent, "__file__", None) else ""
    if not hasattr(parent, "__path__"):
        # ``myapp.tool:f`` where myapp.py is a module: the attribute belongs after the colon.
        hint = ""
        first = attribute.split(".", maxsplit=1)[0]
        if hasattr(parent, first):
            hint = f"; did you mean {parent_name}:{attribute}?"
        elif hasattr(parent, last):
            hint = f"; did you mean {parent_name}:{last}?"
        else:
            hint = _did_you_mean(last, _public_names(parent), prefix=f"{parent_name}:")
        return ModuleNotFoundError(
            f"module {missing!r} does not exist: {parent_name}{where} is a module, not a package, "
            f"so it has no submodules{hint}",
            name=missing,
        )
    submodules = [info.name for info in pkgutil.iter_modules(parent.__path__)]
    candidates = sorted(set(submodules) | set(_public_names(parent)))
    return ModuleNotFoundError(
        f"module {missing!r} does not exist: the package {parent_name}{where} imports, but has no "
        f"module {last!r}{_did_you_mean(last, candidates, prefix=f'{parent_name}.')}",
        name=missing,
    )


def _public_names(target: Any) -> list[str]:
    """The public attribute names of ``target`` (a module, class or other object)."""
    return [n for n in dir(target) if not n.startswith("_")]


def _did_you_mean(name: str, candidates: list[str], prefix: str = "") -> str:
    """``"; did you mean X?"`` for the closest of ``candidates`` (difflib), else ``""``."""
    close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    if not close:
        close = [c for c in candidates if c.lower() == name.lower()]
    return f"; did you mean {prefix}{close[0]}?" if close else ""
