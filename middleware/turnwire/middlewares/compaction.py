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


class _Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    strategy: Literal["summarize", "drop_tool_outputs"] = "summarize"
    summary_model: str | None = None
    keep_recent_exchanges: int = Field(1, ge=1)
    keep_recent_steps: int = Field(1, ge=0)
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
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}" for e in error.errors()
            )
            raise ValueError(f"ContextCompaction options: {problems}") from None
        strategy: CompactionStrategy = (
            SummarizeOlder(model=parsed.summary_model, keep_recent_exchanges=parsed.keep_recent_exchanges)
            if parsed.strategy == "summarize"
            else DropOldestToolOutputs(keep_recent_steps=parsed.keep_recent_steps)
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
        """The session's compaction, as the options say."""
        return SessionConfig(compaction=self.config)
