"""Context compaction: what the model sees when the history outgrows its context window.

docs/semantics.md §9 (Think's compaction). Compaction is **non-destructive**: the stored
messages never change; the model is sent a *view* of the history in which a prefix is replaced
(by a summary message, or by copies whose oldest tool outputs are elided) and the recent tail
follows unchanged. A cut is always between whole messages, and a tool call and its result live
in the same message part (``ToolCallPart``), a reasoning block in the same assistant message
as the call it led to, so no cut ever separates them.

Configured once per process by ``configure_session`` returning
``SessionConfig(compaction=CompactionConfig(...))`` (or the built-in
:class:`turnwire.middlewares.ContextCompaction` middleware, configured from the YAML file):

- **reactive**: a turn that fails with ``context_overflow`` (``classify_chat_error``) is
  compacted and re-run, at most ``overflow_retries`` times;
- **proactive**: before every step after the first, when the previous step's input tokens
  reached ``max_input_tokens * headroom``, the history is compacted in place, at most
  ``max_compactions`` times per attempt;
- **compact_after**: between turns, when the history the model would see passes that many
  tokens (estimated by ``token_counter``).

Strategies (:class:`CompactionStrategy`): :class:`SummarizeOlder` (a model writes a summary of
the older messages) and :class:`DropOldestToolOutputs` (deterministic: the oldest tool outputs
are replaced by a short placeholder first). Token counters (:class:`TokenCounter`):
:class:`EstimateTokens` (fast, ~4 bytes per token) and :class:`ProviderTokens` (the provider's
own token-counting endpoint where its API has one, e.g. Anthropic's ``messages.count_tokens``);
usage reported by the provider drives the proactive guard.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from turnwire.error_classes import classify_error
from turnwire.providers import ModelRequest
from turnwire.values import tool_call_output_json
from turnwire_client.v1 import message_pb2

SUMMARY_ID_PREFIX = "tw-c-"
"""Ids of messages compaction made (summaries): never stored in the transcript."""

SUMMARY_REQUEST_ID = f"{SUMMARY_ID_PREFIX}request"
"""The id of the last message of a summary request (what asks the model to write the summary):
how a model double such as the scripted one tells a summary request from a turn."""

ELIDED_OUTPUT = "[tool output omitted to fit the context window: {size} bytes]"
"""What the model sees instead of a tool output :class:`DropOldestToolOutputs` dropped."""

DEFAULT_SUMMARY_INSTRUCTIONS = (
    "Summarize the conversation below for yourself, so that you can continue it without the "
    "original messages. Keep every fact, decision, open question, name, number and tool result "
    "that later turns may need; drop pleasantries. Write plain prose, at most a few paragraphs."
)


# --- token counting ----------------------------------------------------------------------------


@runtime_checkable
class TokenCountingProvider(Protocol):
    """A provider whose API counts the input tokens of a request (optional capability)."""

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """The input tokens ``request`` would use, or None when the API cannot say.
        Raises ``ProviderError`` like ``stream``."""
        ...


class TokenCounter(Protocol):
    """Counts the input tokens of a model request (the history a model would be sent)."""

    async def count(self, request: ModelRequest, provider: object) -> int:
        """Tokens of ``request`` for ``provider`` (the adapter that would receive it)."""
        ...


def message_bytes(message: message_pb2.Message) -> int:
    """The size of what a model reads of ``message``: text, reasoning, tool inputs and outputs."""
    size = 0
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            size += len(part.text.text.encode())
        elif kind == "reasoning":
            size += len(part.reasoning.text.encode())
        elif kind == "tool_call":
            call = part.tool_call
            size += len(call.tool_name) + len(call.input_json or call.raw_input)
            size += len(tool_call_output_json(call).encode()) + len(call.error_text.encode())
        elif kind in ("file", "source", "data"):
            size += part.ByteSize()
    return size


class _SchemaChars:
    """``len(str(schema))`` kept per schema object: a tool's schema is the same object at every
    step, and its text costs a few µs a tool and step otherwise. An entry holds its schema, so
    the id is not reused while it is kept; a schema changed in place keeps its old length (an
    estimate). At most ``entries`` schemas of ``chars`` characters in all (the schemas held alive
    are about that size), the oldest forgotten first; a larger one is not kept."""

    def __init__(self, entries: int = 512, chars: int = 1 << 20) -> None:
        self._kept: dict[int, tuple[object, int]] = {}
        self._entries, self._chars, self._total = entries, chars, 0

    def __call__(self, schema: object) -> int:
        kept = self._kept.get(id(schema))
        if kept is not None and kept[0] is schema:
            return kept[1]
        chars = len(str(schema))
        if chars <= self._chars:
            self._forget(id(schema))  # a dead schema's id, reused
            self._kept[id(schema)] = (schema, chars)
            self._total += chars
            while len(self._kept) > self._entries or self._total > self._chars:
                self._forget(next(iter(self._kept)))
        return chars

    def _forget(self, key: int) -> None:
        gone = self._kept.pop(key, None)
        if gone is not None:
            self._total -= gone[1]


_schema_chars = _SchemaChars()


@dataclass(frozen=True, slots=True)
class EstimateTokens:
    """The default counter: ``bytes_per_token`` bytes of text per token plus
    ``tokens_per_message`` per message (role and framing). No I/O, no vocabulary file: an
    estimate, close for English prose and JSON with the default 4 bytes per token."""

    bytes_per_token: float = 4.0
    tokens_per_message: int = 4

    def messages(self, messages: Sequence[message_pb2.Message]) -> int:
        """Estimated tokens of ``messages`` alone."""
        total = sum(message_bytes(m) for m in messages)
        return int(total / self.bytes_per_token) + self.tokens_per_message * len(messages)

    def framing(self, request: ModelRequest) -> int:
        """Estimated tokens of ``request``'s system prompt and tool definitions (what it sends
        besides its messages)."""
        tools = sum(len(t.name) + len(t.description) + _schema_chars(t.input_schema) for t in request.tools)
        return int((len(request.system) + tools) / self.bytes_per_token)

    async def count(self, request: ModelRequest, provider: object) -> int:
        """Estimated tokens of the system prompt, the messages and the tool definitions."""
        return self.messages(request.messages) + self.framing(request)


@dataclass(frozen=True, slots=True)
class ProviderTokens:
    """Asks the provider (a :class:`TokenCountingProvider`: the Anthropic adapter calls
    ``messages.count_tokens``); falls back to ``fallback`` for providers without such an API
    or when the call fails (a counting failure must never fail a turn)."""

    fallback: EstimateTokens = field(default_factory=EstimateTokens)

    async def count(self, request: ModelRequest, provider: object) -> int:
        """The provider's count, else the fallback's estimate."""
        if isinstance(provider, TokenCountingProvider):
            try:
                counted = await provider.count_tokens(request)
            except Exception:
                counted = None
            if counted is not None:
                return counted
        return await self.fallback.count(request, provider)


# --- strategies --------------------------------------------------------------------------------


CallKey = tuple[str, str]
"""A tool call in a conversation: ``(message id, tool call id)``."""

Summarize = Callable[[str, Sequence[message_pb2.Message]], Awaitable[str]]
"""``summarize(instructions, messages)``: the text a model wrote about ``messages``."""


@dataclass(frozen=True, slots=True)
class CompactionContext:
    """What a strategy works on.

    ``messages`` is the history as the model sees it now (oldest first; a previous
    compaction's summary may lead it); ``current`` is this turn's reply so far (the earlier
    steps of a multi-step turn; None before the first step); ``keep_from`` is the index of the
    first message of this turn's input, which must stay; ``tokens(messages)`` estimates tokens;
    ``target_tokens`` is what the result should fit under (None: as short as the strategy
    goes); ``summarize`` asks the session's summary model.
    """

    messages: Sequence[message_pb2.Message]
    current: message_pb2.Message | None
    keep_from: int
    tokens: Callable[[Sequence[message_pb2.Message]], int]
    target_tokens: int | None
    summarize: Summarize


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """A strategy's answer: ``messages[:replaced]`` of the context give way to ``summary``
    (the rest follows), and the outputs of the tool calls ``elided_calls`` (``(message id,
    tool call id)`` pairs, anywhere in the view, this turn's earlier steps included: a call id
    alone may repeat across turns) are replaced by :data:`ELIDED_OUTPUT`. The stored messages
    keep everything; only the view changes."""

    replaced: int = 0
    summary: message_pb2.Message | None = None
    elided_calls: frozenset[CallKey] = frozenset()

    @property
    def empty(self) -> bool:
        """True when the strategy changed nothing."""
        return not self.replaced and not self.elided_calls


class CompactionStrategy(Protocol):
    """Makes a shorter view of a history. ``name`` appears in events and metrics."""

    @property
    def name(self) -> str:
        """A short, fixed name (a metric label: never per-conversation)."""
        ...

    async def compact(self, ctx: CompactionContext) -> CompactionResult:
        """The compacted view; replacing nothing (``replaced=0``, nothing elided) means it
        could not shorten the history. Exceptions fail the compaction (the turn then ends in
        error, docs/semantics.md §9)."""
        ...


def user_boundaries(messages: Sequence[message_pb2.Message], stop: int) -> list[int]:
    """Indexes (``< stop``) of user messages that follow a non-user message: the places a cut
    may go so that the tail starts a new exchange."""
    return [
        i
        for i in range(1, stop)
        if messages[i].role == message_pb2.ROLE_USER and messages[i - 1].role != message_pb2.ROLE_USER
    ]


@dataclass(frozen=True, slots=True)
class SummarizeOlder:
    """Replace the older messages by one summary a model writes (Think's default strategy).

    Keeps the last ``keep_recent_exchanges`` exchanges (an exchange starts at a user message)
    and always this turn's input; the summary is a user message (``summary_prefix`` + the
    model's text) with an id starting :data:`SUMMARY_ID_PREFIX`. ``model`` is the summary
    model as ``provider:model`` (None: the turn's model); ``instructions`` its system prompt.
    """

    model: str | None = None
    keep_recent_exchanges: int = 1
    instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS
    summary_prefix: str = "Summary of the earlier conversation:\n"
    name: str = "summarize"

    async def compact(self, ctx: CompactionContext) -> CompactionResult:
        """Summarize ``messages`` up to the last kept exchange; nothing when there is none."""
        cuts = user_boundaries(ctx.messages, ctx.keep_from + 1)
        start = ctx.keep_from
        if (
            0 < start < len(ctx.messages)
            and start not in cuts
            and ctx.messages[start].role == message_pb2.ROLE_USER
        ):
            # This turn's input starts an exchange even after an unanswered message (one whose
            # turn failed): what came before it may be summarized.
            cuts.append(start)
        keep = max(self.keep_recent_exchanges, 1)
        if len(cuts) < keep:
            return CompactionResult()
        cut = cuts[-keep]
        older = ctx.messages[:cut]
        if all(m.id.startswith(SUMMARY_ID_PREFIX) for m in older):
            return CompactionResult()  # only an earlier summary: summarizing it again gains nothing
        text = (await self._fitting(ctx, older)).strip()
        summary = message_pb2.Message(id=f"{SUMMARY_ID_PREFIX}{older[-1].id}", role=message_pb2.ROLE_USER)
        summary.parts.add().text.text = self.summary_prefix + text
        return CompactionResult(replaced=cut, summary=summary)

    async def _fitting(
        self,
        ctx: CompactionContext,
        messages: Sequence[message_pb2.Message],
        so_far: message_pb2.Message | None = None,
    ) -> str:
        """The summary of ``messages`` (after ``so_far``, a summary of what came before them).
        When the summary request itself overflows the summary model's window, the first half is
        summarized, then the second half after that summary, recursively; each call has fewer
        messages, so this ends. Raises what ``summarize`` raises for any other error, or for a
        single message that cannot fit."""
        batch = [so_far, *messages] if so_far is not None else list(messages)
        try:
            return await ctx.summarize(self.instructions, batch)
        except Exception as error:
            if classify_error(error) != "context_overflow":
                raise
            if len(messages) < 2:
                # One message larger than the summary model's window: summarize a shortened
                # copy (its beginning and end) rather than never being able to.
                shorter = _shortened(messages[0]) if messages else None
                if shorter is None:
                    raise
                return await self._fitting(ctx, [shorter], so_far)
        middle = len(messages) // 2
        first = await self._fitting(ctx, messages[:middle], so_far)
        carried = message_pb2.Message(id=f"{SUMMARY_ID_PREFIX}so-far", role=message_pb2.ROLE_USER)
        carried.parts.add().text.text = self.summary_prefix + first
        return await self._fitting(ctx, messages[middle:], carried)


_MIN_SHORTENED = 64
"""Characters below which a text is not shortened further (the summary request then fails)."""


def _shortened(message: message_pb2.Message) -> message_pb2.Message | None:
    """A copy of ``message`` whose longest text, reasoning or tool output keeps only its first
    and last quarter (with a marker saying how much was cut); None when nothing is long enough
    to cut."""
    copy = message_pb2.Message()
    copy.CopyFrom(message)
    fields: list[tuple[Any, str, str]] = []  # (message, field, its text)
    for part in copy.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            fields.append((part.text, "text", part.text.text))
        elif kind == "reasoning":
            fields.append((part.reasoning, "text", part.reasoning.text))
        elif kind == "tool_call":
            fields.append((part.tool_call, "output_json", tool_call_output_json(part.tool_call)))
    if not fields:
        return None
    target, name, value = max(fields, key=lambda field: len(field[2]))
    if len(value) < _MIN_SHORTENED:
        return None
    quarter = len(value) // 4
    cut = len(value) - 2 * quarter
    shortened = f"{value[:quarter]} [… {cut} characters cut to fit the summary request …] {value[-quarter:]}"
    if name == "output_json":
        shortened = json.dumps(shortened)  # the output stays a JSON value (a string now)
        target.ClearField("output")
    setattr(target, name, shortened)
    return copy


@dataclass(frozen=True, slots=True)
class DropOldestToolOutputs:
    """Deterministic: replace tool outputs by :data:`ELIDED_OUTPUT`, oldest first, until the
    view fits ``target_tokens`` (without a target: every output but those of the last
    ``keep_recent_steps`` steps of this turn). Calls, inputs and errors stay, so every call is
    still paired with a result. Needs no model. Outputs under ``min_output_bytes`` stay (the
    placeholder would save nothing), so a history of short outputs and long texts cannot be
    shortened by it: combine with ``SummarizeOlder`` (or ``compact_after``) for those."""

    keep_recent_steps: int = 1
    min_output_bytes: int = 256
    name: str = "drop_tool_outputs"

    async def compact(self, ctx: CompactionContext) -> CompactionResult:
        """Drop outputs from the history first, then from this turn's earlier steps."""
        least = self.min_output_bytes
        candidates = [call for m in ctx.messages for call in _output_calls(m, min_bytes=least)]
        if ctx.current is not None:
            candidates += _output_calls(
                ctx.current, keep_recent_steps=self.keep_recent_steps, min_bytes=least
            )
        elided: set[CallKey] = set()
        if ctx.target_tokens is None:
            return CompactionResult(elided_calls=frozenset(candidates))
        base = [*ctx.messages, *([ctx.current] if ctx.current is not None else [])]
        for call_id in candidates:
            if ctx.tokens([elide_outputs(m, frozenset(elided)) for m in base]) <= ctx.target_tokens:
                break
            elided.add(call_id)
        return CompactionResult(elided_calls=frozenset(elided))


def _output_calls(
    message: message_pb2.Message, *, keep_recent_steps: int = 0, min_bytes: int = 0
) -> list[CallKey]:
    """Ids of ``message``'s tool calls that have an output of at least ``min_bytes`` not dropped
    yet, oldest first, leaving out those of the last ``keep_recent_steps`` steps."""
    steps: list[list[CallKey]] = [[]]
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "step_start":
            steps.append([])
        elif (
            kind == "tool_call"
            and _has_output(part.tool_call)
            and len(tool_call_output_json(part.tool_call).encode()) >= min_bytes
        ):
            steps[-1].append((message.id, part.tool_call.tool_call_id))
    if keep_recent_steps:
        steps = steps[: max(len(steps) - keep_recent_steps, 0)]
    return [call_id for step in steps for call_id in step]


_ELIDED_START = '"' + ELIDED_OUTPUT.split("{", 1)[0]


def _has_output(call: message_pb2.ToolCallPart) -> bool:
    """True for a call whose output the model is sent and could be dropped (in either field)."""
    if call.state != message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
        return False
    if call.output_json:
        return not call.output_json.startswith(_ELIDED_START)
    return call.HasField("output")


def elide_outputs(message: message_pb2.Message, calls: frozenset[CallKey]) -> message_pb2.Message:
    """``message`` as the model sees it once the outputs of ``calls`` are dropped: a copy when
    one of them is in it, ``message`` itself otherwise (so an unchanged view costs nothing)."""
    mine = {call_id for message_id, call_id in calls if message_id == message.id}
    if not mine or not any(
        p.WhichOneof("kind") == "tool_call" and p.tool_call.tool_call_id in mine and _has_output(p.tool_call)
        for p in message.parts
    ):
        return message
    copy = message_pb2.Message()
    copy.CopyFrom(message)
    for part in copy.parts:
        if part.WhichOneof("kind") == "tool_call" and part.tool_call.tool_call_id in mine:
            call = part.tool_call
            if _has_output(call):
                size = len(tool_call_output_json(call).encode())
                call.output_json = '"' + ELIDED_OUTPUT.format(size=size) + '"'
                call.ClearField("output")
    return copy


# --- configuration -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CompactionConfig:
    """How this process compacts histories (docs/semantics.md §9); both layers off by default.

    ``strategy``: how (default :class:`SummarizeOlder` with the turn's model).
    ``reactive`` / ``overflow_retries``: compact and re-run a turn that failed with
    ``context_overflow``, at most that many times per turn (not the SDK's ``max_retries``).
    ``proactive``: compact before a step whose previous step's input tokens reached
    ``max_input_tokens * headroom`` (equality triggers), at most ``max_compactions`` per
    attempt; needs ``max_input_tokens`` (the model's context window, tokens).
    ``compact_after``: compact between turns once the view passes that many tokens.
    ``token_counter`` counts them (also the tokens before/after in ``ContextCompacted``).
    Raises :class:`ValueError` for inconsistent values.
    """

    strategy: CompactionStrategy = field(default_factory=SummarizeOlder)
    reactive: bool = False
    overflow_retries: int = 1
    proactive: bool = False
    max_input_tokens: int | None = None
    headroom: float = 0.9
    max_compactions: int = 1
    compact_after: int | None = None
    token_counter: TokenCounter = field(default_factory=EstimateTokens)

    def __post_init__(self) -> None:
        if self.overflow_retries < 0 or self.max_compactions < 0:
            raise ValueError("overflow_retries and max_compactions must be 0 or more")
        if not 0 < self.headroom <= 1:
            raise ValueError(f"headroom must be in (0, 1], not {self.headroom}")
        if self.proactive and not self.max_input_tokens:
            raise ValueError("the proactive guard needs max_input_tokens (the model's context window)")
        if self.max_input_tokens is not None and self.max_input_tokens <= 0:
            raise ValueError("max_input_tokens must be positive")
        if self.compact_after is not None and self.compact_after <= 0:
            raise ValueError("compact_after must be positive")

    @property
    def guard_tokens(self) -> int | None:
        """Input tokens at which the proactive guard compacts (None when it is off)."""
        if not self.proactive or self.max_input_tokens is None:
            return None
        return int(self.max_input_tokens * self.headroom)
