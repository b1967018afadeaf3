"""Provider adapters behind one interface (:class:`Provider`), and model-id resolution."""

from server.providers.base import ModelChunk, ModelRequest, Provider, ProviderError, ToolDefinition
from server.providers.registry import ProviderRegistry, UnknownModel

__all__ = [
    "ModelChunk",
    "ModelRequest",
    "Provider",
    "ProviderError",
    "ProviderRegistry",
    "ToolDefinition",
    "UnknownModel",
]
