"""Compaction inside a turn: the view of the history the model is sent, and compacting it
(docs/semantics.md §9).

:func:`apply_compaction` turns the stored messages and the conversation's
:class:`~turnwire_server.store.records.CompactionRecord` into the view (summary + recent tail,
dropped tool outputs). :class:`Compactor` runs the session's strategy on a view, stores the new
record (the messages never change), emits ``ContextCompacted`` and counts it. The engine calls
it for the three triggers: ``threshold`` (between turns, ``compact_after``), ``proactive``
(before a step) and ``reactive`` (after a ``context_overflow``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable, Sequence
from typing import Literal

from turnwire import types as chunks
from turnwire.compaction import (
    SUMMARY_ID_PREFIX,
    SUMMARY_REQUEST_ID,
    CallKey,
    CompactionConfig,
    CompactionContext,
    CompactionResult,
    EstimateTokens,
    elide_outputs,
)
from turnwire.providers import ModelRequest, ProviderError
from turnwire.types import Cost, Usage
from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine import metrics
from turnwire_server.engine.cost import CostTotal, PriceBook
from turnwire_server.engine.events import EventWriter
from turnwire_server.hooks.readonly import MessagesView
from turnwire_server.providers.registry import ProviderRegistry
from turnwire_server.store.records import CompactionRecord, TurnAdmission
from turnwire_server.store.transcripts import TranscriptStore

log = logging.getLogger("turnwire.compaction")

CompactionTrigger = Literal["reactive", "proactive", "threshold"]
"""Why a history is compacted: an overflow, the proactive guard, or ``compact_after``."""

_REASONS = {
    "reactive": event_pb2.COMPACTION_REASON_REACTIVE,
    "proactive": event_pb2.COMPACTION_REASON_PROACTIVE,
    "threshold": event_pb2.COMPACTION_REASON_THRESHOLD,
}

_SUMMARY_REQUEST = "Write the summary of the conversation above now, as instructed."


def apply_compaction(
    history: Sequence[message_pb2.Message], record: CompactionRecord | None
) -> list[message_pb2.Message]:
    """The view of ``history`` under ``record``: its summary in place of the messages through
    ``through_message_id``, then the rest, outputs of ``elided_calls`` dropped. A record whose
    ``through_message_id`` is no longer in the history (the transcript was edited) contributes
    only its dropped outputs: the model then sees those messages whole."""
    if record is None:
        return list(history)
    view = list(history)
    if record.summary is not None:
        index = next((i for i, m in enumerate(view) if m.id == record.through_message_id), None)
        if index is not None:
            view = [record.summary, *view[index + 1 :]]
    elided = frozenset(record.elided_calls)
    return [elide_outputs(m, elided) for m in view] if elided else view


def input_start(view: Sequence[message_pb2.Message], input_ids: Sequence[str]) -> int:
    """Index in ``view`` of the first of this turn's input messages (``input_ids``); without
    any (a continuation), of the last message: what compaction must keep.

    Searched from the end, where the input is, stopping once every input id was seen (message
    ids are unique in a conversation): a turn costs the length of its input, not of the view."""
    remaining = set(input_ids)
    first: int | None = None
    for index in range(len(view) - 1, -1, -1):
        if not remaining:
            break
        message_id = view[index].id
        if message_id in remaining:
            remaining.discard(message_id)
            first = index
    return first if first is not None else max(len(view) - 1, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class Compacted:
    """One compaction's outcome: the new ``view`` (with ``keep_from`` re-based), the outputs
    dropped from this turn's reply (``elided_current``), whether it ``shortened`` the view,
    the counted tokens before and after, and the summarizer's usage and cost (they count for the
    turn)."""

    view: list[message_pb2.Message]
    keep_from: int
    elided_current: frozenset[CallKey]
    shortened: bool
    tokens_before: int
    tokens_after: int
    usage: Usage
    cost: CostTotal


class Compactor:
    """Runs the session's compaction for one turn (``config``, never None here); ``metric_models``
    labels the summary calls' tokens (``EngineSettings.metric_models``); ``redact`` masks a
    summary call's provider error (``EngineSettings.redact``); ``prices`` prices the summary calls
    (``EngineSettings.prices``)."""

    def __init__(
        self,
        config: CompactionConfig,
        *,
        store: TranscriptStore,
        providers: ProviderRegistry,
        conversation_id: str,
        request_id: str,
        model: str,
        metric_models: frozenset[str] | None = None,
        redact: Callable[[str], str] = str,
        prices: PriceBook | None = None,
    ) -> None:
        self.config = config
        self.prices = prices if prices is not None else PriceBook()
        self._redact = redact
        self.metric_models = metric_models
        self.store = store
        self.providers = providers
        self.conversation_id = conversation_id
        self.request_id = request_id
        self.model = model
        self.record: CompactionRecord | None = None
        self._estimate = config.token_counter if isinstance(config.token_counter, EstimateTokens) else None

    async def load_view(
        self, history: Sequence[message_pb2.Message], admission: TurnAdmission | None = None
    ) -> list[message_pb2.Message]:
        """The stored compaction applied to ``history`` (read once per attempt: the record the
        turn's ``admission`` read with its input's commit, else read here)."""
        if admission is not None and admission.compaction_read:
            self.record = admission.compaction
        else:
            self.record = await self.store.load_compaction(self.conversation_id)
        return apply_compaction(history, self.record)

    async def count(self, system: str, messages: Sequence[message_pb2.Message]) -> int:
        """Input tokens of ``messages`` (and ``system``) by the session's token counter."""
        provider, model_name = self.providers.resolve(self.model)
        request = ModelRequest(model=model_name, system=system, messages=messages)
        return await self.config.token_counter.count(request, provider)

    async def compact(
        self,
        trigger: CompactionTrigger,
        *,
        system: str,
        view: Sequence[message_pb2.Message],
        keep_from: int,
        current: message_pb2.Message | None,
        elided_current: frozenset[CallKey],
        attempt: int,
        writer: EventWriter,
    ) -> Compacted:
        """Compact ``view`` (``current``: this turn's reply so far, whose dropped outputs are
        ``elided_current``); store the new record when it shortened, send ``ContextCompacted``
        and count it. A strategy that raises counts as one that could not shorten (logged):
        the caller then goes on as §9 says for that case."""
        strategy = self.config.strategy
        shown_current = elide_outputs(current, elided_current) if current is not None else None
        tail = [shown_current] if shown_current is not None else []
        before = await self.count(system, [*view, *tail])
        usage = Usage()
        cost = CostTotal()
        estimate = self._estimate or EstimateTokens()
        target = self._target(before)

        async def summarize(instructions: str, messages: Sequence[message_pb2.Message]) -> str:
            text, used, priced = await self._summarize(strategy_model, instructions, messages)
            usage.add(used)
            cost.add(priced)
            return text

        strategy_model = getattr(strategy, "model", None) or self.model
        shown = MessagesView(view)  # the strategy's: read-only, copies (hooks/readonly.py)
        try:
            result = await strategy.compact(
                CompactionContext(
                    messages=shown,
                    current=current,
                    keep_from=keep_from,
                    tokens=estimate.messages,
                    target_tokens=target,
                    summarize=summarize,
                )
            )
        except Exception as error:
            log.warning("turn %s: compaction (%s) failed: %s", self.request_id, strategy.name, error)
            result = CompactionResult()
        view = shown.settled()  # a message the strategy changed in place counts as its own
        new_view, new_keep = self._rebuilt(view, keep_from, result)
        elided = elided_current | {
            key for key in result.elided_calls if current is not None and key[0] == current.id
        }
        shown_current = elide_outputs(current, elided) if current is not None else None
        after = await self.count(system, [*new_view, *([shown_current] if shown_current is not None else [])])
        shortened = not result.empty and after < before
        if shortened:
            await self._store(trigger, view, result, before, after)
        else:
            new_view, new_keep, elided = list(view), keep_from, elided_current
            after = before
        self._announce(
            trigger, shortened=shortened, attempt=attempt, before=before, after=after, writer=writer
        )
        return Compacted(new_view, new_keep, elided, shortened, before, after, usage, cost)

    def _target(self, before: int) -> int | None:
        """What a compaction aims under: the guard's threshold when known, else half of now."""
        config = self.config
        if config.max_input_tokens:
            return int(config.max_input_tokens * config.headroom * 0.5)
        if config.compact_after:
            return int(config.compact_after * 0.5)
        return before // 2

    @staticmethod
    def _rebuilt(
        view: Sequence[message_pb2.Message], keep_from: int, result: CompactionResult
    ) -> tuple[list[message_pb2.Message], int]:
        elided = result.elided_calls
        replaced = min(max(result.replaced, 0), keep_from)  # this turn's input always stays
        head = [result.summary] if replaced and result.summary is not None else list(view[:replaced])
        rest = list(view[replaced:])
        new_view = [elide_outputs(m, elided) for m in [*head, *rest]] if elided else [*head, *rest]
        return new_view, keep_from - replaced + len(head)

    async def _store(
        self,
        trigger: CompactionTrigger,
        view: Sequence[message_pb2.Message],
        result: CompactionResult,
        before: int,
        after: int,
    ) -> None:
        previous = self.record
        through = previous.through_message_id if previous is not None else ""
        summary = previous.summary if previous is not None else None
        replaced = view[: result.replaced]
        if result.summary is not None and replaced:
            originals = [m.id for m in replaced if not m.id.startswith(SUMMARY_ID_PREFIX)]
            if originals:
                through = originals[-1]
            summary = result.summary
        elided = set(previous.elided_calls if previous is not None else ()) | set(result.elided_calls)
        record = CompactionRecord(
            conversation_id=self.conversation_id,
            through_message_id=through,
            summary=summary,
            elided_calls=tuple(sorted(elided)),
            reason=trigger,
            strategy=self.config.strategy.name,
            tokens_before=before,
            tokens_after=after,
            create_time=dt.datetime.now(dt.UTC),
        )
        await self.store.save_compaction(record)
        self.record = record

    def _announce(
        self,
        trigger: CompactionTrigger,
        *,
        shortened: bool,
        attempt: int,
        before: int,
        after: int,
        writer: EventWriter,
    ) -> None:
        event = writer.new().context_compacted
        event.reason = _REASONS[trigger]
        event.shortened = shortened
        event.attempt = attempt
        event.tokens_before = before
        event.tokens_after = after
        event.strategy = self.config.strategy.name
        metrics.COMPACTIONS.labels(trigger, self.config.strategy.name, str(shortened).lower()).inc()
        log.info(
            "turn %s: compaction reason=%s strategy=%s shortened=%s attempt=%d tokens %d -> %d",
            self.request_id,
            trigger,
            self.config.strategy.name,
            shortened,
            attempt,
            before,
            after,
            extra={
                "conversation_id": self.conversation_id,
                "request_id": self.request_id,
                "reason": trigger,
                "shortened": shortened,
                "attempt": attempt,
                "tokens_before": before,
                "tokens_after": after,
            },
        )

    async def _summarize(
        self, model: str, instructions: str, messages: Sequence[message_pb2.Message]
    ) -> tuple[str, Usage, Cost | None]:
        """Ask ``model`` for a summary of ``messages``; returns its text, usage and cost (None:
        unknown, docs/cost.md). Raises what the
        provider raises (``ProviderError``, ``UnknownModel``)."""
        provider, model_name = self.providers.resolve(model)
        request_text = message_pb2.Message(id=SUMMARY_REQUEST_ID, role=message_pb2.ROLE_USER)
        request_text.parts.add().text.text = _SUMMARY_REQUEST
        request = ModelRequest(model=model_name, system=instructions, messages=[*messages, request_text])
        pieces: list[str] = []
        usage = Usage()
        stream = provider.stream(request)
        try:
            async for chunk in stream:
                if type(chunk) is chunks.TextDelta:
                    pieces.append(chunk.delta)
                elif type(chunk) is chunks.FinishStep:
                    usage = chunk.usage
        except ProviderError as error:
            raise error.redact(self._redact) from None  # the strategy sees the masked text
        finally:
            await stream.aclose()
        label = metrics.model_label(model, self.metric_models)
        metrics.count_tokens(label, usage)
        cost = self.prices.cost(model, getattr(provider, "type", None), usage)
        metrics.count_cost(self.conversation_id, model.partition(":")[0], label, cost)
        text = "".join(pieces).strip()
        if not text:
            raise ValueError(f"the summary model {model} returned no text")
        return text, usage, cost
