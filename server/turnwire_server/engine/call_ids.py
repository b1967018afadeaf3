"""A turn's tool call ids kept unique, whatever the provider sent (docs/semantics.md §11, "Tool
call identity").

The adapters give each call an id no call of the request's transcript has
(:func:`turnwire.providers.unique_id`), but they see only what the request carries: a provider of
one's own may not apply the rule, and a ``before_step`` hook may send a transcript without the
turn's earlier calls, so a server that numbers its calls per response (``call_0``) repeats one.
A repeat reaching the engine would overwrite the earlier call's input and share its result; so the
turn gives such a call the first free ``<id>_2``, ``<id>_3`` … instead, and the rest of that call's
chunks follow it: its input deltas and complete form, and a provider's result, also one that comes
in a later step (Anthropic's ``pause_turn``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import TypeVar

from turnwire import types as chunks
from turnwire.providers import unique_id

log = logging.getLogger("turnwire.turn")

__all__ = ["TurnCallIds"]

C = TypeVar("C", chunks.ToolInputStart, chunks.ToolInputDelta, chunks.ToolCall, chunks.ToolResult)


class TurnCallIds:
    """One turn's renames of repeated tool call ids.

    ``state_of(id)`` tells whether the turn has a call under ``id``: None when not, True while its
    input is still streaming, False once complete; ``awaits_result(id)`` whether that call is the
    provider's own and has no result yet; ``taken()`` gives every id the turn and the step's
    transcript hold (asked only when a rename is needed). ``provider`` names the current step's
    provider for the log. Each method takes a chunk and returns it, or a copy under the call's
    new id.
    """

    __slots__ = ("_awaits_result", "_renamed", "_state_of", "_taken", "provider")

    def __init__(
        self,
        state_of: Callable[[str], bool | None],
        awaits_result: Callable[[str], bool],
        taken: Callable[[], Iterable[str]],
    ) -> None:
        self._state_of = state_of
        self._awaits_result = awaits_result
        self._taken = taken
        self.provider = ""
        self._renamed: dict[str, str] = {}  # the provider's id -> the turn's call last given it

    def start(self, chunk: chunks.ToolInputStart) -> chunks.ToolInputStart:
        """A new call whose input streams: renamed when the turn has its id."""
        if self._state_of(chunk.tool_call_id) is None:
            return chunk
        return self._rename(chunk)

    def delta(self, chunk: chunks.ToolInputDelta) -> chunks.ToolInputDelta:
        """Input text of the call last started under its id."""
        renamed = self._renamed.get(chunk.tool_call_id) if self._renamed else None
        return chunk if renamed is None else dataclasses.replace(chunk, tool_call_id=renamed)

    def call(self, chunk: chunks.ToolCall) -> chunks.ToolCall:
        """A complete call: of the call streaming under its id (the call renamed from it, or the
        turn's call still streaming under it), else a new call, renamed when the turn has its id."""
        renamed = self._renamed.get(chunk.tool_call_id)
        if renamed is not None and self._state_of(renamed):
            return dataclasses.replace(chunk, tool_call_id=renamed)
        if self._state_of(chunk.tool_call_id) is False:
            return self._rename(chunk)
        return chunk

    def result(self, chunk: chunks.ToolResult) -> chunks.ToolResult:
        """A provider-executed call's result: of the call renamed from its id when that call is
        the provider's own and still awaits its result (in this step or a later one)."""
        renamed = self._renamed.get(chunk.tool_call_id) if self._renamed else None
        if renamed is not None and self._awaits_result(renamed):
            return dataclasses.replace(chunk, tool_call_id=renamed)
        return chunk

    def _rename(self, chunk: C) -> C:
        original = chunk.tool_call_id
        renamed = unique_id(original, set(self._taken()))
        self._renamed[original] = renamed
        log.warning(
            "provider %s gave a second tool call of the turn the id %r; it is %r in this turn"
            " (docs/semantics.md §11)",
            self.provider,
            original,
            renamed,
        )
        return dataclasses.replace(chunk, tool_call_id=renamed)
