"""The Anthropic Messages adapter (``anthropic`` SDK 2.x, ``AsyncAnthropic``).

Request: :mod:`turnwire_server.providers.anthropic_request`. The SDK sends it (auth, retries
of error statuses, typed errors, the HTTP client): as JSON encoded here through ``client.post``
(``/v1/messages``, :mod:`~turnwire_server.providers.json_body`: the transcript's kept JSON, not
the SDK's copy and encoding of it per step), or, for an argument the SDK sends elsewhere (a
header), through ``messages.with_streaming_response.create(stream=True)``. The SSE body is
decoded here with orjson instead of the SDK's typed events (measured in
bench/provider_adapters.py).

Stream (https://platform.claude.com/docs/en/build-with-claude/streaming):
``message_start`` (id, model, input usage) → per content block
``content_block_start`` / ``content_block_delta`` (``text_delta``,
``thinking_delta``, ``signature_delta``, ``input_json_delta``, ``citations_delta``)
/ ``content_block_stop`` → ``message_delta`` (stop reason, cumulative usage) →
``message_stop``; ``ping`` anywhere; ``error`` (e.g. ``overloaded_error``) may
arrive mid-stream, after which the connection closes.

Chunks: text blocks → TextStart/Delta/End; ``thinking`` → ReasoningStart/Delta/End
with the signature (``provider_metadata={"anthropic": {...}}`` marks it for
replay); ``redacted_thinking`` → ReasoningStart/End(redacted, signature=data);
``tool_use`` → ToolInputStart/Delta, and its ToolCall once the stop reason is known
(``max_tokens`` → every call errored, never run); each citation (``citations_delta``, or a
block's ``citations``) → a Source tied to its text block (:mod:`.anthropic_content`);
server tools (``server_tool_use``, ``mcp_tool_use``: web search, web fetch, code execution, the MCP
connector, tool search) are not client calls: ToolInputStart/Delta and a ToolCall marked
``provider_executed``, and their result blocks (``*_tool_result``) a ToolResult, each with its
block (without the input or content it carries) in ``provider_metadata["anthropic"]`` (``call``,
``result``) so the request builder sends both back as they came (docs/providers.md); the files a
code execution result names → Files by ``file_id``; blocks
``message_start`` already holds (programmatic tool calling) are decoded as if streamed;
``pause_turn`` → ``FinishStep.paused``; a refusal's ``stop_details`` (category, explanation)
in ``...["stop_details"]``. A ``tool_use`` id the turn already has gets ``<id>_2``
(docs/semantics.md §11); a character split between two deltas is joined
(:mod:`turnwire_server.providers.wire`); a whole ``message`` body instead of a stream is one
step (:meth:`AnthropicDecoder.whole`).

Finish reasons: ``end_turn``/``stop_sequence`` → stop, ``max_tokens`` and
``model_context_window_exceeded`` → length, ``tool_use`` → tool-calls,
``refusal`` → content-filter, ``pause_turn`` and others → other (raw kept).
Usage: input = ``input_tokens`` + cache reads + cache writes (they are disjoint in
this API); reasoning = ``output_tokens_details.thinking_tokens``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import anthropic
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
    ToolCall,
    ToolInputDelta,
    ToolInputStart,
    ToolResult,
    Usage,
    UsageUpdate,
)
from turnwire.values import parse_tool_input
from turnwire_server.providers import errors
from turnwire_server.providers.anthropic_content import citation_source, result_files
from turnwire_server.providers.anthropic_request import (
    OUTPUT_TOOL,
    AnthropicPlan,
    StructuredMode,
    build_request,
)
from turnwire_server.providers.convert import (
    CallIds,
    PendingCall,
    as_int,
    check_structured_output,
    finish_step,
    finish_tool_calls,
    provider_options,
)
from turnwire_server.providers.prompt_cache import CacheTtl, cache_writes, place_breakpoints
from turnwire_server.providers.streaming import NOTHING, OpenStream, SdkCall, SdkProvider
from turnwire_server.providers.wire import TextJoiner, clean_strings, load_json

_FINISH: dict[str, FinishReason] = {
    "end_turn": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "max_tokens": FinishReason.LENGTH,
    "model_context_window_exceeded": FinishReason.LENGTH,
    "tool_use": FinishReason.TOOL_CALLS,
    "refusal": FinishReason.CONTENT_FILTER,
}
_TRUNCATED = frozenset({"max_tokens", "model_context_window_exceeded"})

# Block kinds.
_TEXT, _THINKING, _REDACTED, _TOOL, _OUTPUT, _SERVER, _OTHER = range(7)


_SERVER_USES = frozenset({"server_tool_use", "mcp_tool_use"})
"""Calls the API runs itself; their input streams as a tool_use's does."""


