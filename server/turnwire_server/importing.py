"""Import an object named in configuration by ``package.module:attribute``."""

from __future__ import annotations

import importlib
from typing import Any


def import_object(path: str) -> Any:
    """Import ``package.module:attribute`` (the attribute may be dotted).

    Raises :class:`ImportError` or :class:`AttributeError` naming what is missing,
    and :class:`ValueError` when ``path`` has no ``:``.
    """
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{path!r} is not of the form package.module:attribute")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is None or not module_name.startswith(error.name):
            raise  # the module exists; something it imports is missing
        root = module_name.split(".")[0]
        raise ModuleNotFoundError(
            f"No module named {error.name!r}: put the folder that holds {root}.py (or the {root}/ "
            "package) on PYTHONPATH, or install it into this environment",
            name=error.name,
        ) from None
    for name in attribute.split("."):
        target = getattr(target, name)
    return target
