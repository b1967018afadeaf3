"""The output limit of a scripted model step (``ScriptStep`` in :mod:`turnwire.testing`): with
``request.settings.max_output_tokens`` set, a step stops where a real model would, at that many
output tokens, and finishes with ``length``.

The scripted model's token is a word (a run of non-space characters of a block's joined text, as
``str.split`` counts them) and a tool call is 8 tokens, the units it already estimates its usage
in. The reasoning is counted first, then the text, then each tool call whole: the first word past
the limit and everything after it (the rest of the block, the later blocks, sources, files, tool
calls) is never streamed, as a model cut off mid-answer emits nothing more; a tool call that does
not fit whole is dropped with every later one. docs/providers.md ("`scripted`") documents it.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence

TOOL_CALL_TOKENS = 8
"""What a scripted tool call counts as output, in tokens (with or without a limit)."""

CUT_FINISH_REASON = "length"
"""The raw finish reason of a cut step: OpenAI's (``length``), which the adapters map to
``FinishReason.LENGTH`` as they do Anthropic's ``max_tokens``."""

_WORD = re.compile(r"\S+")


class OutputLimit:
    """Counts one step's output against ``max_output_tokens`` (tokens; ``None``: no limit, every
    method passes everything through) and remembers whether the step was cut.

    ``used`` is the output streamed so far, in tokens (words, and :data:`TOOL_CALL_TOKENS` a tool
    call), never above the limit; ``cut`` is true once something was dropped at the limit.
    """

    def __init__(self, max_output_tokens: int | None) -> None:
        self.max_output_tokens = max_output_tokens
        self.used = 0
        self.cut = False

    def words(self, pieces: Sequence[str], *, repeat: bool = False) -> Iterator[str]:
        """The pieces of one block (reasoning or text, as streamed; over and over without end when
        ``repeat``, an ``until_cancelled`` text) up to the last word that fits: the piece holding
        the first word past the limit is cut before that word (trailing spaces dropped; nothing when
        only spaces are left) and nothing follows it. A word split across pieces counts once; each
        repetition's words count on their own (``la`` streamed again and again is a token each
        time). Nothing at all once the step was cut."""
        if self.max_output_tokens is None:
            yield from itertools.cycle(pieces) if repeat else pieces
            return
        while pieces and not self.cut:
            in_word = False
            for piece in pieces:
                for word in _WORD.finditer(piece):
                    if word.start() == 0 and in_word:
                        continue  # the rest of the previous piece's word
                    if self.used >= self.max_output_tokens:
                        self.cut = True
                        if kept := piece[: word.start()].rstrip():
                            yield kept
                        return
                    self.used += 1
                in_word = bool(piece) and not piece[-1].isspace()
                yield piece
            if not repeat:
                return

    def tool_call(self) -> bool:
        """Whether the next tool call fits whole (it is then counted); once one does not, the step
        is cut and no later call fits."""
        if self.max_output_tokens is None:
            return True
        if self.cut or self.used + TOOL_CALL_TOKENS > self.max_output_tokens:
            self.cut = True
            return False
        self.used += TOOL_CALL_TOKENS
        return True

    def cap(self, tokens: int) -> int:
        """``tokens`` (a count of output tokens) no higher than the limit."""
        return tokens if self.max_output_tokens is None else min(tokens, max(self.max_output_tokens, 0))
