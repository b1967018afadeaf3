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
``response.function_call_arguments.delta`` (routed by ``item_id``) →
``response.output_item.done`` (reasoning → ReasoningEnd with the encrypted content
as signature and ``provider_metadata={"openai": {"item_id"}}``; the call's final
arguments) → ``response.completed`` | ``response.incomplete`` | ``response.failed``;
an ``error`` event (top-level or nested ``error`` object) is a ProviderError.

Finish: completed → stop, or tool-calls when calls were made (raw ``completed``);
incomplete ``max_output_tokens`` → length (every call errored, never run),
``content_filter`` → content-filter; refusals → content-filter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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
)
from turnwire_server.providers import errors
from turnwire_server.providers.convert import PendingCall, finish_tool_calls
from turnwire_server.providers.openai_common import OpenAIDecoder, map_openai_error, openai_usage
from turnwire_server.providers.openai_responses_request import EncryptedReasoning, build_request
from turnwire_server.providers.streaming import NOTHING, OpenStream, SdkCall, SdkProvider


class ResponsesDecoder(OpenAIDecoder):
    """Responses stream events → chunks (see the module docstring)."""

    def __init__(
        self, provider: str, prefix: str, output_schema: Mapping[str, Any] | None, warnings: list[str]
    ):
        super().__init__(provider, prefix, output_schema, warnings)
        self.texts: dict[str, str] = {}  # open text blocks: "item_id:content_index" → block id
        self.reasoning: dict[str, tuple[str, int]] = {}  # item id → (block id, last summary index)
        self.calls: dict[str, PendingCall] = {}  # function_call item id → call
        self.refused = False

    def feed(self, event: bytes, data: bytes) -> Sequence[ModelChunk]:
        """Chunks for one event; raises ProviderError for ``error`` / ``response.failed``."""
        obj = orjson.loads(data)
        kind = obj.get("type")
        if kind in {"response.output_text.delta", "response.refusal.delta"}:
            delta = obj.get("delta") or ""
            if not delta:
                return NOTHING
            key = f"{obj.get('item_id')}:{obj.get('content_index', 0)}"
            block_id = self.texts.get(key)
            if kind == "response.refusal.delta":
                self.refused = True
            elif self.text is not None:
                self.text.append(delta)
            if block_id is None:
                block_id = self.texts[key] = (
                    f"{self.prefix}-{obj.get('output_index', 0)}-{obj.get('content_index', 0)}"
                )
                return (TextStart(block_id), TextDelta(block_id, delta))
            return (TextDelta(block_id, delta),)
        if kind == "response.function_call_arguments.delta":
            call = self.calls.get(obj.get("item_id") or "")
            delta = obj.get("delta") or ""
            if call is None or not delta:
                return NOTHING
            call.parts.append(delta)
            return (ToolInputDelta(call.tool_call_id, delta),)
        if kind in {"response.reasoning_summary_text.delta", "response.reasoning_text.delta"}:
            return self._reasoning_delta(obj)
        if kind in ("response.output_text.done", "response.refusal.done"):
            block_id = self.texts.pop(f"{obj.get('item_id')}:{obj.get('content_index', 0)}", None)
            return (TextEnd(block_id),) if block_id else NOTHING
        if kind == "response.output_item.added":
            return self._item_added(obj.get("item") or {}, obj.get("output_index", 0))
        if kind == "response.output_item.done":
            return self._item_done(obj.get("item") or {})
        if kind == "response.function_call_arguments.done":
            call = self.calls.get(obj.get("item_id") or "")
            if call is not None and isinstance(obj.get("arguments"), str):
                call.final = obj["arguments"]
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
        return NOTHING

    def _reasoning_delta(self, obj: Mapping[str, Any]) -> Sequence[ModelChunk]:
        item_id = obj.get("item_id") or ""
        delta = obj.get("delta") or ""
        entry = self.reasoning.get(item_id)
        out: list[ModelChunk] = []
        if entry is None:
            entry = (f"{self.prefix}-r-{item_id}", -1)
            out.append(ReasoningStart(entry[0]))
        block_id, last = entry
        index = obj.get("summary_index", obj.get("content_index", 0))
        if last >= 0 and index != last:
            out.append(ReasoningDelta(block_id, "\n\n"))
        self.reasoning[item_id] = (block_id, index)
        if delta:
            out.append(ReasoningDelta(block_id, delta))
        return out

    def _item_added(self, item: Mapping[str, Any], output_index: int) -> Sequence[ModelChunk]:
        itype = item.get("type")
        if itype == "function_call":
            call = PendingCall(item.get("call_id") or item.get("id") or "", item.get("name") or "")
            self.calls[item.get("id") or call.tool_call_id] = call
            return (ToolInputStart(call.tool_call_id, call.tool_name),)
        if itype == "reasoning":
            item_id = item.get("id") or ""
            block_id = f"{self.prefix}-{output_index}"
            self.reasoning[item_id] = (block_id, -1)
            return (ReasoningStart(block_id),)
        return NOTHING

    def _item_done(self, item: Mapping[str, Any]) -> Sequence[ModelChunk]:
        itype = item.get("type")
        item_id = item.get("id") or ""
        if itype == "function_call":
            call = self.calls.get(item_id)
            if call is not None and isinstance(item.get("arguments"), str):
                call.final = item["arguments"]
            return NOTHING
        if itype == "reasoning":
            entry = self.reasoning.pop(item_id, None)
            out: list[ModelChunk] = []
            if entry is None:
                entry = (f"{self.prefix}-r-{item_id}", -1)
                out.append(ReasoningStart(entry[0]))
            encrypted = item.get("encrypted_content") or ""
            has_text = entry[1] >= 0 or any(s.get("text") for s in item.get("summary") or ())
            out.append(
                ReasoningEnd(
                    entry[0],
                    signature=encrypted.encode(),
                    redacted=bool(encrypted) and not has_text,
                    provider_metadata={"openai": {"item_id": item_id}},
                )
            )
            return out
        if itype == "message":
            ends = [key for key in self.texts if key.startswith(f"{item_id}:")]
            return [TextEnd(self.texts.pop(key)) for key in ends]
        return NOTHING

    def _finish(self, response: Mapping[str, Any]) -> Sequence[ModelChunk]:
        out: list[ModelChunk] = [TextEnd(block_id) for block_id in self.texts.values()]
        self.texts.clear()
        status = response.get("status") or ""
        incomplete = (response.get("incomplete_details") or {}).get("reason") or ""
        raw = incomplete or status
        calls = list(self.calls.values())
        out.extend(finish_tool_calls(calls, incomplete == "max_output_tokens"))
        reason: FinishReason
        if incomplete == "max_output_tokens":
            reason = FinishReason.LENGTH
        elif incomplete == "content_filter" or self.refused:
            reason = FinishReason.CONTENT_FILTER
        elif incomplete:
            reason = FinishReason.OTHER
        else:
            reason = FinishReason.TOOL_CALLS if calls else FinishReason.STOP
        usage = response.get("usage") or {}
        out.append(
            self._finish_step(
                reason,
                raw,
                openai_usage(usage, "input", "output"),
                {"usage": usage} if usage else {},
                response_id=response.get("id") or self.response_id,
                response_model=response.get("model") or self.model,
            )
        )
        return out

    def end(self) -> Sequence[ModelChunk]:
        """EOF before ``response.completed`` / ``incomplete`` / ``failed``: the step failed."""
        raise errors.incomplete_stream(self.provider, "response.completed")


