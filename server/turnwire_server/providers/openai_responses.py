"""The OpenAI Responses adapter (``openai`` SDK, ``AsyncOpenAI.responses``).

Follows https://platform.openai.com/docs/api-reference/responses-streaming. The SDK
sends the request (``responses.with_streaming_response.create``); the typed SSE
events (``event:`` + ``data:``, no ``[DONE]``) are decoded here with orjson.

Request (:func:`build_request`): ``instructions`` = system prompt; ``input`` items:
user messages (``input_text``, ``input_image``, ``input_file``), transcript system
messages, and per assistant step, in order: ``reasoning`` items (replayed with
their ``encrypted_content`` when ``store`` is false, by id when it is true,
dropped when neither can work), assistant text, ``function_call`` items and then
one ``function_call_output`` per call with the same ``call_id``. Tools are sent
with ``strict: false`` (strict mode rejects ordinary schemas); ``text.format``
``json_schema`` for structured output; ``include: ["reasoning.encrypted_content"]``
for reasoning models when ``store`` is false. ``seed``, ``stop``, ``top_k`` and the
penalties do not exist in this API: dropped with a warning.

Stream: ``response.created`` (id, model) → ``response.output_item.added`` per item
(reasoning → ReasoningStart, function_call → ToolInputStart with its ``call_id``)
→ ``response.output_text.delta`` / ``response.reasoning_summary_text.delta`` /
``response.reasoning_text.delta`` / ``response.function_call_arguments.delta`` (routed by
``output_index``, else ``item_id``) → ``response.output_item.done`` (reasoning → ReasoningEnd
with the encrypted content as signature and ``provider_metadata={"openai": {"item_id"}}``, plus
``"text_field": "content"`` when its text came as ``reasoning_text``; the call's final
arguments; a message's ``output_text`` annotations not streamed as
``response.output_text.annotation.added``; an ``image_generation_call``'s ``result`` → File;
a ``code_interpreter_call``'s image outputs → File by URL) → ``response.completed`` |
``response.incomplete`` | ``response.failed``; each annotation → a Source tied to its text block
(:mod:`~turnwire_server.providers.openai_annotations`);
an ``error`` event (top-level or nested ``error`` object) is a ProviderError.

Finish: completed → stop, or tool-calls when calls were made (raw ``completed``);
incomplete ``max_output_tokens`` → length (every call errored, never run),
``content_filter`` → content-filter; refusals → content-filter (the refusal text
and ``incomplete_details`` kept in ``provider_metadata["openai"]``).

Tolerance (docs/semantics.md §11): a ``call_id`` the turn already has gets
``<id>_2``; every item is matched by its output index, so a repeated item id does not
merge two calls and an id that changes from event to event (some gateways) does not
split one text into a block per delta; a character split between two deltas is joined
(:mod:`turnwire_server.providers.wire`); a whole ``response`` body instead of a
stream is one step (:meth:`ResponsesDecoder.whole`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import openai

from turnwire.providers import ModelRequest, ProviderError, transcript_call_ids
from turnwire.types import (
    FinishReason,
    ModelChunk,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolCall,
    ToolInputDelta,
    ToolInputStart,
)
from turnwire_server.providers import errors
from turnwire_server.providers import openai_responses_items as built_in
from turnwire_server.providers.convert import CallIds, PendingCall, finish_tool_calls
from turnwire_server.providers.openai_annotations import annotation_source, image_file
from turnwire_server.providers.openai_common import (
    OpenAIDecoder,
    ReplayReasoningSetting,
    map_openai_error,
    openai_usage,
)
from turnwire_server.providers.openai_responses_request import EncryptedReasoning, build_request
from turnwire_server.providers.streaming import NOTHING, OpenStream, SdkCall, SdkProvider
from turnwire_server.providers.wire import TextJoiner, clean_strings, clean_text, load_json


def _item(event: Mapping[str, Any]) -> int | str:
    """The output item an event belongs to: its ``output_index`` ("the index of the output item",
    on every delta and done event of the streaming reference), else its ``item_id``. Not the item id
    first: some OpenAI-compatible gateways give an item a new id on every event."""
    index = event.get("output_index")
    return index if isinstance(index, int) else event.get("item_id") or ""


class ResponsesDecoder(OpenAIDecoder):
    """Responses stream events → chunks (see the module docstring)."""

    def __init__(
        self,
        provider: str,
        prefix: str,
        output_schema: Mapping[str, Any] | None,
        warnings: list[str],
        taken_ids: Collection[str] = (),
    ):
        super().__init__(provider, prefix, output_schema, warnings)
        # Items are matched by output index, never by item id: some gateways give an item a new id on
        # every event (docs/providers.md, "Item ids"). Keys are the output index, or the item id for
        # an event that has no index.
        self.texts: dict[tuple[int | str, int], str] = {}  # open text blocks: (item, content index) → id
        self.reasoning: dict[int | str, tuple[str, int]] = {}  # item → (block id, last part index)
        self.reasoning_fields: dict[str, str] = {}  # reasoning block id → the item field its text is in
        self.calls: list[PendingCall] = []  # function calls, in order
        # Calls by output index (what deltas and done events name first) and by item id: a repeated item
        # id must not merge two calls into one (docs/semantics.md §11).
        self.call_at: dict[int, PendingCall] = {}
        self.call_of_item: dict[str, PendingCall] = {}
        self.built_ins: dict[int | str, str] = {}  # built-in tool items (by output index) → call id
        self.client_run = 0  # calls of built-ins the application runs (shell_call …)
        self.phases: list[dict[str, str]] = []  # message items' phase (commentary, final_answer)
        self.logprobs: list[Any] = []  # output_text.delta logprobs, when the request asked for them
        self.text_blocks: dict[
            tuple[int | str, int], str
        ] = {}  # every text block: (item, content index) → id
        self.annotated: set[tuple[int | str, int, int]] = set()  # (item, content index, annotation index)
        self.sources = 0
        self.refused = False
        self.refusal: list[str] = []
        self.ids = CallIds(taken_ids)
        self.join = TextJoiner()  # keyed by text or reasoning block id, or tool call id

    def feed(self, event: bytes, data: bytes) -> Sequence[ModelChunk]:
        """Chunks for one event; raises ProviderError for ``error`` / ``response.failed`` or a line that
        is not JSON."""
        if data == b"[DONE]":  # Chat Completions' end line: no Responses stream sends it
            raise _chat_completions_stream(self.provider)
        obj = load_json(self.provider, data)
        if not isinstance(obj, dict):
            return NOTHING
        return self._event(obj)

    def _event(self, obj: dict[str, Any]) -> Sequence[ModelChunk]:
        kind = obj.get("type")
        if kind in {"response.output_text.delta", "response.refusal.delta"}:
            key = (_item(obj), obj.get("content_index", 0))
            block_id = self.texts.get(key)
            opened = block_id is None
            if block_id is None:
                block_id = f"{self.prefix}-{key[0]}-{key[1]}"
            # A character split across two deltas is held until its second half arrives (wire.py).
            delta = self.join.push(block_id, obj.get("delta") or "")
            if not delta:
                return NOTHING
            if kind == "response.refusal.delta":
                self.refused = True
                self.refusal.append(delta)
            elif self.text is not None:
                self.text.append(delta)
            if obj.get("logprobs"):
                self.logprobs.extend(obj["logprobs"])
            if opened:
                self.texts[key] = self.text_blocks[key] = block_id
                return (TextStart(block_id), TextDelta(block_id, delta))
            return (TextDelta(block_id, delta),)
        if kind == "response.function_call_arguments.delta":
            call = self._call(obj.get("output_index"), obj.get("item_id"))
            delta = obj.get("delta") or ""
            if call is None or not delta or not (delta := self.join.push(call.tool_call_id, delta)):
                return NOTHING
            call.parts.append(delta)
            return (ToolInputDelta(call.tool_call_id, delta),)
        if kind == "response.reasoning_summary_text.delta":
            return self._reasoning_delta(obj, "summary")
        if kind == "response.reasoning_text.delta":
            return self._reasoning_delta(obj, "content")
        if kind == "response.output_text.annotation.added":
            annotation = obj.get("annotation")
            key = (_item(obj), obj.get("content_index", 0))
            return self._annotation(key, obj.get("annotation_index"), annotation)
        if kind in ("response.output_text.done", "response.refusal.done"):
            return self._end_text((_item(obj), obj.get("content_index", 0)))
        if kind == "response.output_item.added":
            return self._item_added(obj.get("item") or {}, obj.get("output_index", 0))
        if kind == "response.output_item.done":
            return self._item_done(obj.get("item") or {}, obj.get("output_index"))
        if kind == "response.function_call_arguments.done":
            call = self._call(obj.get("output_index"), obj.get("item_id"))
            if call is not None:
                self._final_arguments(call, obj.get("arguments"))
            return NOTHING
        if kind == "response.created":
            response = obj.get("response") or {}
            self.response_id, self.model = response.get("id") or "", response.get("model") or ""
            return NOTHING
        if kind in ("response.completed", "response.incomplete"):
            self.done = True
            return self._finish(obj.get("response") or {})
        if kind == "response.failed":
            response = obj.get("response") or {}
            raise errors.from_stream_error(self.provider, {"error": response.get("error") or {}, **obj})
        if kind == "error":
            raise errors.from_stream_error(self.provider, obj)
        if kind is None and obj.get("object") == "chat.completion.chunk":
            raise _chat_completions_stream(self.provider)
        return NOTHING

    def _end_text(self, key: tuple[int | str, int]) -> Sequence[ModelChunk]:
        """TextEnd of the block ``key`` (after what the joiner still held for it), if it is open."""
        block_id = self.texts.pop(key, None)
        if block_id is None:
            return NOTHING
        rest = self.join.flush(block_id)
        if not rest:
            return (TextEnd(block_id),)
        if self.text is not None:
            self.text.append(rest)
        return (TextDelta(block_id, rest), TextEnd(block_id))

    def _reasoning_delta(self, obj: Mapping[str, Any], field: str) -> Sequence[ModelChunk]:
        """A delta of a reasoning item's ``summary`` or ``content`` (``field``): parts of one item
        are one block, a blank line between them."""
        item = _item(obj)
        entry = self.reasoning.get(item)
        out: list[ModelChunk] = []
        if entry is None:
            entry = (f"{self.prefix}-r-{item}", -1)
            out.append(ReasoningStart(entry[0]))
        block_id, last = entry
        delta = self.join.push(block_id, obj.get("delta") or "")
        index = obj.get("summary_index", obj.get("content_index", 0))
        if last >= 0 and index != last:
            out.append(ReasoningDelta(block_id, "\n\n"))
        self.reasoning[item] = (block_id, index)
        if field != "summary":
            self.reasoning_fields[block_id] = field
        if delta:
            out.append(ReasoningDelta(block_id, delta))
        return out

    def _item_added(self, item: Mapping[str, Any], output_index: int) -> Sequence[ModelChunk]:
        itype = item.get("type")
        if itype == "function_call":
            # Every call of the turn gets its own id, even when a call_id repeats (docs/semantics.md §11).
            call_id = self.ids.assign(
                item.get("call_id") or item.get("id") or "", f"call_{self.prefix}_{len(self.calls)}"
            )
            call = PendingCall(call_id, item.get("name") or "")
            self.calls.append(call)
            self.call_at[output_index] = call
            self.call_of_item[item.get("id") or call_id] = call
            return (ToolInputStart(call.tool_call_id, call.tool_name),)
        if itype == "reasoning":
            block_id = f"{self.prefix}-{output_index}"
            self.reasoning[output_index] = (block_id, -1)
            return (ReasoningStart(block_id),)
        if built_in.is_built_in(itype):
            return (built_in.started(item, self._built_in_id(item, output_index)),)
        return NOTHING

    def _built_in_id(self, item: Mapping[str, Any], output_index: Any) -> str:
        """The call id of a built-in tool item, given once per item (unique in the turn)."""
        key = output_index if isinstance(output_index, int) else item.get("id") or ""
        call_id = self.built_ins.get(key)
        if call_id is None:
            fallback = f"call_{self.prefix}_b{len(self.built_ins)}"
            call_id = self.built_ins[key] = self.ids.assign(built_in.original_id(item), fallback)
        return call_id

    def _call(self, output_index: Any, item_id: Any) -> PendingCall | None:
        """The function call an event names: by its output index when known, else by its item id."""
        if isinstance(output_index, int) and output_index in self.call_at:
            return self.call_at[output_index]
        return self.call_of_item.get(item_id or "")

    def _final_arguments(self, call: PendingCall, arguments: Any) -> None:
        """The complete arguments a done event carries replace the deltas (unless it carries none)."""
        rest = self.join.flush(call.tool_call_id)
        if isinstance(arguments, str) and (arguments or not call.parts):
            call.final = clean_text(arguments)
        elif rest:
            call.parts.append(rest)

    def _item_done(self, item: Mapping[str, Any], output_index: Any = None) -> Sequence[ModelChunk]:
        itype = item.get("type")
        item_id = item.get("id") or ""
        if itype == "function_call":
            call = self._call(output_index, item_id)
            if call is not None:
                self._final_arguments(call, item.get("arguments"))
            return NOTHING
        if itype == "reasoning":
            entry = self.reasoning.pop(output_index, None) if isinstance(output_index, int) else None
            if entry is None:
                entry = self.reasoning.pop(item_id, None)  # its deltas named no output index
            out: list[ModelChunk] = []
            if entry is None:
                entry = (f"{self.prefix}-r-{item_id}", -1)
                out.append(ReasoningStart(entry[0]))
            rest = self.join.flush(entry[0])
            if rest:
                out.append(ReasoningDelta(entry[0], rest))
            encrypted = item.get("encrypted_content") or ""
            texts = (*(item.get("summary") or ()), *(item.get("content") or ()))
            has_text = entry[1] >= 0 or any(isinstance(t, Mapping) and t.get("text") for t in texts)
            meta: dict[str, str] = {"item_id": item_id}
            field = self.reasoning_fields.pop(entry[0], None)
            if field is not None:
                meta["text_field"] = field  # what the text goes back as (openai_responses_request.py)
            out.append(
                ReasoningEnd(
                    entry[0],
                    signature=encrypted.encode(),
                    redacted=bool(encrypted) and not has_text,
                    provider_metadata={"openai": meta},
                )
            )
            return out
        if itype == "message":
            if item.get("phase"):  # gpt-5.3-codex and later: commentary or final_answer
                self.phases.append({"item_id": item_id, "phase": str(item["phase"])})
            cited: list[ModelChunk] = []
            item_key = output_index if isinstance(output_index, int) else item_id
            for content_index, part in enumerate(item.get("content") or ()):
                annotations = part.get("annotations") if isinstance(part, Mapping) else None
                for position, annotation in enumerate(annotations or ()):  # those not streamed
                    cited.extend(self._annotation((item_key, content_index), position, annotation))
            ends = [key for key in self.texts if key[0] == output_index or key[0] == item_id]
            cited.extend(chunk for key in ends for chunk in self._end_text(key))
            return cited
        if built_in.is_built_in(itype):
            announced = (output_index if isinstance(output_index, int) else item_id) in self.built_ins
            call_id = self._built_in_id(item, output_index)
            chunks = built_in.finished(item, call_id)
            self.client_run += sum(1 for c in chunks if isinstance(c, ToolCall) and c.client_executed)
            started = [] if announced else [built_in.started(item, call_id)]
            return [*started, *chunks, *_generated_files(item, item_id)]
        return NOTHING

    def _annotation(self, key: tuple[int | str, int], position: Any, annotation: Any) -> Sequence[ModelChunk]:
        """The Source of annotation ``position`` of text ``key`` (once, whether it streamed or came
        with its item's done event), tied to that text's block."""
        if not isinstance(annotation, Mapping):
            return NOTHING
        seen = (*key, position if isinstance(position, int) else len(self.annotated))
        if seen in self.annotated:
            return NOTHING
        self.annotated.add(seen)
        text_id = self.text_blocks.get(key, "")
        source = annotation_source(annotation, f"{self.prefix}-src{self.sources + 1}", text_id)
        if source is None:
            return NOTHING
        self.sources += 1
        return (source,)

    def _finish(self, response: Mapping[str, Any]) -> Sequence[ModelChunk]:
        out: list[ModelChunk] = [chunk for key in list(self.texts) for chunk in self._end_text(key)]
        status = response.get("status") or ""
        incomplete = (response.get("incomplete_details") or {}).get("reason") or ""
        raw = incomplete or status
        calls = self.calls
        out.extend(finish_tool_calls(calls, incomplete == "max_output_tokens"))
        reason: FinishReason
        if incomplete == "max_output_tokens":
            reason = FinishReason.LENGTH
        elif incomplete == "content_filter" or self.refused:
            reason = FinishReason.CONTENT_FILTER
        elif incomplete:
            reason = FinishReason.OTHER
        else:
            reason = FinishReason.TOOL_CALLS if calls or self.client_run else FinishReason.STOP
        usage = response.get("usage") or {}
        metadata: dict[str, Any] = {"usage": usage} if usage else {}
        if self.refusal:
            metadata["refusal"] = "".join(self.refusal)
        if response.get("incomplete_details"):
            metadata["incomplete_details"] = response["incomplete_details"]
        if self.ids.renamed:
            metadata["tool_call_ids"] = dict(self.ids.renamed)
        if self.phases:
            metadata["phases"] = self.phases
        if self.logprobs:
            metadata["logprobs"] = self.logprobs
        out.append(
            self._finish_step(
                reason,
                raw,
                openai_usage(usage, "input", "output"),
                metadata,
                response_id=response.get("id") or self.response_id,
                response_model=response.get("model") or self.model,
            )
        )
        return out

    def end(self) -> Sequence[ModelChunk]:
        """EOF before ``response.completed`` / ``incomplete`` / ``failed``: the step failed."""
        raise errors.incomplete_stream(self.provider, "response.completed")

    def whole(self, body: bytes) -> Sequence[ModelChunk]:
        """A complete ``response`` object answered to the streaming request: one step, the same chunks
        its stream would have given. Raises ProviderError (not retryable) when the body is not a
        response; an ``error`` object (or a failed response) is the provider's error."""
        obj = clean_strings(load_json(self.provider, body, "the response was a body"))
        output = obj.get("output") if isinstance(obj, dict) else None
        if isinstance(obj, dict) and obj.get("status") == "failed":
            return self._event({"type": "response.failed", "response": obj})
        if isinstance(obj, dict) and isinstance(obj.get("error"), dict) and output is None:
            raise errors.from_stream_error(self.provider, obj)
        if not isinstance(obj, dict) or not isinstance(output, list):
            raise errors.invalid_response(
                self.provider, "a JSON body that is not a Responses API response (no output list)", body
            )
        out: list[ModelChunk] = list(self._event({"type": "response.created", "response": obj}))
        for index, item in enumerate(output):
            if not isinstance(item, dict):
                raise errors.invalid_response(self.provider, f"output item {index} is not an object", body)
            out.extend(self._whole_item({**item, "id": item.get("id") or f"item_{index}"}, index))
        status = obj.get("status")
        self.done = True
        kind = "response.incomplete" if status == "incomplete" else "response.completed"
        out.extend(self._event({"type": kind, "response": obj}))
        return out

    def _whole_item(self, item: dict[str, Any], index: int) -> list[ModelChunk]:
        """One output item of a whole response as the events that would have streamed it."""
        item_id = item["id"]
        out = list(self._item_added(item, index))
        if item.get("type") == "message":
            for part_index, part in enumerate(item.get("content") or ()):
                if not isinstance(part, dict):
                    continue
                refusal = part.get("type") == "refusal"
                text = part.get("refusal") if refusal else part.get("text")
                if isinstance(text, str) and text:
                    kind = "response.refusal.delta" if refusal else "response.output_text.delta"
                    event = {"type": kind, "item_id": item_id, "output_index": index}
                    out.extend(self._event({**event, "content_index": part_index, "delta": text}))
        elif item.get("type") == "reasoning":
            for field, kind, position in _REASONING_FIELDS:
                for part_index, part in enumerate(item.get(field) or ()):
                    text = part.get("text") if isinstance(part, dict) else None
                    if isinstance(text, str) and text:
                        event = {"type": kind, "item_id": item_id, "output_index": index}
                        out.extend(self._event({**event, position: part_index, "delta": text}))
        out.extend(self._item_done(item, index))
        return out


_IMAGE_FIELDS = ("revised_prompt", "size", "quality", "background", "output_format")


def _generated_files(item: Mapping[str, Any], item_id: str) -> list[ModelChunk]:
    """The files a finished built-in tool item produced: the image of an ``image_generation_call``
    (its final ``result``, base64), the images a ``code_interpreter_call`` output names by URL."""
    itype = item.get("type")
    if itype == "image_generation_call" and isinstance(item.get("result"), str):
        meta = {k: item[k] for k in _IMAGE_FIELDS if item.get(k) is not None}
        media = f"image/{item['output_format']}" if isinstance(item.get("output_format"), str) else ""
        file = image_file(item["result"], media, {"openai": {"item_id": item_id, **meta}})
        return [file] if file is not None else []
    if itype == "code_interpreter_call":
        found = [
            image_file(output["url"], "", {"openai": {"item_id": item_id}})
            for output in item.get("outputs") or ()
            if isinstance(output, Mapping) and output.get("type") == "image"
            if isinstance(output.get("url"), str)
        ]
        return [file for file in found if file is not None]
    return []


"""An ``image_generation_call`` item's fields kept in its File's ``provider_metadata["openai"]``."""

_REASONING_FIELDS = (
    ("summary", "response.reasoning_summary_text.delta", "summary_index"),
    ("content", "response.reasoning_text.delta", "content_index"),
)
"""A reasoning item's text fields, with the delta event that streams each and its part index."""

_COUNTED = frozenset(
    {"instructions", "tools", "tool_choice", "reasoning", "text", "parallel_tool_calls", "truncation"}
)
"""The ``responses.create`` fields ``responses.input_tokens.count`` takes too (besides model and input)."""


class OpenAIResponsesProvider(SdkProvider[openai.AsyncOpenAI]):
    """Streams steps from the Responses API through ``client`` (an ``AsyncOpenAI``).

    ``store`` is sent as is (default false: Turnwire keeps the transcript, and
    reasoning round-trips as encrypted content); ``encrypted_reasoning`` says when
    to ask for it (``auto``: reasoning models only); ``replay_reasoning`` which
    reasoning with neither goes back as text
    (:func:`~turnwire_server.providers.openai_common.replay_reasoning_for`); ``prompt_cache_key``
    sends the request's ``cache_key`` as ``prompt_cache_key`` (:mod:`.prompt_cache`)."""

    type = "openai-responses"

    def __init__(
        self,
        name: str,
        client: openai.AsyncOpenAI,
        *,
        models: Sequence[str] = (),
        store: bool = False,
        encrypted_reasoning: EncryptedReasoning = "auto",
        replay_reasoning: ReplayReasoningSetting = "auto",
        prompt_cache_key: bool = False,
        retry_delay: float = 0.5,
    ) -> None:
        super().__init__(name, client, models=models, retry_delay=retry_delay)
        self.prompt_cache_key = prompt_cache_key
        self.store = store
        self.encrypted_reasoning: EncryptedReasoning = encrypted_reasoning
        self.replay_reasoning: ReplayReasoningSetting = replay_reasoning

    def _prepare(self, request: ModelRequest) -> SdkCall:
        body, warnings = build_request(
            request,
            provider=self.name,
            store=self.store,
            encrypted_reasoning=self.encrypted_reasoning,
            replay_reasoning=self.replay_reasoning,
        )
        if self.prompt_cache_key and request.cache_key:
            body.setdefault("prompt_cache_key", request.cache_key)  # provider options win
        kwargs = {"model": body.pop("model"), "input": body.pop("input")}
        prefix, name, schema = f"s{request.step_number}", self.name, request.output_schema
        taken = transcript_call_ids(request.messages)
        return SdkCall(kwargs, body, lambda: ResponsesDecoder(name, prefix, schema, warnings, taken))

    def _create(self, client: openai.AsyncOpenAI) -> OpenStream:
        return client.responses.with_streaming_response.create

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """The input tokens of ``request`` by the API's ``POST /v1/responses/input_tokens``
        (``responses.input_tokens.count``: the same instructions, input and tools a step sends).
        Raises ProviderError as :meth:`stream` does."""
        call = self._prepare(request)
        counted = {**call.kwargs, **{k: v for k, v in call.extra_body.items() if k in _COUNTED}}
        result = await self._unary(self.client.responses.input_tokens.count(**counted))
        return int(result.input_tokens)

    def _map_error(self, error: BaseException) -> ProviderError | None:
        return map_openai_error(self.name, error)


def _chat_completions_stream(provider: str) -> ProviderError:
    """The error of a Responses stream that is a Chat Completions one (``chat.completion.chunk``
    objects, a ``[DONE]`` line): a server that speaks only Chat Completions (most OpenAI-compatible
    servers) behind an ``openai-responses`` entry. Not retryable: the entry's type is to change."""
    return ProviderError(
        f"{provider}: the server answered with a Chat Completions stream (chat.completion.chunk, "
        "[DONE]), not a Responses one: it speaks Chat Completions only; set this provider's type to "
        "openai (docs/providers.md)",
        type="invalid_stream_data",
        provider=provider,
        in_stream=True,
    )