def _is_server_result(block_type: str) -> bool:
    """A server tool's result block (``web_search_tool_result``, ``code_execution_tool_result``,
    ``mcp_tool_result`` …), given whole in its ``content_block_start``; ``tool_result`` is the client's."""
    return block_type.endswith("_tool_result") and block_type != "tool_result"


class _Block:
    __slots__ = ("call", "data", "id", "kind", "start")

    def __init__(
        self,
        kind: int,
        block_id: str,
        data: str = "",
        call: PendingCall | None = None,
        start: Mapping[str, Any] | None = None,
    ) -> None:
        self.kind = kind
        self.id = block_id
        self.data = data  # signature, or redacted data
        self.call = call
        self.start = start  # a server tool call's content_block_start block


class AnthropicDecoder:
    """Messages SSE events → chunks (see the module docstring)."""

    def __init__(
        self, provider: str, prefix: str, plan: AnthropicPlan, taken_ids: Collection[str] = ()
    ) -> None:
        self.provider = provider
        self.prefix = prefix
        self.plan = plan
        self.done = False
        self.ids = CallIds(taken_ids)
        self.join = TextJoiner()
        self.blocks: dict[int, _Block] = {}
        self.calls: list[PendingCall] = []
        self.server_names: dict[str, str] = {}  # server call id → tool name, for its result
        self.cited: set[tuple[str, bytes]] = set()  # (text block, citation): each Source has its own id
        # The structured output text: text blocks in native mode, the output tool's input in tool mode.
        self.text: list[str] | None = [] if plan.output_schema is not None and not plan.output_tool else None
        self.output: list[str] = []
        self.message_id = ""
        self.model = ""
        self.usage: dict[str, Any] = {}
        self.stop_reason = ""
        self.stop_sequence: str | None = None
        self.stop_details: Any = None

    def feed(self, event: bytes, data: bytes) -> Sequence[ModelChunk]:
        """Chunks for one event; raises ProviderError for an ``error`` event or a line that is not JSON."""
        obj = load_json(self.provider, data)
        if not isinstance(obj, dict):
            return NOTHING
        return self._event(obj)

    def _event(self, obj: dict[str, Any]) -> Sequence[ModelChunk]:
        kind = obj.get("type")
        if kind == "content_block_delta":
            block = self.blocks.get(obj["index"])
            if block is None:
                return NOTHING
            delta = obj["delta"]
            dtype = delta.get("type")
            if dtype == "text_delta":
                # A character split across deltas is held until its second half arrives (wire.py).
                text = self.join.push(block.id, delta["text"] or "")
                if not text:
                    return NOTHING
                if self.text is not None:
                    self.text.append(text)
                return (TextDelta(block.id, text),)
            if dtype == "input_json_delta":
                fragment = delta.get("partial_json") or ""
                if not fragment or block.call is None:
                    return NOTHING
                fragment = self.join.push(block.id, fragment)
                if not fragment:
                    return NOTHING
                block.call.parts.append(fragment)
                if block.kind in (_TOOL, _SERVER):
                    return (ToolInputDelta(block.call.tool_call_id, fragment),)
                if block.kind == _OUTPUT and not self.plan.output_wrapped:
                    self.output.append(fragment)
                    return (TextDelta(block.id, fragment),)
                return NOTHING
            if dtype == "thinking_delta":
                thinking = self.join.push(block.id, delta.get("thinking") or "")
                return (ReasoningDelta(block.id, thinking),) if thinking else NOTHING
            if dtype == "signature_delta":
                block.data += delta.get("signature") or ""
                return NOTHING
            if dtype == "citations_delta":
                return self._citation(delta.get("citation") or {}, block.id)
            return NOTHING
        if kind == "content_block_start":
            return self._start(obj["index"], obj.get("content_block") or {})
        if kind == "content_block_stop":
            return self._stop(obj["index"])
        if kind == "ping":
            return NOTHING
        if kind == "message_start":
            message = obj.get("message") or {}
            self.message_id = message.get("id") or ""
            self.model = message.get("model") or ""
            self.usage.update(message.get("usage") or {})
            # Input tokens are known now: if the step is cut short they still count (§11).
            usage = UsageUpdate(self._usage())
            content = message.get("content")
            if content and isinstance(content, list):
                return (*self._given_whole(content), usage)
            return (usage,)
        if kind == "message_delta":
            delta = obj.get("delta") or {}
            self.stop_reason = delta.get("stop_reason") or self.stop_reason
            self.stop_sequence = delta.get("stop_sequence")
            # A refusal's category and explanation (docs/semantics.md §11): kept in provider_metadata.
            self.stop_details = delta.get("stop_details") or self.stop_details
            self.usage.update({k: v for k, v in (obj.get("usage") or {}).items() if v is not None})
            return (UsageUpdate(self._usage()),)
        if kind == "message_stop":
            self.done = True
            return self._finish()
        if kind == "error":
            raise errors.from_stream_error(self.provider, obj)
        return NOTHING

    def _given_whole(self, content: list[Any]) -> list[ModelChunk]:
        """Blocks ``message_start`` already holds (programmatic tool calling gives the calls its code
        made there, https://platform.claude.com/docs/en/agents-and-tools/tool-use/programmatic-tool-calling):
        each one as its own start and stop, under ids of their own (``<prefix>-m<i>``, keys below 0),
        so the streamed blocks' indices, whether they restart at 0 or go on, meet none of them."""
        out: list[ModelChunk] = []
        for position, block in enumerate(content):
            if not isinstance(block, dict):
                continue
            key = -1 - position
            block_id = f"{self.prefix}-m{position}"
            out.extend(self._start(key, clean_strings(block), block_id))
            for citation in block.get("citations") or ():
                if isinstance(citation, dict):
                    out.extend(self._citation(citation, block_id))
            out.extend(self._stop(key))
        return out

    def _start(self, index: int, content: Mapping[str, Any], block_id: str = "") -> Sequence[ModelChunk]:
        ctype = content.get("type")
        block_id = block_id or f"{self.prefix}-{index}"
        if ctype == "text":
            self.blocks[index] = _Block(_TEXT, block_id)
            text = self.join.push(block_id, content.get("text") or "")
            if text and self.text is not None:
                self.text.append(text)
            return (TextStart(block_id), TextDelta(block_id, text)) if text else (TextStart(block_id),)
        if ctype == "thinking":
            self.blocks[index] = _Block(_THINKING, block_id, content.get("signature") or "")
            thinking = self.join.push(block_id, content.get("thinking") or "")
            start = ReasoningStart(block_id)
            return (start, ReasoningDelta(block_id, thinking)) if thinking else (start,)
        if ctype == "redacted_thinking":
            self.blocks[index] = _Block(_REDACTED, block_id, content.get("data") or "")
            return (ReasoningStart(block_id),)
        if ctype == "tool_use":
            name = content.get("name") or ""
            call = PendingCall(content.get("id") or block_id, name)
            _initial_input(call, content.get("input"))
            if self.plan.output_tool and name == OUTPUT_TOOL:
                self.blocks[index] = _Block(_OUTPUT, block_id, call=call)
                return (TextStart(block_id),)
            # Every call of the turn gets its own id, even when the stream repeats one (docs/semantics.md
            # §11); anthropic_request makes the ids the API receives unique per request as well.
            call.tool_call_id = call_id = self.ids.assign(content.get("id") or "", block_id)
            self.blocks[index] = _Block(_TOOL, call_id, call=call)
            self.calls.append(call)
            return (ToolInputStart(call_id, name),)
        if ctype in _SERVER_USES:
            # The API's own id: the block goes back verbatim and its result names it.
            call = PendingCall(content.get("id") or block_id, content.get("name") or "")
            _initial_input(call, content.get("input"))
            self.server_names[call.tool_call_id] = call.tool_name
            self.blocks[index] = _Block(_SERVER, block_id, call=call, start=content)
            return (ToolInputStart(call.tool_call_id, call.tool_name, provider_executed=True),)
        self.blocks[index] = _Block(_OTHER, block_id)
        if isinstance(ctype, str) and _is_server_result(ctype):
            # Its call's pair: the same API needs both back (docs/providers.md, pause_turn).
            return (self._server_result(ctype, content), *result_files(content))
        return NOTHING

    def _server_result(self, ctype: str, block: Mapping[str, Any]) -> ToolResult:
        """A server tool's result block as the result of its call: ``content`` is the output, or,
        for an error (a ``*_error`` content type, an MCP result with ``is_error``), the error text
        (its ``error_code``, or the text it holds) and the content stays in the kept block."""
        call_id = str(block.get("tool_use_id") or "")
        name = self.server_names.get(call_id) or ctype.removesuffix("_tool_result")
        content = block.get("content")
        error = _server_error(content, block.get("is_error") is True)
        kept = {k: v for k, v in block.items() if k != "content"} if error is None else dict(block)
        metadata = {"anthropic": {"result": kept}}
        return ToolResult(call_id, name, output=content, error=error, provider_metadata=metadata)

    def _stop(self, index: int) -> Sequence[ModelChunk]:
        block = self.blocks.get(index)
        if block is None:
            return NOTHING
        kind = block.kind
        rest = self.join.flush(block.id)  # an unfinished character: U+FFFD
        if kind == _TEXT:
            if rest and self.text is not None:
                self.text.append(rest)
            return (TextDelta(block.id, rest), TextEnd(block.id)) if rest else (TextEnd(block.id),)
        if kind == _THINKING:
            meta = {"anthropic": {"type": "thinking"}}
            end = ReasoningEnd(block.id, signature=block.data.encode(), provider_metadata=meta)
            return (ReasoningDelta(block.id, rest), end) if rest else (end,)
        if kind == _REDACTED:
            meta = {"anthropic": {"type": "redacted_thinking"}}
            return (
                ReasoningEnd(block.id, signature=block.data.encode(), redacted=True, provider_metadata=meta),
            )
        if rest and block.call is not None:
            block.call.parts.append(rest)
        if kind == _TOOL and rest:
            return (ToolInputDelta(block.id, rest),)
        if kind == _OUTPUT and block.call is not None:
            if not self.plan.output_wrapped:
                if block.call.parts or block.call.final is None:
                    if rest:
                        self.output.append(rest)
                        return (TextDelta(block.id, rest), TextEnd(block.id))
                    return (TextEnd(block.id),)
                self.output.append(block.call.final)  # the input came whole in content_block_start
                return (TextDelta(block.id, block.call.final), TextEnd(block.id))
            value, _ = parse_tool_input(block.call.raw())
            text = orjson.dumps(value.get("value") if value else None).decode()
            self.output.append(text)
            return (TextDelta(block.id, text), TextEnd(block.id))
        if kind == _SERVER and block.call is not None:
            call = block.call
            raw = call.raw()
            value, _ = parse_tool_input(raw)
            # The block as the API gave it, without its input (the call's input_json): sent back
            # on the next request with the input complete.
            start = {k: v for k, v in (block.start or {}).items() if k != "input"}
            return (
                *((ToolInputDelta(call.tool_call_id, rest),) if rest else ()),
                ToolCall(
                    call.tool_call_id,
                    call.tool_name,
                    value or {},
                    raw_input=raw,
                    provider_executed=True,
                    provider_metadata={"anthropic": {"call": start}},
                ),
            )
        return NOTHING

    def _citation(self, citation: Mapping[str, Any], text_id: str) -> Sequence[ModelChunk]:
        """One Source per citation of text block ``text_id`` (:func:`citation_source`); the same
        citation repeated in one block is one."""
        key = (text_id, orjson.dumps(citation, option=orjson.OPT_SORT_KEYS))
        if key in self.cited:
            return NOTHING
        self.cited.add(key)
        return (citation_source(citation, f"{self.prefix}-src{len(self.cited)}", text_id),)

    def _usage(self) -> Usage:
        """The usage reported so far (``message_start``, then cumulative ``message_delta``s)."""
        usage = self.usage
        cache_read = as_int(usage.get("cache_read_input_tokens"))
        cache_write = as_int(usage.get("cache_creation_input_tokens"))
        input_tokens = as_int(usage.get("input_tokens")) + cache_read + cache_write
        output_tokens = as_int(usage.get("output_tokens"))
        details = usage.get("output_tokens_details") or {}
        # The writes' split by TTL (``cache_creation``): an hour's cost more than five minutes'.
        by_ttl = usage.get("cache_creation") or {}
        return Usage(
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            total_tokens=input_tokens + output_tokens,
            reasoning_tokens=as_int(details.get("thinking_tokens")),
            cached_input_tokens=cache_read,
            cache_write_input_tokens=cache_write,
            cache_write_1h_input_tokens=min(cache_write, as_int(by_ttl.get("ephemeral_1h_input_tokens"))),
        )

    def _finish(self) -> Sequence[ModelChunk]:
        raw = self.stop_reason
        calls = list(finish_tool_calls(self.calls, raw in _TRUNCATED))
        reason: FinishReason = _FINISH.get(raw, FinishReason.OTHER)
        if reason == "tool-calls" and not self.calls:
            reason = FinishReason.STOP  # only the structured-output tool was called
        if reason == "stop" and self.plan.output_schema is not None:
            text = self.output if self.plan.output_tool else self.text
            check_structured_output(self.provider, "".join(text or ()), self.plan.output_schema)
        usage = self.usage
        metadata: dict[str, Any] = {"usage": usage}
        if self.stop_sequence:
            metadata["stop_sequence"] = self.stop_sequence
        if self.stop_details:
            metadata["stop_details"] = self.stop_details
        if self.ids.renamed:
            metadata["tool_call_ids"] = dict(self.ids.renamed)
        step = finish_step(
            reason,
            raw_reason=raw,
            usage=self._usage(),
            response_id=self.message_id,
            response_model=self.model,
            metadata={"anthropic": metadata},
            warnings=self.plan.warnings,
            paused=raw == "pause_turn",
        )
        return (*calls, step)

    def end(self) -> Sequence[ModelChunk]:
        """EOF before ``message_stop``: the step failed."""
        raise errors.incomplete_stream(self.provider, "message_stop")

    def whole(self, body: bytes) -> Sequence[ModelChunk]:
        """A complete (non-streamed) ``message`` object answered to the streaming request, as one step:
        the same chunks its stream would have given. Raises ProviderError (not retryable) when the body
        is not a message; an ``error`` object is the provider's error."""
        obj = clean_strings(load_json(self.provider, body, "the response was a body"))
        if isinstance(obj, dict) and (obj.get("type") == "error" or isinstance(obj.get("error"), dict)):
            raise errors.from_stream_error(self.provider, obj)
        content = obj.get("content") if isinstance(obj, dict) else None
        if not isinstance(obj, dict) or not isinstance(content, list):
            raise errors.invalid_response(
                self.provider, "a JSON body that is not a Messages API message (no content list)", body
            )
        out: list[ModelChunk] = []
        out.extend(self._event({"type": "message_start", "message": {**obj, "content": []}}))
        for index, block in enumerate(content):
            if not isinstance(block, dict):
                raise errors.invalid_response(self.provider, f"content block {index} is not an object", body)
            out.extend(self._start(index, block))
            for citation in block.get("citations") or ():
                if isinstance(citation, dict):
                    out.extend(self._citation(citation, f"{self.prefix}-{index}"))
            out.extend(self._stop(index))
        self.stop_reason = obj.get("stop_reason") or ("tool_use" if self.calls else "end_turn")
        self.stop_sequence = obj.get("stop_sequence")
        self.stop_details = obj.get("stop_details")
        self.done = True
        out.extend(self._finish())
        return out


