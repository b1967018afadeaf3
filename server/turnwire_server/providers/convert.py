"""Helpers shared by the adapters' request builders and stream decoders.

The transcript arrives as proto ``Message``s (``protos/turnwire/v1/message.proto``):
an assistant message holds all steps of one turn, each starting with a
``step_start`` part; a ``tool_call`` part carries the call and, once known, its
result (``output`` or ``error_text``). :func:`assistant_steps` cuts such a message
into steps, so each adapter can emit "assistant turn, then its tool results" per
step as its API requires.

Also here: tool results as text (JSON values by :mod:`turnwire.values`),
files as base64 / data URLs, the deferred tool-call finalization every adapter
uses (a call is parsed only when the step's finish reason is known, so a call cut
off by the output limit is never run with partial input), and the finish step.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson

from turnwire.errors import INTERRUPTED_TOOL_ERROR
from turnwire.providers import ProviderError, unique_id
from turnwire.types import FinishReason, FinishStep, ModelChunk, ToolCall, Usage
from turnwire.values import dumps, loads, parse_tool_input, tool_call_input, tool_call_output_json
from turnwire_client.v1 import message_pb2
from turnwire_server.cache_budget import CACHES, CacheBudget
from turnwire_server.providers.json_schema import validate
from turnwire_server.providers.kept import KeptByObject

TRUNCATED_TOOL_CALL_ERROR = (
    "The tool call was cut off by the output token limit before its input was complete, "
    "so it was not run. Call the tool again with complete input."
)
"""The error a tool call gets when its step stopped at the output limit (never repaired, never run)."""


DENIED_TOOL_ERROR = "Tool execution denied by user"
"""Sent as the (error) result of a denied call that has no reason of its own (docs/semantics.md §6)."""

EMPTY_USER_TEXT = "(empty message)"
"""Stands in for a user turn with no content at all (an empty ``Chat`` text): APIs reject empty turns."""

EMPTY_TOOL_RESULT = "(empty result)"
"""Stands in for a tool result that is empty or only whitespace (docs/semantics.md §11): Anthropic rejects
whitespace-only text, and several OpenAI-compatible servers reject an empty ``tool`` message."""


def is_blank(text: str) -> bool:
    """True for "" and whitespace-only text, which the APIs refuse as a text block or a tool result."""
    return not text or text.isspace()


# --- transcript --------------------------------------------------------------

_T = TypeVar("_T")

CACHED_MESSAGE_BYTES = 65_536
"""Messages larger than this (serialized; files inline) are converted afresh each time, not kept."""

CONVERSION_OVERHEAD_BYTES = 850
"""RSS a kept conversion costs beyond its message's serialized bytes (its text is copied into
the wire dicts once) and the budget's own entry: the dicts and lists of the wire form.
``bench/cache_entry_sizes.py`` measured 1,230 bytes of RSS per conversion of a 150-byte text
message and 5,150 per 4 KiB one (CPython 3.11): serialized bytes + 200 + about 830 each."""

PREFIX_BYTES_PER_MESSAGE = 32
"""RSS a kept prefix state costs per message it covers: the held list of messages and the
state's tuple of wire turns (references; the turns themselves are the kept conversions)."""

PREFIX_OVERHEAD_BYTES = 1_300
"""RSS a kept prefix state costs beyond its per-message references: the state object, its sets of
call ids and its entry (``bench/cache_entry_sizes.py``: 330 bytes per message for states of 10
messages; these constants count 364)."""

_S = TypeVar("_S")


def per_message_cache(
    convert: Callable[[message_pb2.Message], _T], name: str, budget: CacheBudget = CACHES
) -> Callable[[message_pb2.Message], _T]:
    """``convert`` (a pure function of a message's content), with the results for the most recently
    converted messages kept in ``budget`` (a region named ``name``), each counting its message's
    serialized bytes plus :data:`CONVERSION_OVERHEAD_BYTES` (least recently used dropped first,
    with the other caches of conversations, issue 32 item 11; issue 17: a turn must not convert
    its whole history again). Keyed by the
    message object itself, held by its entry (so its ``id()`` is not reused while kept): the
    messages a request carries are read-only (``ModelRequest.messages``; the store hands out
    shared objects and a changed message is always a new object: a checkpoint, a hook's change,
    another replica's write), so an object stands for its content, and finding it costs no
    serialization. A message over :data:`CACHED_MESSAGE_BYTES` is not kept. The results are
    shared: callers must never mutate them (copy what they change). Not thread-safe: call it
    from the event loop."""
    kept: KeptByObject[message_pb2.Message, _T] = KeptByObject(name, budget)

    def cached(message: message_pb2.Message) -> _T:
        entry = kept.get(id(message))
        if entry is not None:  # the very object: its entry holds it, so the id was not reused
            return entry[1]
        result = convert(message)
        length = message.ByteSize()
        if length <= CACHED_MESSAGE_BYTES:
            kept.put(message, result, length + CONVERSION_OVERHEAD_BYTES)
        return result

    return cached


