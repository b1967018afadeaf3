"""Accumulates the assistant message of a turn from model chunks and tool results.

Text and reasoning deltas are kept as fragment lists and joined once per block
(appending to a protobuf string field would copy the whole text per token).
The message's parts keep emission order; tool results fill their call's part
in place, whatever order they complete in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format, struct_pb2, timestamp_pb2

from turnwire import types as chunks
from turnwire.errors import DomainError
from turnwire.values import NotJsonError, dumps, normalize, parse_tool_input, struct_view, value_view
from turnwire_client.v1 import message_pb2


@dataclass(slots=True)
class _StepParts:
    text: list[message_pb2.Part] = field(default_factory=list)
    reasoning: list[message_pb2.Part] = field(default_factory=list)
    tool_calls: list[message_pb2.Part] = field(default_factory=list)
    #: Provider-executed calls of earlier steps whose result came in this one (a paused turn).
    late_results: list[message_pb2.Part] = field(default_factory=list)
    marker: message_pb2.Part | None = None  # the step's step_start part
    start: int = -1  # the marker's index in the message's parts
    sources: list[message_pb2.SourcePart] = field(default_factory=list)
    files: list[message_pb2.FilePart] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    text_blocks: dict[str, message_pb2.Part] = field(default_factory=dict)  # block id → its part


class AssistantMessage:
    """The assistant message being built; ``message`` is the proto (parts may lag open blocks).

    Call :meth:`materialize` before reading ``message`` while blocks are open.
    """

    def __init__(self, message_id: str, create_time: timestamp_pb2.Timestamp) -> None:
        self.message = message_pb2.Message(id=message_id, role=message_pb2.ROLE_ASSISTANT)
        self.message.create_time.CopyFrom(create_time)
        self._open: dict[str, tuple[message_pb2.Part, list[str], str]] = {}
        self._tool_parts: dict[str, message_pb2.Part] = {}
        self._step = _StepParts()
        #: False when send_reasoning=False: reasoning goes back to the model within this
        #: turn (Anthropic needs signed thinking with tool use) but is never stored.
        self.store_reasoning = True

    def continue_from(self, stored: message_pb2.Message) -> None:
        """Continue the stored partial reply ``stored`` (a crash recovery, docs/semantics.md §8):
        its parts become this message's first parts, its tool calls are known by id. Call
        before the first step; ``stored`` is copied."""
        self.message.ClearField("parts")
        self.message.parts.extend(stored.parts)
        if stored.HasField("create_time"):
            self.message.create_time.CopyFrom(stored.create_time)
        for part in self.message.parts:
            if part.WhichOneof("kind") == "tool_call":
                self._tool_parts[part.tool_call.tool_call_id] = part

    @classmethod
    def resume(cls, message: message_pb2.Message) -> AssistantMessage:
        """Wrap a stored assistant ``message`` (the object itself, not a copy) so tool results can
        be recorded into it: the approved calls a continuation runs (docs/semantics.md §6)."""
        resumed = cls(message.id, message.create_time)
        resumed.message = message
        for part in message.parts:
            if part.WhichOneof("kind") == "tool_call":
                resumed._tool_parts[part.tool_call.tool_call_id] = part
        return resumed

    @property
    def has_parts(self) -> bool:
        """True once anything besides step markers was added."""
        return any(p.WhichOneof("kind") != "step_start" for p in self.message.parts)

    def start_step(self, model: str) -> None:
        """Mark a new model step, run by ``model`` (``provider:model``)."""
        marker = self.message.parts.add()
        marker.step_start.SetInParent()
        marker.step_start.model = model
        self._step = _StepParts(marker=marker, start=len(self.message.parts) - 1)

    def move_step(self, model: str) -> None:
        """Record that the current step runs on ``model`` from here on (a fallback)."""
        if self._step.marker is not None:
            self._step.marker.step_start.model = model

    @property
    def step_discardable(self) -> bool:
        """Whether :meth:`discard_step` can undo the current step: it started, and it began no
        tool call and changed no earlier step's part (a provider-executed call's late result)."""
        step = self._step
        return step.marker is not None and not step.tool_calls and not step.late_results

    def discard_step(self) -> None:
        """Drop everything the current step added after its ``step_start`` marker, for the step to
        run again from its start (a fallback after output, engine/fallback.py). Only when
        :attr:`step_discardable`; raises :class:`AssertionError` otherwise."""
        assert self.step_discardable, "the step began a tool call or changed an earlier part"
        step = self._step
        del self.message.parts[step.start + 1 :]
        self._open.clear()  # blocks are closed at every step's end: open ones are this step's
        self._step = _StepParts(marker=step.marker, start=step.start)

    def record_step(
        self,
        *,
        response_id: str,
        response_model: str,
        provider_metadata: struct_pb2.Struct | None,
        warnings: Sequence[str],
    ) -> None:
        """Write the finished step's record from the provider into its ``step_start`` part
        (``provider_metadata`` already bounded by the caller; docs/providers.md)."""
        marker = self._step.marker
        if marker is None:
            return
        record = marker.step_start
        record.response_id = response_id
        record.response_model = response_model
        if provider_metadata is not None and provider_metadata.fields:
            record.provider_metadata.CopyFrom(provider_metadata)
        record.warnings[:] = warnings

    def open_block(self, block_id: str, kind: str) -> None:
        """Open a text (``kind="text"``) or reasoning block."""
        part = self.message.parts.add()
        if kind == "text":
            part.text.SetInParent()
            self._step.text.append(part)
            self._step.text_blocks[block_id] = part
        else:
            part.reasoning.SetInParent()
            self._step.reasoning.append(part)
        self._open[block_id] = (part, [], kind)

    def append(self, block_id: str, delta: str) -> None:
        """Append ``delta`` to an open block (opening it as text when the provider skipped the start)."""
        entry = self._open.get(block_id)
        if entry is None:
            self.open_block(block_id, "text")
            entry = self._open[block_id]
        entry[1].append(delta)

    def close_block(self, block_id: str, end: chunks.ReasoningEnd | None = None) -> None:
        """Close a block, joining its fragments; a reasoning end brings its signature."""
        entry = self._open.pop(block_id, None)
        if entry is None:
            return
        part, fragments, kind = entry
        if kind == "text":
            part.text.text = "".join(fragments)
        else:
            part.reasoning.text = "".join(fragments)
            if end is not None:
                part.reasoning.signature = end.signature
                part.reasoning.redacted = end.redacted
                if end.provider_metadata:
                    part.reasoning.provider_metadata.CopyFrom(_metadata_view(end.provider_metadata))

    def materialize(self) -> None:
        """Write open blocks' text so far into their parts (blocks stay open)."""
        for part, fragments, kind in self._open.values():
            if kind == "text":
                part.text.text = "".join(fragments)
            else:
                part.reasoning.text = "".join(fragments)

    def close_all(self) -> None:
        """Close every open block (end of a step or of the turn)."""
        for block_id in list(self._open):
            self.close_block(block_id)

    def snapshot(self) -> message_pb2.Message:
        """A copy of the message as it stands, open blocks included (what the model is sent)."""
        self.materialize()
        copy = message_pb2.Message()
        copy.CopyFrom(self.message)
        return copy

    def snapshot_to_store(self) -> message_pb2.Message | None:
        """A copy for a checkpoint: like :meth:`snapshot`, without hidden reasoning; None when empty."""
        copy = self.snapshot()
        if not self.store_reasoning:
            _drop_reasoning(copy)
        return copy if _has_content(copy) else None

    def start_tool_call(
        self, tool_call_id: str, tool_name: str, provider_executed: bool = False
    ) -> message_pb2.ToolCallPart:
        """Add a tool call whose input is streaming (``provider_executed``: the provider runs it)."""
        part = self.message.parts.add()
        call = part.tool_call
        call.tool_call_id = tool_call_id
        call.tool_name = tool_name
        call.state = message_pb2.TOOL_CALL_STATE_INPUT_STREAMING
        call.provider_executed = provider_executed
        self._tool_parts[tool_call_id] = part
        self._step.tool_calls.append(part)
        return call

    def complete_tool_call(self, chunk: chunks.ToolCall) -> message_pb2.ToolCallPart:
        """Record a complete call (input available, or an input error when ``chunk.error``)."""
        part = self._tool_parts.get(chunk.tool_call_id)
        call = (
            part.tool_call if part is not None else self.start_tool_call(chunk.tool_call_id, chunk.tool_name)
        )
        call.tool_name = chunk.tool_name
        if chunk.provider_executed:
            call.provider_executed = True
        if chunk.provider_metadata:
            call.provider_metadata.CopyFrom(_metadata_view(chunk.provider_metadata))
        if chunk.input is not None:
            # The model's own text when it is this input (exact, docs/semantics.md §11); a
            # repaired call's new input otherwise.
            raw = chunk.raw_input
            same = bool(raw) and not raw.isspace() and parse_tool_input(raw)[0] == chunk.input
            call.input_json = raw if same else dumps(chunk.input)
            view = struct_view(chunk.input)
            if view is not None:
                call.input.CopyFrom(view)
            else:
                call.ClearField("input")
        else:
            call.raw_input = chunk.raw_input
        if chunk.error is not None:
            call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
            call.error_text = chunk.error
            call.raw_input = chunk.raw_input
        else:
            call.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
        return call

    def call_state(self, tool_call_id: str) -> bool | None:
        """Whether the turn has a call ``tool_call_id``: None when not, True while its input
        streams, False once it is complete."""
        part = self._tool_parts.get(tool_call_id)
        if part is None:
            return None
        return part.tool_call.state == message_pb2.TOOL_CALL_STATE_INPUT_STREAMING

    def awaits_provider_result(self, tool_call_id: str) -> bool:
        """Whether call ``tool_call_id`` is one the provider runs and has no result yet."""
        part = self._tool_parts.get(tool_call_id)
        return (
            part is not None
            and part.tool_call.provider_executed
            and part.tool_call.state
            in (message_pb2.TOOL_CALL_STATE_INPUT_STREAMING, message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE)
        )

    def tool_call_ids(self) -> list[str]:
        """The ids of the turn's calls."""
        return list(self._tool_parts)

    def tool_call(self, tool_call_id: str) -> message_pb2.ToolCallPart:
        """The stored part of call ``tool_call_id``."""
        return self._tool_parts[tool_call_id].tool_call

    def set_output(
        self, tool_call_id: str, output: Any, *, preliminary: bool = False, max_bytes: int = 0
    ) -> message_pb2.ToolCallPart:
        """Record a (preliminary) result, kept exactly as JSON text (and a ``Value`` view when exact).

        Raises :class:`~turnwire.values.NotJsonError` (naming the path) when ``output`` has no
        JSON form (NaN, Infinity, an object that cannot be serialized), and
        :class:`OutputTooLarge` when its JSON text is over ``max_bytes`` (0: no per-result
        limit) or over what is left of :data:`REPLY_BUDGET_BYTES`. The part is unchanged then.
        """
        normalized = normalize(output)
        text = dumps(normalized)
        size = len(text.encode())
        room = REPLY_BUDGET_BYTES - self.message.ByteSize()
        limit = min(max_bytes, room) if max_bytes else room
        if size > limit:
            raise OutputTooLarge(size, max(limit, 0))
        call = self._tool_parts[tool_call_id].tool_call
        call.output_json = text
        view = value_view(normalized)
        if view is not None:
            call.output.CopyFrom(view)
        else:
            call.ClearField("output")
        call.preliminary = preliminary
        call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        return call

    def set_error(self, tool_call_id: str, error_text: str) -> message_pb2.ToolCallPart:
        """Record a failed call."""
        call = self._tool_parts[tool_call_id].tool_call
        call.ClearField("output")
        call.ClearField("output_json")
        call.preliminary = False
        call.error_text = error_text
        call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
        return call

    def fail_unresolved(self, error_text: str) -> None:
        """Give every call still without a result an error (cancel, failure)."""
        for part in self._tool_parts.values():
            call = part.tool_call
            if (
                call.state
                not in (
                    message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE,
                    message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR,
                    message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED,
                )
                or call.preliminary
            ):
                self.set_error(call.tool_call_id, error_text)

    def add_source(self, chunk: chunks.Source) -> message_pb2.SourcePart:
        """Record a cited source; the text block it cites (``chunk.text_id``, of this step) gets
        that id as its ``TextPart.id``, so the stored message keeps the tie."""
        source = self.message.parts.add().source
        chunk.copy_to(source)
        cited = self._step.text_blocks.get(chunk.text_id) if chunk.text_id else None
        if cited is not None:
            cited.text.id = chunk.text_id
        elif chunk.text_id:
            source.text_id = ""  # a block of no stored text part: nothing to point at
        self._step.sources.append(source)
        return source

    def add_file(self, chunk: chunks.File) -> message_pb2.FilePart:
        """Record a file the model produced: its bytes when they fit what is left of
        :data:`REPLY_BUDGET_BYTES`, else by reference (its ``provider_file_id`` or ``url``, or no
        content; ``size_bytes`` and ``provider_metadata`` say what it was) with a step warning, so
        the stored reply stays readable by any client (docs/semantics.md §11, docs/providers.md
        "Files")."""
        room = REPLY_BUDGET_BYTES - self.message.ByteSize() - FILE_PART_OVERHEAD_BYTES
        keep = len(chunk.data) <= room
        file = self.message.parts.add().file
        chunk.copy_to(file, keep_data=keep)
        if not keep:
            where = "its provider file id" if chunk.provider_file_id else "its size and metadata only"
            self._step.warnings.append(
                f"a generated {chunk.media_type or 'file'} of {len(chunk.data):,} bytes did not fit the "
                f"reply's {REPLY_BUDGET_BYTES:,} bytes and was kept by reference ({where})"
            )
        self._step.files.append(file)
        return file

    def set_provider_result(self, chunk: chunks.ToolResult) -> message_pb2.ToolCallPart:
        """Record the result of a provider-executed call on its part (a part of its own when the
        call was never seen), with what its API needs to have it back merged into the part's
        ``provider_metadata`` per API. A result that is not JSON or too large to keep (see
        :meth:`set_output`) becomes the call's error, without its API's record of it, so the call
        goes back as one without a result (docs/providers.md). A result for a call of an earlier
        step is also one of this step's (:meth:`step_late_results`)."""
        part = self._tool_parts.get(chunk.tool_call_id)
        if part is None:
            self.start_tool_call(chunk.tool_call_id, chunk.tool_name, provider_executed=True)
            part = self._tool_parts[chunk.tool_call_id]
        elif not any(p is part for p in self._step.tool_calls):
            self._step.late_results.append(part)
        call = part.tool_call
        call.provider_executed = True
        if chunk.error is not None:
            call = self.set_error(chunk.tool_call_id, chunk.error)
        else:
            try:
                call = self.set_output(chunk.tool_call_id, chunk.output)
            except (NotJsonError, OutputTooLarge) as problem:
                return self.set_error(chunk.tool_call_id, f"the provider's result was not kept: {problem}")
        if chunk.provider_metadata:
            kept = call.provider_metadata
            merged = json_format.MessageToDict(kept) if kept.fields else {}
            for api, record in chunk.provider_metadata.items():
                previous = merged.get(api)
                merged[api] = {**previous, **record} if isinstance(previous, dict) else record
            call.provider_metadata.CopyFrom(_metadata_view(merged))
        return call

    def step_text(self) -> str:
        """The current step's text."""
        return "".join(p.text.text for p in self._step.text)

    def step_reasoning(self) -> list[message_pb2.ReasoningPart]:
        """The current step's reasoning parts."""
        return [p.reasoning for p in self._step.reasoning]

    def step_sources(self) -> list[message_pb2.SourcePart]:
        """The current step's sources, in stream order."""
        return list(self._step.sources)

    def step_files(self) -> list[message_pb2.FilePart]:
        """The current step's files, in stream order."""
        return list(self._step.files)

    def step_warnings(self) -> list[str]:
        """What the current step's record lost (a file kept by reference)."""
        return list(self._step.warnings)

    def step_tool_calls(self) -> list[message_pb2.ToolCallPart]:
        """The current step's tool calls, in emission order."""
        return [p.tool_call for p in self._step.tool_calls]

    def step_late_results(self) -> list[message_pb2.ToolCallPart]:
        """Provider-executed calls of earlier steps whose result came in the current step."""
        return [p.tool_call for p in self._step.late_results]

    def finalize(self) -> message_pb2.Message | None:
        """Close blocks, drop hidden reasoning and empty trailing markers; the message to store,
        or None when it has no content."""
        self.close_all()
        if not self.store_reasoning:
            _drop_reasoning(self.message)
        parts = self.message.parts
        # A trailing step marker with nothing after it (a failed or aborted step) carries nothing.
        while len(parts) and parts[-1].WhichOneof("kind") == "step_start":
            del parts[-1]
        return self.message if self.has_parts else None