class OpenAIResponsesProvider(SdkProvider[openai.AsyncOpenAI]):
    """Streams steps from the Responses API through ``client`` (an ``AsyncOpenAI``).

    ``store`` is sent as is (default false: Turnwire keeps the transcript, and
    reasoning round-trips as encrypted content); ``encrypted_reasoning`` says when
    to ask for it (``auto``: reasoning models only)."""

    type = "openai-responses"

    def __init__(
        self,
        name: str,
        client: openai.AsyncOpenAI,
        *,
        models: Sequence[str] = (),
        store: bool = False,
        encrypted_reasoning: EncryptedReasoning = "auto",
        retry_delay: float = 0.5,
    ) -> None:
        super().__init__(name, client, models=models, retry_delay=retry_delay)
        self.store = store
        self.encrypted_reasoning: EncryptedReasoning = encrypted_reasoning

    def _prepare(self, request: ModelRequest) -> SdkCall:
        body, warnings = build_request(
            request, provider=self.name, store=self.store, encrypted_reasoning=self.encrypted_reasoning
        )
        kwargs = {"model": body.pop("model"), "input": body.pop("input")}
        prefix, name, schema = f"s{request.step_number}", self.name, request.output_schema
        return SdkCall(kwargs, body, lambda: ResponsesDecoder(name, prefix, schema, warnings))

    def _create(self, client: openai.AsyncOpenAI) -> OpenStream:
        return client.responses.with_streaming_response.create

    def _map_error(self, error: BaseException) -> ProviderError | None:
        return map_openai_error(self.name, error)