class PrefixStates(Generic[_S]):
    """An adapter's conversion state after the messages of its recent requests, so a request that
    starts with the very message objects of an earlier one converts only the messages after them
    (issue 17: a turn's work independent of history length; the history is the same objects from
    turn to turn while it is only appended to, ``store/core/message_cache.py``).

    Kept by the request's first message object (``per_first`` states each, most recent first, with
    the ``extra`` they were made with, e.g. the system prompt) in ``budget`` (a region named
    ``name``), each first message's states counting :data:`PREFIX_BYTES_PER_MESSAGE` per message
    and :data:`PREFIX_OVERHEAD_BYTES` per state (issue 32 item 11). A state is used only when
    its messages are, one by one, the very objects the new request starts with (or equal in
    content): an edit, a deletion, a compaction or another replica's write makes new objects (or
    a different first message), so a miss. Holding the messages keeps their ``id()`` from being
    reused. States must be immutable snapshots (the caller copies what it goes on changing). Not
    thread-safe: the event loop's."""

    def __init__(self, name: str, *, budget: CacheBudget = CACHES, per_first: int = 4) -> None:
        self.per_first = per_first
        # Each held prefix is a list (never changed): the engine's requests carry lists, and a
        # list compares with a slice of another in one copy. An entry's list of states is
        # replaced, never changed, once kept.
        self.region = budget.region(name)

    def longest(self, messages: Sequence[message_pb2.Message], extra: object) -> tuple[int, _S | None]:
        """``(n, state)``: the kept state of the longest prefix of ``messages`` (``n`` messages)
        made with an equal ``extra``; ``(0, None)`` when none."""
        if not messages:
            return 0, None
        entries: list[tuple[list[message_pb2.Message], object, _S]] | None
        entries = self.region.get(id(messages[0]))  # type: ignore[assignment]
        if entries is None:
            return 0, None
        best: tuple[int, _S | None] = (0, None)
        for held, held_extra, state in entries:
            length = len(held)
            # A list compare, in C: the very objects pass at once; another object equal in
            # content (then converted alike) passes by the content compare.
            if best[0] < length <= len(messages) and held_extra == extra:
                prefix = messages[:length]
                if held == (prefix if isinstance(prefix, list) else list(prefix)):
                    best = (length, state)
        return best

    def keep(self, messages: Sequence[message_pb2.Message], extra: object, state: _S) -> None:
        """Keep ``state``, the conversion state after all of ``messages`` with ``extra``."""
        if not messages:
            return
        held = list(messages)
        key = id(held[0])
        kept: list[tuple[list[message_pb2.Message], object, _S]] | None
        kept = self.region.get(key)  # type: ignore[assignment]
        entries = [(held, extra, state), *(kept or ())][: self.per_first]
        size = sum(len(entry[0]) for entry in entries) * PREFIX_BYTES_PER_MESSAGE
        self.region.put(key, entries, size + len(entries) * PREFIX_OVERHEAD_BYTES)


def assistant_steps(message: message_pb2.Message) -> list[list[message_pb2.Part]]:
    """The parts of an assistant message grouped by step (``step_start`` parts dropped, empty steps too)."""
    steps: list[list[message_pb2.Part]] = [[]]
    for part in message.parts:
        if part.WhichOneof("kind") == "step_start":
            if steps[-1]:
                steps.append([])
        else:
            steps[-1].append(part)
    return [step for step in steps if step]


def text_of(parts: Iterable[message_pb2.Part]) -> str:
    """The text of the text parts among ``parts``, joined as is (other parts are skipped)."""
    return "".join(p.text.text for p in parts if p.WhichOneof("kind") == "text")


def tool_result(call: message_pb2.ToolCallPart) -> tuple[str, bool]:
    """``(content, is_error)`` to send back for a call: its output as text (JSON unless a string),
    its error text, or an interruption error when it has no result. Never blank: an empty or
    whitespace-only result is :data:`EMPTY_TOOL_RESULT` (docs/semantics.md §11)."""
    state = call.state
    if state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
        # Exactly the tool's JSON (docs/semantics.md §11), not a double-rounded view of it.
        text = tool_call_output_json(call) or "null"
        output = loads(text)
        if isinstance(output, str):
            return (EMPTY_TOOL_RESULT if is_blank(output) else output), False
        return text, False
    if state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
        return ("The tool call failed." if is_blank(call.error_text) else call.error_text), True
    if state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
        return (DENIED_TOOL_ERROR if is_blank(call.error_text) else call.error_text), True
    return INTERRUPTED_TOOL_ERROR, True


def tool_input(call: message_pb2.ToolCallPart) -> dict[str, Any]:
    """The call's input as a JSON object, exactly (``{}`` when it was invalid and only
    ``raw_input`` is kept)."""
    return tool_call_input(call)


def tool_arguments(call: message_pb2.ToolCallPart) -> str:
    """The call's input as JSON text: the model's own text when kept (what the model sent is what
    is replayed to it, docs/semantics.md §11)."""
    return call.input_json or dumps(tool_input(call))


def file_base64(file: message_pb2.FilePart) -> str:
    """The file's bytes as base64 text."""
    return base64.b64encode(file.data).decode("ascii")


