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
    target: Any = importlib.import_module(module_name)
    for name in attribute.split("."):
        target = getattr(target, name)
    return target