def _server_error(content: Any, is_error: bool) -> str | None:
    """The error text of a server tool's result ``content``, or None when it is a result: a
    ``*_error`` content object (``web_search_tool_result_error`` …) gives its ``error_code``; an
    MCP result with ``is_error`` its text blocks."""
    if isinstance(content, Mapping) and str(content.get("type") or "").endswith("_error"):
        return str(content.get("error_code") or content.get("type"))
    if is_error:
        texts = [b.get("text") for b in content or () if isinstance(b, Mapping) and b.get("text")]
        return "\n".join(map(str, texts)) or "The tool call failed."
    return None


def _initial_input(call: PendingCall, initial: Any) -> None:
    """A tool_use block's ``input`` given whole in its start (non-empty): the call's final input text."""
    if isinstance(initial, dict) and initial:
        call.final = orjson.dumps(clean_strings(initial)).decode()


def map_anthropic_error(provider: str, error: BaseException) -> ProviderError | None:
    """The SDK's exceptions → ProviderError (None for anything else)."""
    return errors.from_sdk_error(provider, error, anthropic)


_COUNTED = frozenset({"model", "messages", "system", "tools", "tool_choice", "thinking", "output_config"})
"""The ``messages.create`` arguments ``messages.count_tokens`` takes too."""


AnthropicClient = anthropic.AsyncAnthropic | anthropic.AsyncAnthropicBedrock | anthropic.AsyncAnthropicVertex
"""The SDK's clients of the Messages API: Anthropic's own, and its Bedrock and Vertex AI ones
(:mod:`~turnwire_server.providers.anthropic_platforms`)."""


