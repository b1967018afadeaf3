"""The OpenAI Chat Completions adapter, also for OpenAI-compatible servers (``openai`` SDK, ``AsyncOpenAI``).

Follows https://platform.openai.com/docs/api-reference/chat/create-stream. The SDK
sends the request (``client.post`` of ``/chat/completions`` with the JSON encoded by
:mod:`~turnwire_server.providers.json_body`); the SSE
body (``data: {chat.completion.chunk}`` lines, then ``data: [DONE]``) is decoded
here with orjson.

Request (:func:`build_request`): ``system`` message first; user text, images
(``image_url``), PDFs (``file``), audio (``input_audio``) and text files; each
assistant step as one assistant message (text + ``tool_calls``) followed at once
by one ``tool`` message per call, with the matching ``tool_call_id``; reasoning goes
back as the assistant message's ``reasoning_content`` only where the entry's
``replay_reasoning`` says (DeepSeek and Kimi K2 thinking models require it on a tool
turn's messages; OpenAI has no such field). Provider-valid history (docs/semantics.md
§11): no blank text, a blank tool result is ``(empty result)``, same-role runs
of ``system`` / ``user`` / ``assistant`` messages merged (chat templates of many
compatible servers require alternation), each call id unique in the request.
Tools from JSON Schema, ``tool_choice``,
``stream_options.include_usage``, ``response_format`` ``json_schema`` for
structured output, sampling settings (``top_k`` only via provider options, for
servers such as vLLM that take it), ``provider_options`` merged into the body.

Stream tolerance (vLLM, llama.cpp, Ollama, LiteLLM, OpenRouter): tool-call
fragments are keyed by ``index`` (never by name or position in the chunk); a call
whose id is missing gets one; a new id at a used index opens a new call; a name
split across deltas is joined until the arguments start (a fragment equal to the
name so far is a repeat), so ``ToolInputStart`` comes with the first argument
fragment (or at the step's end); ``reasoning_content`` / ``reasoning`` deltas
become reasoning, and so do Mistral's ``content`` parts of type ``thinking``
(``content`` as a list of ``text`` / ``thinking`` parts); ``delta.annotations`` (OpenAI search
models, OpenRouter) and Perplexity's ``search_results`` / ``citations`` → Sources tied to the
step's first text block, at the step's end; OpenRouter's ``delta.images`` → Files
(:mod:`~turnwire_server.providers.openai_annotations`); ``<think>…</think>`` in
the text when the entry sets ``inline_reasoning_tag``
(:mod:`~turnwire_server.providers.inline_reasoning`); a chunk with a
top-level ``error`` (or ``finish_reason: "error"``) is a ProviderError; usage may
come in a final chunk with ``choices: []``, on the last chunk (OpenAI's ``usage``,
Groq's ``x_groq.usage``, Moonshot's ``choices[0].usage``), or never, and is
reported as it comes (``UsageUpdate``); a missing finish reason is
``stop`` (or ``tool-calls`` when calls were made); a stream that ends after a
finish reason without ``[DONE]`` is accepted, one that ends before is an error;
two calls with one id each get their own (``<id>_2``, docs/semantics.md §11); a
character split between two deltas is joined (:mod:`turnwire_server.providers.wire`);
a whole ``chat.completion`` body instead of a stream is one step (:meth:`ChatDecoder.whole`).

Finish: ``stop`` → stop (tool-calls when calls were made), ``length`` → length
(every call errored, never run), ``tool_calls`` → tool-calls, ``content_filter``
and refusals → content-filter, others → other. Refusal text is streamed as text and
kept in ``provider_metadata["openai"]["refusal"]``, Azure's ``content_filter_results``
in ``provider_metadata["openai"]["content_filter_results"]``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import openai
import orjson

from turnwire.providers import ModelRequest, ProviderError
from turnwire.types import (
    FinishReason,
    ModelChunk,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolInputDelta,
    ToolInputStart,
    UsageUpdate,
)
from turnwire_server.providers import errors
from turnwire_server.providers.convert import CallIds, PendingCall, finish_tool_calls
from turnwire_server.providers.inline_reasoning import InlineReasoning, Piece
from turnwire_server.providers.openai_annotations import annotation_source, image_file, perplexity_sources
from turnwire_server.providers.openai_chat_request import MaxTokensParam, build_request
from turnwire_server.providers.openai_common import (
    OpenAIDecoder,
    ReplayReasoningSetting,
    map_openai_error,
    openai_usage,
)
from turnwire_server.providers.streaming import NOTHING, OpenStream, SdkCall, SdkProvider
from turnwire_server.providers.wire import TextJoiner, clean_strings, load_json

_FINISH: dict[str, FinishReason] = {
    "stop": FinishReason.STOP,
    "eos": FinishReason.STOP,
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
}
_TRUNCATED = frozenset({"length", "max_tokens"})


def _groq_usage(vendor: Any) -> Any:
    """Groq's usage on a stream's last chunk, ``x_groq.usage`` (its counts are OpenAI's; the
    ``*_time`` fields are seconds, not kept). Seen at https://github.com/vercel/ai/issues/1651."""
    return vendor.get("usage") if isinstance(vendor, dict) else None


