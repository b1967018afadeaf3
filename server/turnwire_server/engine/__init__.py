"""The turn engine: admission, the turn lifecycle, the step loop, tool calls, checkpoints, recovery.

Nothing outside ``turnwire_server`` imports it. It knows the hook contract
(``turnwire.hooks``) and interfaces (store, provider registry, tools), never a
concrete provider, tool home or store, and never gRPC.

The names below are imported on first use, so that reading the configuration (which declares
the engine's sections with ``engine/settings.py``) does not load the engine itself.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from turnwire_server.engine.engine import TurnEngine
    from turnwire_server.engine.request import TurnRequest
    from turnwire_server.engine.settings import EngineSettings
    from turnwire_server.engine.turn_handle import TurnHandle

__all__ = ["EngineSettings", "TurnEngine", "TurnHandle", "TurnRequest"]

_HOMES = {
    "EngineSettings": "settings",
    "TurnEngine": "engine",
    "TurnHandle": "turn_handle",
    "TurnRequest": "request",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
