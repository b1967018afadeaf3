"""The turn engine. Nothing outside ``server`` imports its internals; the public surface is here."""

from server.engine.engine import TurnEngine, TurnHandle
from server.engine.turn import EngineSettings, TurnRequest

__all__ = ["EngineSettings", "TurnEngine", "TurnHandle", "TurnRequest"]