def _metadata_view(metadata: Any) -> struct_pb2.Struct:
    """Provider metadata as a Struct; empty when it has no exact view (it is informational)."""
    try:
        view = struct_view(normalize(dict(metadata)))
    except NotJsonError:
        view = None
    return view if view is not None else struct_pb2.Struct()


REPLY_BUDGET_BYTES = 3 << 20
"""The most a stored reply may grow to through tool results: with its event envelope it stays
under gRPC's default 4 MiB message limit, so any client can read it back (docs/semantics.md §11)."""


FILE_PART_OVERHEAD_BYTES = 4096
"""Room kept beside a file's bytes for its part's other fields and the event envelope."""


class OutputTooLarge(DomainError, ValueError):
    """A tool result's JSON text is over what it may take: ``limits.max_tool_output_bytes`` per
    result, and what is left of :data:`REPLY_BUDGET_BYTES` in the turn's reply. It fails the
    call (the model sees it); no client gets it as a status."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"the tool's result is {size:,} bytes of JSON; only {limit:,} bytes may be kept for it "
            "(limits.max_tool_output_bytes per result, 3 MiB per reply), so it was not kept"
        )
        self.size = size
        self.limit = limit


def _has_content(message: message_pb2.Message) -> bool:
    return any(p.WhichOneof("kind") != "step_start" for p in message.parts)


def _drop_reasoning(message: message_pb2.Message) -> None:
    kept = [p for p in message.parts if p.WhichOneof("kind") != "reasoning"]
    if len(kept) != len(message.parts):
        copies = []
        for part in kept:
            copy = message_pb2.Part()
            copy.CopyFrom(part)
            copies.append(copy)
        del message.parts[:]
        message.parts.extend(copies)
