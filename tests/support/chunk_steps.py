"""A provider double that streams given model chunks, one list per model call: for engine tests
of what the engine does with chunk orders the adapters produce (or a provider of one's own)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence

from turnwire import types as chunks
from turnwire.providers import ModelRequest


class Steps:
    """A provider (``chunks:<any>``) that streams one list of chunks per model call; ``requests``
    records what each call was sent."""

    def __init__(self, *steps: Sequence[chunks.ModelChunk]) -> None:
        self.steps = list(steps)
        self.requests: list[ModelRequest] = []

    def has_model(self, model: str) -> bool:
        return True

    async def stream(self, request: ModelRequest) -> AsyncGenerator[chunks.ModelChunk, None]:
        self.requests.append(request)
        for chunk in self.steps[len(self.requests) - 1]:
            yield chunk

    async def aclose(self) -> None:
        return None
