"""Reasoning written inline in the answer text as ``<think>…</think>``, split out as it streams.

Open reasoning models served without a reasoning parser (text-generation-inference, vLLM
started without ``--reasoning-parser``, Groq with ``reasoning_format: raw``, llama.cpp with
``--reasoning-format none``) stream their chain of thought in ``content`` between tags, e.g.
DeepSeek-R1 and Qwen3: ``<think>\\nreasoning\\n</think>\\n\\nanswer``. A provider entry that opts in
(``inline_reasoning_tag``, docs/providers.md) runs its text deltas through an
:class:`InlineReasoning`, which says which pieces are reasoning and which are text.

Rules:

- A tag may be split across deltas at any character (``"<thi"`` then ``"nk>"``): the unfinished
  end of a delta that could begin a tag is held until the next delta says whether it does.
- Whitespace next to a tag, and at the start and the end of the output, is dropped: it
  separates the tags from what they enclose, it is not part of the reasoning or the answer.
  So whitespace at the end of a delta is held until the next delta shows what follows it.
- Several ``<think>`` segments may occur; what the stream leaves open at its end is reasoning.
- ``starts_inside``: the output begins inside the reasoning with no opening tag, for chat
  templates that put the opening tag in the prompt (DeepSeek-R1, QwQ: the generation prompt
  ends with ``<think>\\n``).

Only an entry that opts in pays: one ``str.find`` per delta, plus a suffix check when the delta
ends near a ``<``.
"""

from __future__ import annotations

import re

Piece = tuple[bool, str]
"""``(is_reasoning, text)``: one run of reasoning or answer text, in stream order."""

TAG_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.:-]{0,63}")
"""What :class:`InlineReasoning` accepts as a tag name (``think``, ``thinking``, ``reasoning``)."""


class InlineReasoning:
    """Splits one step's streamed text into reasoning and answer pieces (see the module
    docstring). ``tag`` is the tag's name, without brackets. Raises ValueError for a name that
    is not :data:`TAG_NAME`. Not shared: one per stream decoder."""

    __slots__ = ("_close", "_held", "_open", "_skip_space", "_space", "inside")

    def __init__(self, tag: str, *, starts_inside: bool = False) -> None:
        if not TAG_NAME.fullmatch(tag):
            raise ValueError(f"inline reasoning tag {tag!r} is not a tag name (letters, digits, _.:-)")
        self._open = f"<{tag}>"
        self._close = f"</{tag}>"
        self.inside = starts_inside
        self._held = ""  # the end of the last delta, when it may begin a tag
        self._space = ""  # whitespace at the end of the last piece: kept unless a tag follows
        self._skip_space = True  # after a tag (and at the start): leading whitespace is dropped

    def push(self, text: str) -> list[Piece]:
        """The pieces of ``text`` (a delta), in order; a possible tag start at its end is held."""
        pieces: list[Piece] = []
        buffer = self._held + text if self._held else text
        self._held = ""
        while buffer:
            tag = self._close if self.inside else self._open
            found = buffer.find(tag)
            if found < 0:
                keep = _partial_tag(buffer, tag)
                if keep:
                    self._held = buffer[-keep:]
                    buffer = buffer[:-keep]
                self._piece(pieces, buffer)
                break
            self._piece(pieces, buffer[:found])
            buffer = buffer[found + len(tag) :]
            self.inside = not self.inside
            self._space = ""
            self._skip_space = True
        return pieces

    def flush(self) -> list[Piece]:
        """What is held at the end of the output (a tag's beginning that never finished)."""
        held, self._held = self._held, ""
        pieces: list[Piece] = []
        self._piece(pieces, held)
        return pieces

    def _piece(self, pieces: list[Piece], text: str) -> None:
        if self._skip_space:
            text = text.lstrip()
            if not text:
                return
            self._skip_space = False
        elif self._space:
            text = self._space + text
        body = text.rstrip()
        self._space = text[len(body) :]
        if body:
            pieces.append((self.inside, body))


def _partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that begins ``tag`` (0 when none). A tag holds one
    ``<`` (its first character), so only the last ``<`` near the end can begin it."""
    start = text.rfind("<", max(0, len(text) - len(tag) + 1))
    return len(text) - start if start >= 0 and tag.startswith(text[start:]) else 0