def file_url(file: message_pb2.FilePart) -> str:
    """The file's URL, or a ``data:`` URL of its bytes."""
    if file.WhichOneof("content") == "url":
        return file.url
    return f"data:{file.media_type or 'application/octet-stream'};base64,{file_base64(file)}"


def file_text(file: message_pb2.FilePart) -> str | None:
    """The text of an inline ``text/*`` (or JSON) file, None for other files."""
    media = file.media_type
    if file.WhichOneof("content") == "data" and (media.startswith("text/") or media == "application/json"):
        return file.data.decode("utf-8", "replace")
    return None


def provider_options(options: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    """The request's ``provider_options`` for this adapter: the entries under each of ``keys`` merged in
    order (configured provider name, then the provider type). Other providers' entries are ignored."""
    merged: dict[str, Any] = {}
    for key in keys:
        entry = options.get(key)
        if isinstance(entry, Mapping):
            merged.update(entry)
    return merged


class CallIds:
    """Gives every tool call of a step its own id (docs/semantics.md §11, tool call identity).

    Providers may hand out one id twice: two parallel calls with the same id (OpenAI-compatible
    servers), an id already used earlier in the transcript (servers that number calls ``call_0``
    per response), or none at all. Each call keeps the provider's id unless ``taken`` (the ids in
    the request's transcript) or an earlier call of this step has it; then it gets the first free
    ``<id>_2``, ``<id>_3`` …, and ``renamed`` maps the new id to the provider's. The engine, the
    client and every later request use the new id, so each call is paired with its own result; the
    APIs match calls and results only within a request, so no API needs the provider's id back
    (it is reported in ``FinishStep.provider_metadata[...]["tool_call_ids"]``).
    """

    __slots__ = ("renamed", "taken")

    def __init__(self, taken: Iterable[str] = ()) -> None:
        self.taken = set(taken)
        self.renamed: dict[str, str] = {}

    def assign(self, original: str, fallback: str) -> str:
        """The id of a new call whose provider id is ``original`` (``fallback`` when it has none)."""
        candidate = unique_id(original or fallback, self.taken)
        if original and candidate != original:
            self.renamed[candidate] = original
        return candidate


class ReplayIds:
    """Tool call ids for one request: each stored call gets an id used by no other call of the request
    (the first holder keeps its own; a repeat gets ``<id>_2`` …), the same for the call and its result.
    A transcript stored before ids were made unique, or moved from a provider that reuses ids, would
    otherwise pair two calls with one result (docs/semantics.md §11)."""

    __slots__ = ("used",)

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, original: str) -> str:
        return unique_id(original or "call", self.used)


# --- stream state --------------------------------------------------------------


@dataclass(slots=True)
class PendingCall:
    """A tool call whose input is streaming. ``parts`` are the raw JSON fragments."""

    tool_call_id: str
    tool_name: str
    parts: list[str] = field(default_factory=list)
    final: str | None = None  # the complete input text, when the provider sends it at the end

    def raw(self) -> str:
        """The complete input text."""
        return self.final if self.final is not None else "".join(self.parts)


def finish_tool_calls(calls: Sequence[PendingCall], truncated: bool) -> Iterator[ModelChunk]:
    """The ToolCall chunks of a finished step; when ``truncated`` (an output limit stopped the step) every
    call gets :data:`TRUNCATED_TOOL_CALL_ERROR` and no input, so none is run."""
    for call in calls:
        raw = call.raw()
        if truncated:
            yield ToolCall(
                call.tool_call_id, call.tool_name, None, raw_input=raw, error=TRUNCATED_TOOL_CALL_ERROR
            )
            continue
        parsed, error = parse_tool_input(raw)
        yield ToolCall(call.tool_call_id, call.tool_name, parsed, raw_input=raw or "{}", error=error)


def finish_step(
    reason: FinishReason,
    *,
    raw_reason: str,
    usage: Usage,
    response_id: str,
    response_model: str,
    metadata: dict[str, Any],
    warnings: Sequence[str],
    paused: bool = False,
) -> FinishStep:
    """The FinishStep chunk; ``warnings`` are settings the API has no field for; ``paused``: the
    provider paused its turn and the engine goes on with another step (``FinishStep.paused``)."""
    return FinishStep(
        finish_reason=reason,
        raw_finish_reason=raw_reason,
        usage=usage,
        response_id=response_id,
        response_model=response_model,
        provider_metadata=metadata or None,
        warnings=tuple(warnings),
        paused=paused,
    )


def as_int(value: Any) -> int:
    """An int from a usage field that may be missing or null."""
    return value if isinstance(value, int) else 0


def check_structured_output(provider: str, text: str, schema: Mapping[str, Any]) -> None:
    """Raise ProviderError (type ``structured_output_invalid``) unless ``text`` is JSON that ``schema``
    accepts."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as error:
        problems = [f"not valid JSON: {error}"]
    else:
        problems = validate(value, schema)
    if problems:
        raise ProviderError(
            f"{provider}: the structured output does not match the schema: {'; '.join(problems)}",
            status=0,
            type="structured_output_invalid",
            retryable=False,
            body=text,
            provider=provider,
        )