class AnthropicMessagesProvider(SdkProvider[AnthropicClient]):
    """Streams steps from the Anthropic Messages API through ``client`` (an ``AsyncAnthropic``, or a
    platform's client for its subclasses).

    ``models`` is an optional allow-list for :meth:`has_model`; ``default_max_tokens``
    is sent when a turn sets no ``max_output_tokens``; ``structured_output`` picks
    the forced-tool (``tool``) or ``output_config.format`` (``native``) way; ``prompt_caching``
    the lifetime of the cache breakpoints the sidecar places (:mod:`.prompt_cache`; None: none).
    """

    type = "anthropic"
    json_path = "/v1/messages"
    json_fields = frozenset(
        {
            *("model", "max_tokens", "messages", "system", "stop_sequences", "tools", "tool_choice"),
            *("output_config", "thinking", "metadata", "service_tier", "container", "cache_control"),
            *("inference_geo", "speed", "diagnostics"),
        }
    )
    stream_cls = anthropic.AsyncStream[object]

    def __init__(
        self,
        name: str,
        client: AnthropicClient,
        *,
        models: Sequence[str] = (),
        default_max_tokens: int = 8192,
        structured_output: StructuredMode = "tool",
        prompt_caching: CacheTtl | None = None,
        retry_delay: float = 0.5,
    ) -> None:
        super().__init__(name, client, models=models, retry_delay=retry_delay)
        self.default_max_tokens = default_max_tokens
        self.structured_output: StructuredMode = structured_output
        self.prompt_caching: CacheTtl | None = prompt_caching

    def _prepare(self, request: ModelRequest) -> SdkCall:
        plan = build_request(
            request,
            provider=self.name,
            default_max_tokens=self.default_max_tokens,
            structured_output=self.structured_output,
        )
        if self.prompt_caching is not None:
            place_breakpoints(plan.kwargs, self.prompt_caching)
        prefix, name = f"s{request.step_number}", self.name
        taken = plan.call_ids
        return SdkCall(plan.kwargs, plan.extra_body, lambda: AnthropicDecoder(name, prefix, plan, taken))

    def cache_writes(self, request: ModelRequest | None) -> CacheTtl | None:
        """The longest lifetime a step of ``request`` (None: one not built yet, so only the
        breakpoints this provider places count) may write the prompt cache at, ``5m`` or
        ``1h``, or None when it places no marker (:func:`.prompt_cache.cache_writes`): what a
        budget prices its prompt at (docs/cost.md, "Budgets")."""
        options = {} if request is None else request.settings.provider_options or {}
        return cache_writes(self.prompt_caching, provider_options(options, self.name, "anthropic"))

    def _create(self, client: AnthropicClient) -> OpenStream:
        return client.messages.with_streaming_response.create

    async def count_tokens(self, request: ModelRequest) -> int | None:
        """The input tokens of ``request`` by the API's ``POST /v1/messages/count_tokens``
        (``messages.count_tokens``: the same system, messages and tools a step sends). Raises
        ProviderError as :meth:`stream` does."""
        kwargs = self._prepare(request).kwargs
        counted = {k: v for k, v in kwargs.items() if k in _COUNTED}
        result = await self._unary(self.client.messages.count_tokens(**counted))
        return int(result.input_tokens)

    def _map_error(self, error: BaseException) -> ProviderError | None:
        return map_anthropic_error(self.name, error)