def _text_part(part: Any) -> str | None:
    """The text of a ``{"type": "text", "text": …}`` part (None for any other part)."""
    if isinstance(part, dict) and part.get("type", "text") == "text":
        value = part.get("text")
        return value if isinstance(value, str) else None
    return None


class _Call(PendingCall):
    __slots__ = ("provider_id", "started")

    def __init__(self, tool_call_id: str, tool_name: str, provider_id: str) -> None:
        super().__init__(tool_call_id, tool_name)
        self.provider_id = provider_id  # the id the server sent (tool_call_id is unique in the turn)
        self.started = False


class ChatDecoder(OpenAIDecoder):
    """``chat.completion.chunk`` events → chunks (see the module docstring)."""

    def __init__(
        self,
        provider: str,
        prefix: str,
        output_schema: Mapping[str, Any] | None,
        warnings: list[str],
        taken_ids: Collection[str] = (),
        *,
        inline: InlineReasoning | None = None,
    ):
        super().__init__(provider, prefix, output_schema, warnings)
        self.inline = inline  # reasoning inline in the text as <tag>…</tag> (the entry opted in)
        self.ids = CallIds(taken_ids)
        self.join = TextJoiner()
        self.filter_results: Any = None
        self.logprobs: list[Any] = []  # choices[0].logprobs.content, when the request asked for them
        self.text_id: str | None = None
        self.reasoning_id: str | None = None
        self.blocks = 0
        self.by_index: dict[int, _Call] = {}
        self.calls: list[_Call] = []
        self.refusal: list[str] = []
        self.finish: str | None = None
        self.usage: dict[str, Any] | None = None
        self.cited_text_id = ""  # the step's first text block: what its annotations' spans count in
        self.annotations: dict[bytes, Mapping[str, Any]] = {}  # by their JSON: sent once or repeated
        self.perplexity: Mapping[str, Any] | None = None  # the last chunk with citations

    def feed(self, event: bytes, data: bytes) -> Sequence[ModelChunk]:
        """Chunks for one ``data:`` line; raises ProviderError for an error chunk."""
        if data == b"[DONE]":
            self.done = True
            return self._finish()
        obj = load_json(self.provider, data)
        if not isinstance(obj, dict):
            return NOTHING
        return self._chunk(obj)

    def _chunk(self, obj: dict[str, Any]) -> Sequence[ModelChunk]:
        if obj.get("error") is not None:
            raise errors.from_stream_error(self.provider, obj)
        if not self.response_id:
            self.response_id = obj.get("id") or ""
            self.model = obj.get("model") or ""
        # Usage: OpenAI's top-level field (a usage-only chunk with ``choices: []``, or the last
        # chunk), Groq's ``x_groq.usage`` on the last chunk, or Moonshot's in the finishing choice.
        usage = obj.get("usage")
        if not usage and "x_groq" in obj:
            usage = _groq_usage(obj["x_groq"])
        choices = obj.get("choices")
        if not choices:
            return (self._usage_update(usage),) if usage and isinstance(usage, dict) else NOTHING
        choice = choices[0]
        out: list[ModelChunk] = []
        if (usage or (usage := choice.get("usage"))) and isinstance(usage, dict):
            out.append(self._usage_update(usage))
        delta = choice.get("delta") or {}
        # A character split across two deltas is held until its second half arrives (wire.py).
        # Reasoning first: a delta that ends the reasoning may also begin the answer (vLLM).
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning and isinstance(reasoning, str) and (reasoning := self.join.push("reasoning", reasoning)):
            self._reasoning(out, reasoning)
        content = delta.get("content")
        if content:
            if isinstance(content, str):
                content = self.join.push("content", content)
                if content:
                    inline = self.inline
                    if inline is None:
                        self._text(out, content)
                    else:
                        self._pieces(out, inline.push(content))
            elif isinstance(content, list):
                self._content_parts(out, content)
        refusal = delta.get("refusal")
        if refusal and isinstance(refusal, str) and (refusal := self.join.push("refusal", refusal)):
            self.refusal.append(refusal)
            self._end_reasoning(out)
            if self.text_id is None:
                self.text_id = self._block_id()
                out.append(TextStart(self.text_id))
            out.append(TextDelta(self.text_id, refusal))
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            self._tool_calls(tool_calls, out)
        if delta.get("annotations") or delta.get("images") or "citations" in obj or "search_results" in obj:
            self._cited(obj, delta, out)
        finish = choice.get("finish_reason")
        if finish:
            if finish == "error":
                raise errors.from_stream_error(self.provider, obj)
            self.finish = finish
        if choice.get("content_filter_results"):  # Azure: why a content filter stopped the step
            self.filter_results = choice["content_filter_results"]
        logprobs = choice.get("logprobs")  # with `logprobs: true` in provider_options
        if logprobs and isinstance(logprobs, dict) and logprobs.get("content"):
            self.logprobs.extend(logprobs["content"])
        return out

    def _cited(self, obj: Mapping[str, Any], delta: Mapping[str, Any], out: list[ModelChunk]) -> None:
        """Annotations (kept for the step's end, once each), Perplexity's citations (the last chunk's
        list wins: each chunk repeats it) and OpenRouter's generated ``images`` (a File each, now)."""
        annotations = delta.get("annotations")
        for annotation in annotations if isinstance(annotations, list) else ():
            if isinstance(annotation, Mapping):
                self.annotations.setdefault(orjson.dumps(annotation), annotation)
        if "citations" in obj or "search_results" in obj:
            self.perplexity = obj
        images = delta.get("images")
        for image in images if isinstance(images, list) else ():
            url = (image.get("image_url") or {}).get("url") if isinstance(image, Mapping) else None
            file = image_file(url) if isinstance(url, str) else None
            if file is not None:
                out.append(file)

    def _sources(self) -> list[ModelChunk]:
        """The step's sources, tied to its first text block (see :mod:`.openai_annotations`)."""
        text_id, prefix = self.cited_text_id, self.prefix
        found: list[ModelChunk] = []
        for annotation in self.annotations.values():
            source = annotation_source(annotation, f"{prefix}-src{len(found) + 1}", text_id)
            if source is not None:
                found.append(source)
        if self.perplexity is not None and not found:
            found.extend(perplexity_sources(self.perplexity, prefix, text_id))
        return found

    def _usage_update(self, usage: dict[str, Any]) -> UsageUpdate:
        """Keep the usage a chunk reported, and report it now: a step cut short after it still
        counts it (docs/semantics.md §11)."""
        self.usage = usage
        return UsageUpdate(openai_usage(usage, "prompt", "completion"))

    def _content_parts(self, out: list[ModelChunk], parts: list[Any]) -> None:
        """``content`` as a list of parts (Mistral, Magistral): ``{"type": "text", "text"}`` is text,
        ``{"type": "thinking", "thinking": [{"type": "text", "text"}, …]}`` is reasoning, in order;
        other parts (``reference``) carry no text. Mistral's ``ContentChunk`` types:
        https://docs.mistral.ai/api/ (``TextChunk``, ``ThinkChunk``)."""
        for part in parts:
            if not isinstance(part, dict):
                continue
            kind = part.get("type", "text")
            if kind == "text":
                value = part.get("text")
                if value and isinstance(value, str) and (value := self.join.push("content", value)):
                    self._content(out, value)
            elif kind == "thinking":
                inner = part.get("thinking")
                for piece in [inner] if isinstance(inner, str) else inner or ():
                    value = piece if isinstance(piece, str) else _text_part(piece)
                    if value and (value := self.join.push("reasoning", value)):
                        self._reasoning(out, value)

    def _content(self, out: list[ModelChunk], content: str) -> None:
        """Answer text, unless the entry reads inline ``<think>`` tags: then their pieces."""
        if self.inline is None:
            self._text(out, content)
        else:
            self._pieces(out, self.inline.push(content))

    def _end_inline(self, out: list[ModelChunk]) -> None:
        """Release what the inline tag reader held (a tag's beginning that never finished)."""
        if self.inline is not None:
            self._pieces(out, self.inline.flush())

    def _pieces(self, out: list[ModelChunk], pieces: list[Piece]) -> None:
        for is_reasoning, piece in pieces:
            if is_reasoning:
                self._reasoning(out, piece)
            else:
                self._text(out, piece)

    def _text(self, out: list[ModelChunk], content: str) -> None:
        if self.reasoning_id is not None:
            self._end_reasoning(out)
        if self.text_id is None:
            self.text_id = self._block_id()
            self.cited_text_id = self.cited_text_id or self.text_id
            out.append(TextStart(self.text_id))
        if self.text is not None:
            self.text.append(content)
        out.append(TextDelta(self.text_id, content))

    def _reasoning(self, out: list[ModelChunk], reasoning: str) -> None:
        # Reasoning after text closes the text block, so the stored parts keep the stream's order.
        if self.text_id is not None:
            self._end_text(out)
        if self.reasoning_id is None:
            self.reasoning_id = self._block_id()
            out.append(ReasoningStart(self.reasoning_id))
        out.append(ReasoningDelta(self.reasoning_id, reasoning))

    def _block_id(self) -> str:
        self.blocks += 1
        return f"{self.prefix}-{self.blocks}"

    def _end_text(self, out: list[ModelChunk]) -> None:
        """Close the open text block, after what the joiner still held for it."""
        if self.text_id is None:
            return
        rest = self.join.flush("content")
        if rest and self.text is not None:
            self.text.append(rest)
        refused = self.join.flush("refusal")
        if refused:
            self.refusal.append(refused)
        if rest or refused:
            out.append(TextDelta(self.text_id, rest + refused))
        out.append(TextEnd(self.text_id))
        self.text_id = None

    def _end_reasoning(self, out: list[ModelChunk]) -> None:
        if self.reasoning_id is None:
            return
        rest = self.join.flush("reasoning")
        if rest:
            out.append(ReasoningDelta(self.reasoning_id, rest))
        out.append(ReasoningEnd(self.reasoning_id))
        self.reasoning_id = None

    def _tool_calls(self, fragments: list[dict[str, Any]], out: list[ModelChunk]) -> None:
        for fragment in fragments:
            index = fragment.get("index", 0)
            call_id = fragment.get("id")
            function = fragment.get("function") or {}
            name = function.get("name")
            call = self.by_index.get(index)
            if call is None or (call_id and call_id != call.provider_id):
                # Two calls of one step may carry the same id (some servers): each gets its own
                # (docs/semantics.md §11); a call without one gets one.
                unique = self.ids.assign(call_id or "", f"call_{self.prefix}_{len(self.calls)}")
                call = _Call(unique, name if isinstance(name, str) else "", call_id or "")
                self.by_index[index] = call
                self.calls.append(call)
            elif (
                name
                and isinstance(name, str)
                and name != call.tool_name
                and (not call.tool_name or not call.parts)
            ):
                # A name split across deltas ("echo_", then "tool"): until the arguments start, a
                # fragment equal to the name so far is a repeat (servers that resend it with every
                # delta), any other is its continuation. A name after nameless arguments is the name.
                call.tool_name += name
            arguments = function.get("arguments")
            if isinstance(arguments, dict):  # an object instead of JSON text (some servers)
                arguments = orjson.dumps(arguments).decode()
            if arguments and isinstance(arguments, str):
                arguments = self.join.push(call.tool_call_id, arguments)
            else:
                arguments = None
            if arguments:
                call.parts.append(arguments)
            if call.started:
                if arguments:
                    out.append(ToolInputDelta(call.tool_call_id, arguments))
            elif call.tool_name and call.parts:
                # The name is complete once the arguments start (or at the step's end, _finish).
                call.started = True
                self._end_inline(out)
                self._end_text(out)
                out.append(ToolInputStart(call.tool_call_id, call.tool_name))
                out.append(ToolInputDelta(call.tool_call_id, "".join(call.parts)))

    def _finish(self) -> Sequence[ModelChunk]:
        out: list[ModelChunk] = []
        self._end_inline(out)
        self._end_reasoning(out)
        self._end_text(out)
        out.extend(self._sources())
        raw = self.finish or ""
        calls = [c for c in self.calls if c.tool_name]
        for call in calls:
            rest = self.join.flush(call.tool_call_id)
            if rest:
                call.parts.append(rest)
            if not call.started:
                out.append(ToolInputStart(call.tool_call_id, call.tool_name))
            elif rest:
                out.append(ToolInputDelta(call.tool_call_id, rest))
        out.extend(finish_tool_calls(calls, raw in _TRUNCATED))
        reason: FinishReason = _FINISH.get(raw, FinishReason.OTHER) if raw else FinishReason.STOP
        if reason == "stop" and calls:
            reason = FinishReason.TOOL_CALLS
        metadata: dict[str, Any] = {}
        if self.refusal:
            reason = FinishReason.CONTENT_FILTER
            metadata["refusal"] = "".join(self.refusal)
        if self.filter_results:
            metadata["content_filter_results"] = self.filter_results
        if self.ids.renamed:
            metadata["tool_call_ids"] = dict(self.ids.renamed)
        if self.logprobs:
            metadata["logprobs"] = self.logprobs
        usage = self.usage or {}
        if usage:
            metadata["usage"] = usage
        out.append(
            self._finish_step(
                reason,
                raw,
                openai_usage(usage, "prompt", "completion"),
                metadata,
                response_id=self.response_id,
                response_model=self.model,
            )
        )
        return out

    def end(self) -> Sequence[ModelChunk]:
        """EOF without ``[DONE]``: fine after a finish reason (some servers omit it), an error before."""
        if self.finish is None:
            raise errors.incomplete_stream(self.provider, "a finish reason")
        self.done = True
        return self._finish()

    def whole(self, body: bytes) -> Sequence[ModelChunk]:
        """A complete ``chat.completion`` answered to the streaming request (some compatible servers do,
        e.g. when tools are offered): one step, the same chunks as the equivalent stream. Raises
        ProviderError, not retryable, when the body is not a chat completion; an ``error`` object is
        the server's error."""
        obj = clean_strings(load_json(self.provider, body, "the response was a body"))
        if isinstance(obj, dict) and obj.get("error") is not None:
            raise errors.from_stream_error(self.provider, obj)
        choices = obj.get("choices") if isinstance(obj, dict) else None
        choice = choices[0] if isinstance(choices, list) and choices else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(obj, dict) or not isinstance(choice, dict) or not isinstance(message, dict):
            raise errors.invalid_response(
                self.provider, "a JSON body that is not a chat completion (no choices[0].message)", body
            )
        kept = ("reasoning_content", "reasoning", "refusal", "annotations", "images")
        delta: dict[str, Any] = {k: message.get(k) for k in kept}
        delta["content"] = message.get("content")  # a string, or parts (read as a stream's are)
        calls = message.get("tool_calls")
        if not calls and isinstance(message.get("function_call"), dict):  # the legacy single call
            calls = [{"function": message["function_call"]}]
        if isinstance(calls, list):
            delta["tool_calls"] = [{**c, "index": i} for i, c in enumerate(calls) if isinstance(c, dict)]
        as_chunk = {
            **{k: obj[k] for k in ("citations", "search_results") if k in obj},
            "id": obj.get("id"),
            "model": obj.get("model"),
            "usage": obj.get("usage"),
            "choices": [{**choice, "delta": delta, "finish_reason": choice.get("finish_reason")}],
        }
        out = list(self._chunk(as_chunk))
        self.done = True
        out.extend(self._finish())
        return out


