"""``ContextCompaction``: turn on context compaction from the config file (docs/semantics.md §9).

Its ``configure_session`` returns a :class:`turnwire.hooks.SessionConfig` whose
:class:`turnwire.compaction.CompactionConfig` is built from the options::

    middleware:
      - path: turnwire.middlewares:ContextCompaction
        options:
          strategy: summarize          # or drop_tool_outputs
          summary_model: scripted:summarizer   # default: the turn's model
          keep_recent_exchanges: 1     # summarize: exchanges kept whole
          keep_recent_steps: 1         # drop_tool_outputs: this turn's last steps kept whole
          min_output_bytes: 256        # drop_tool_outputs: smaller outputs stay
          reactive: true               # compact and re-run a turn that overflowed
          overflow_retries: 1
          proactive: true              # compact before a step near the window
          max_input_tokens: 200000     # the model's context window (needed by proactive)
          headroom: 0.9
          max_compactions: 1
          compact_after: 150000        # compact between turns past this many tokens
          token_counter: estimate      # or provider (the provider's counting API, else estimate)

Unknown options and bad values fail start-up with a message naming the option.
"""

from __future__ import annotations

import difflib
import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from turnwire.compaction import (
    CompactionConfig,
    CompactionStrategy,
    DropOldestToolOutputs,
    EstimateTokens,
    ProviderTokens,
    SummarizeOlder,
    TokenCounter,
)
from turnwire.hooks import Middleware, SessionConfig, SessionContext

log = logging.getLogger("turnwire.compaction")


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: Literal["summarize", "drop_tool_outputs"] = "summarize"
    summary_model: str | None = None
    keep_recent_exchanges: int = Field(1, ge=1)
    keep_recent_steps: int = Field(1, ge=0)
    min_output_bytes: int = Field(256, ge=0)
    reactive: bool = False
    overflow_retries: int = Field(1, ge=0)
    proactive: bool = False
    max_input_tokens: int | None = Field(None, ge=1)
    headroom: float = Field(0.9, gt=0, le=1)
    max_compactions: int = Field(1, ge=0)
    compact_after: int | None = Field(None, ge=1)
    token_counter: Literal["estimate", "provider"] = "estimate"


class ContextCompaction(Middleware):
    """Sets up the session's compaction from its options (module docstring). Raises
    :class:`ValueError` naming the option when one is unknown or invalid."""

    name = "context_compaction"

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        try:
            parsed = _Options(**options)
        except ValidationError as error:
            raise ValueError(f"ContextCompaction options: {_problems(error)}") from None
        strategy: CompactionStrategy = (
            SummarizeOlder(model=parsed.summary_model, keep_recent_exchanges=parsed.keep_recent_exchanges)
            if parsed.strategy == "summarize"
            else DropOldestToolOutputs(
                keep_recent_steps=parsed.keep_recent_steps, min_output_bytes=parsed.min_output_bytes
            )
        )
        counter: TokenCounter = ProviderTokens() if parsed.token_counter == "provider" else EstimateTokens()
        self.config = CompactionConfig(
            strategy=strategy,
            reactive=parsed.reactive,
            overflow_retries=parsed.overflow_retries,
            proactive=parsed.proactive,
            max_input_tokens=parsed.max_input_tokens,
            headroom=parsed.headroom,
            max_compactions=parsed.max_compactions,
            compact_after=parsed.compact_after,
            token_counter=counter,
        )

    async def configure_session(self, ctx: SessionContext) -> SessionConfig:
        """The session's compaction, as the options say (a warning when every layer is off)."""
        config = self.config
        if not (config.reactive or config.proactive or config.compact_after):
            log.warning(
                "ContextCompaction: reactive, proactive and compact_after are all off, so nothing is "
                "ever compacted; set reactive: true (and proactive: true with max_input_tokens, or "
                "compact_after) to turn it on"
            )
        return SessionConfig(compaction=config)


def _problems(error: ValidationError) -> str:
    """What is wrong with the options, each naming the option; an unknown one with the closest
    valid name and the list of valid ones."""
    known = sorted(_Options.model_fields)
    problems = []
    for problem in error.errors():
        name = ".".join(str(p) for p in problem["loc"]) or "options"
        if problem["type"] == "extra_forbidden":
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            problems.append(f"{name}: unknown option; {hint}valid options: {', '.join(known)}")
        else:
            problems.append(f"{name}: {problem['msg']}")
    return "; ".join(problems)
