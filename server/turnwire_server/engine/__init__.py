"""The turn engine: admission, the turn lifecycle, the step loop, tool calls, checkpoints, recovery.

Nothing outside ``turnwire_server`` imports it. It knows the hook contract
(``turnwire.hooks``) and interfaces (store, provider registry, tools), never a
concrete provider, tool home or store, and never gRPC.
"""

from turnwire_server.engine.engine import TurnEngine, TurnHandle
from turnwire_server.engine.request import EngineSettings, TurnRequest

__all__ = ["EngineSettings", "TurnEngine", "TurnHandle", "TurnRequest"]