class OpenAIChatProvider(SdkProvider[openai.AsyncOpenAI]):
    """Streams steps from Chat Completions through ``client`` (an ``AsyncOpenAI``; ``base_url`` for
    OpenAI-compatible servers). ``max_tokens_param`` names the output limit field
    (``max_completion_tokens`` for OpenAI, ``max_tokens`` for most compatible servers);
    ``include_usage`` asks for the usage chunk; ``replay_reasoning`` says which assistant messages
    carry their reasoning back as ``reasoning_content`` (:func:`.openai_common.replay_reasoning_for`);
    ``inline_reasoning_tag`` (e.g. ``"think"``) reads ``<think>…</think>`` in the text as reasoning,
    ``inline_reasoning_starts_inside`` when the output begins inside it
    (:mod:`~turnwire_server.providers.inline_reasoning`); ``prompt_cache_key`` sends the request's
    ``cache_key`` as ``prompt_cache_key`` (:mod:`.prompt_cache`). Raises ValueError for a tag that
    is not a tag name."""

    type = "openai"
    json_path = "/chat/completions"
    json_fields = frozenset({"model", "messages"})
    stream_cls = openai.AsyncStream[object]

    def __init__(
        self,
        name: str,
        client: openai.AsyncOpenAI,
        *,
        models: Sequence[str] = (),
        max_tokens_param: MaxTokensParam = "max_completion_tokens",
        include_usage: bool = True,
        replay_reasoning: ReplayReasoningSetting = "auto",
        inline_reasoning_tag: str | None = None,
        inline_reasoning_starts_inside: bool = False,
        prompt_cache_key: bool = False,
        retry_delay: float = 0.5,
    ) -> None:
        super().__init__(name, client, models=models, retry_delay=retry_delay)
        self.prompt_cache_key = prompt_cache_key
        self.max_tokens_param: MaxTokensParam = max_tokens_param
        self.include_usage = include_usage
        self.replay_reasoning: ReplayReasoningSetting = replay_reasoning
        if inline_reasoning_tag is not None:
            InlineReasoning(inline_reasoning_tag)  # refuse a bad tag now, not at the first step
        self.inline_reasoning_tag = inline_reasoning_tag
        self.inline_reasoning_starts_inside = inline_reasoning_starts_inside

    def _prepare(self, request: ModelRequest) -> SdkCall:
        taken: set[str] = set()  # the transcript's tool call ids, gathered by the conversion
        body, warnings = build_request(
            request,
            provider=self.name,
            max_tokens_param=self.max_tokens_param,
            include_usage=self.include_usage,
            call_ids=taken,
            replay_reasoning=self.replay_reasoning,
        )
        if self.prompt_cache_key and request.cache_key:
            body.setdefault("prompt_cache_key", request.cache_key)  # provider options win
        # The messages go in extra_body, sent as built: they are wire-format dicts already, and the
        # SDK's typed transform of ``messages`` costs ~0.2 ms per message (issue 17's profile: 80 %
        # of a 1,000-turn turn's CPU). The body is posted as encoded by json_body (json_path).
        kwargs = {"model": body.pop("model"), "messages": ()}
        prefix, name, schema = f"s{request.step_number}", self.name, request.output_schema
        tag, inside = self.inline_reasoning_tag, self.inline_reasoning_starts_inside

        def new_decoder() -> ChatDecoder:
            inline = InlineReasoning(tag, starts_inside=inside) if tag is not None else None
            return ChatDecoder(name, prefix, schema, warnings, taken, inline=inline)

        return SdkCall(kwargs, body, new_decoder)

    def _create(self, client: openai.AsyncOpenAI) -> OpenStream:
        return client.chat.completions.with_streaming_response.create

    def _map_error(self, error: BaseException) -> ProviderError | None:
        return map_openai_error(self.name, error)
