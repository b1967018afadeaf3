"""The OpenAI Chat Completions adapter, also for OpenAI-compatible servers (``openai`` SDK, ``AsyncOpenAI``).

Follows https://platform.openai.com/docs/api-reference/chat/create-stream. The SDK
sends the request (``chat.completions.with_streaming_response.create``); the SSE
body (``data: {chat.completion.chunk}`` lines, then ``data: [DONE]``) is decoded
here with orjson.

Request (:func:`build_request`): ``system`` message first; user text, images
(``image_url``), PDFs (``file``), audio (``input_audio``) and text files; each
assistant step as one assistant message (text + ``tool_calls``) followed at once
by one ``tool`` message per call, with the matching ``tool_call_id``; reasoning is
not sent (the API has no field for it). Tools from JSON Schema, ``tool_choice``,
``stream_options.include_usage``, ``response_format`` ``json_schema`` for
structured output, sampling settings (``top_k`` only via provider options, for
servers such as vLLM that take it), ``provider_options`` merged into the body.

Stream tolerance (vLLM, llama.cpp, Ollama, LiteLLM, OpenRouter): tool-call
fragments are keyed by ``index`` (never by name or position in the chunk); a call
whose id is missing gets one; a new id at a used index opens a new call;
``reasoning_content`` / ``reasoning`` deltas become reasoning; a chunk with a
top-level ``error`` (or ``finish_reason: "error"``) is a ProviderError; usage may
come in a final chunk with ``choices: []``, or never; a missing finish reason is
``stop`` (or ``tool-calls`` when calls were made); a stream that ends after a
finish reason without ``[DONE]`` is accepted, one that ends before is an error.

Finish: ``stop`` → stop (tool-calls when calls were made), ``length`` → length
(every call errored, never run), ``tool_calls`` → tool-calls, ``content_filter``
and refusals → content-filter, others → other. Refusal text is streamed as text and
kept in ``provider_metadata["openai"]["refusal"]``.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any, Literal

import openai
import orjson

from server.providers import errors
from server.providers.base import (
    FinishReason,
    ModelChunk,
    ModelRequest,
    ProviderError,
    ReasoningDelta,
    ReasoningEnd,
    ReasoningStart,
    TextDelta,
    TextEnd,
    TextStart,
    ToolInputDelta,
    ToolInputStart,
    Usage,
)
from server.providers.convert import (
    EMPTY_USER_TEXT,
    PendingCall,
    as_int,
    assistant_steps,
    check_structured_output,
    dumps,
    file_base64,
    file_text,
    file_url,
    finish_step,
    finish_tool_calls,
    provider_options,
    tool_input,
    tool_result,
)
from server.providers.openai_common import drop_sampling, map_openai_error
from server.providers.streaming import NOTHING, run_stream
from turnwire.v1 import message_pb2

MaxTokensParam = Literal["max_completion_tokens", "max_tokens"]

_FINISH: dict[str, FinishReason] = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "stop_sequence": "stop",
    "length": "length",
    "max_tokens": "length",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "content_filter": "content-filter",
}
_TRUNCATED = frozenset({"length", "max_tokens"})
_AUDIO = {"audio/wav": "wav", "audio/x-wav": "wav", "audio/mpeg": "mp3", "audio/mp3": "mp3"}


def _user_content(message: message_pb2.Message, warnings: list[str]) -> str | list[dict[str, Any]]:
    parts: list[dict[str, Any]] = []
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            if part.text.text:
                parts.append({"type": "text", "text": part.text.text})
        elif kind == "file":
            file = part.file
            media = file.media_type
            if media.startswith("image/"):
                parts.append({"type": "image_url", "image_url": {"url": file_url(file)}})
            elif media == "application/pdf" and file.WhichOneof("content") == "data":
                pdf = {"file_data": file_url(file), "filename": file.filename or "document.pdf"}
                parts.append({"type": "file", "file": pdf})
            elif media in _AUDIO and file.WhichOneof("content") == "data":
                audio = {"data": file_base64(file), "format": _AUDIO[media]}
                parts.append({"type": "input_audio", "input_audio": audio})
            elif (text := file_text(file)) is not None:
                parts.append({"type": "text", "text": text})
            else:
                warnings.append(
                    f"a {media or 'untyped'} file was not sent: Chat Completions does not take it"
                )
    if not parts:
        return EMPTY_USER_TEXT
    if all(p["type"] == "text" for p in parts):
        return "\n".join(p["text"] for p in parts)
    return parts


def convert_messages(
    system: str, messages: Sequence[message_pb2.Message], warnings: list[str]
) -> list[dict[str, Any]]:
    """Chat messages for the transcript (see the module docstring)."""
    result: list[dict[str, Any]] = []
    if system.strip():
        result.append({"role": "system", "content": system})
    for message in messages:
        role = message.role
        if role == message_pb2.ROLE_SYSTEM:
            text = "".join(p.text.text for p in message.parts if p.WhichOneof("kind") == "text")
            if text.strip():
                result.append({"role": "system", "content": text})
        elif role == message_pb2.ROLE_USER:
            result.append({"role": "user", "content": _user_content(message, warnings)})
        elif role == message_pb2.ROLE_ASSISTANT:
            for step in assistant_steps(message):
                text = "".join(p.text.text for p in step if p.WhichOneof("kind") == "text")
                calls = [p.tool_call for p in step if p.WhichOneof("kind") == "tool_call"]
                if not text and not calls:
                    continue
                assistant: dict[str, Any] = {"role": "assistant"}
                if text:
                    assistant["content"] = text
                if calls:
                    assistant["tool_calls"] = [
                        {
                            "id": call.tool_call_id,
                            "type": "function",
                            "function": {"name": call.tool_name, "arguments": dumps(tool_input(call))},
                        }
                        for call in calls
                    ]
                result.append(assistant)
                for call in calls:
                    content, _ = tool_result(call)
                    result.append({"role": "tool", "tool_call_id": call.tool_call_id, "content": content})
    return result


def build_request(
    request: ModelRequest, *, provider: str, max_tokens_param: MaxTokensParam, include_usage: bool
) -> tuple[dict[str, Any], list[str]]:
    """``(body, warnings)``: the ``chat.completions.create`` arguments. Raises ProviderError for a request
    the API would reject (max tokens < 1, an unknown named tool)."""
    settings = request.settings
    warnings: list[str] = []
    body: dict[str, Any] = {
        "model": request.model,
        "messages": convert_messages(request.system, request.messages, warnings),
    }
    if include_usage:
        body["stream_options"] = {"include_usage": True}
    if settings.max_output_tokens is not None:
        if settings.max_output_tokens < 1:
            raise errors.invalid_request(
                provider, f"max tokens must be at least 1, got {settings.max_output_tokens}"
            )
        body[max_tokens_param] = settings.max_output_tokens
    sampling = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
    dropped = drop_sampling(settings, request.model, sampling, warnings)
    for name in sampling:
        value = getattr(settings, name)
        if value is not None and name not in dropped:
            body[name] = value
    if settings.seed is not None:
        body["seed"] = settings.seed
    if settings.stop_sequences:
        body["stop"] = list(settings.stop_sequences)
    if settings.top_k is not None:
        warnings.append("top_k is not part of Chat Completions and was not sent (set it in provider_options)")
    if request.tools:
        body["tools"] = [
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "parameters": dict(tool.input_schema) or {"type": "object", "properties": {}},
                    **({"description": tool.description} if tool.description else {}),
                },
            }
            for tool in request.tools
        ]
        choice = request.tool_choice
        if choice in ("auto", "none", "required"):
            body["tool_choice"] = choice
        elif choice in {tool.name for tool in request.tools}:
            body["tool_choice"] = {"type": "function", "function": {"name": choice}}
        else:
            raise errors.invalid_request(
                provider, f"tool_choice names tool {choice!r}, which is not among the tools"
            )
    if request.output_schema is not None:
        body["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": dict(request.output_schema), "strict": False},
        }
    body.update(provider_options(settings.provider_options, provider, "openai"))
    return body, warnings


class _Call(PendingCall):
    __slots__ = ("started",)

    def __init__(self, tool_call_id: str, tool_name: str) -> None:
        super().__init__(tool_call_id, tool_name)
        self.started = False


class ChatDecoder:
    """``chat.completion.chunk`` events → chunks (see the module docstring)."""

    def __init__(
        self, provider: str, prefix: str, output_schema: Mapping[str, Any] | None, warnings: list[str]
    ):
        self.provider = provider
        self.prefix = prefix
        self.output_schema = output_schema
        self.warnings = warnings
        self.done = False
        self.text_id: str | None = None
        self.reasoning_id: str | None = None
        self.blocks = 0
        self.by_index: dict[int, _Call] = {}
        self.calls: list[_Call] = []
        self.text: list[str] | None = [] if output_schema is not None else None
        self.refusal: list[str] = []
        self.finish: str | None = None
        self.response_id = ""
        self.model = ""
        self.usage: dict[str, Any] | None = None

    def feed(self, event: bytes, data: bytes) -> Sequence[ModelChunk]:
        """Chunks for one ``data:`` line; raises ProviderError for an error chunk."""
        if data == b"[DONE]":
            self.done = True
            return self._finish()
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise ProviderError(
                f"{self.provider}: the stream sent a line that is not JSON: "
                f"{data[:300].decode('utf-8', 'replace')}",
                type="invalid_stream_data",
                body=data.decode("utf-8", "replace"),
                provider=self.provider,
            ) from None
        if not isinstance(obj, dict):
            return NOTHING
        if obj.get("error") is not None:
            raise errors.from_stream_error(self.provider, obj)
        if not self.response_id:
            self.response_id = obj.get("id") or ""
            self.model = obj.get("model") or ""
        usage = obj.get("usage")
        if usage:
            self.usage = usage
        choices = obj.get("choices")
        if not choices:
            return NOTHING
        choice = choices[0]
        delta = choice.get("delta") or {}
        out: list[ModelChunk] = []
        content = delta.get("content")
        if content:
            if self.reasoning_id is not None:
                out.append(ReasoningEnd(self.reasoning_id))
                self.reasoning_id = None
            if self.text_id is None:
                self.text_id = self._block_id()
                out.append(TextStart(self.text_id))
            if self.text is not None:
                self.text.append(content)
            out.append(TextDelta(self.text_id, content))
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning and isinstance(reasoning, str):
            if self.reasoning_id is None:
                self.reasoning_id = self._block_id()
                out.append(ReasoningStart(self.reasoning_id))
            out.append(ReasoningDelta(self.reasoning_id, reasoning))
        refusal = delta.get("refusal")
        if refusal:
            self.refusal.append(refusal)
            if self.text_id is None:
                self.text_id = self._block_id()
                out.append(TextStart(self.text_id))
            out.append(TextDelta(self.text_id, refusal))
        tool_calls = delta.get("tool_calls")
        if tool_calls:
            self._tool_calls(tool_calls, out)
        finish = choice.get("finish_reason")
        if finish:
            if finish == "error":
                raise errors.from_stream_error(self.provider, obj)
            self.finish = finish
        return out

    def _block_id(self) -> str:
        self.blocks += 1
        return f"{self.prefix}-{self.blocks}"

    def _tool_calls(self, fragments: list[dict[str, Any]], out: list[ModelChunk]) -> None:
        for fragment in fragments:
            index = fragment.get("index", 0)
            call_id = fragment.get("id")
            function = fragment.get("function") or {}
            call = self.by_index.get(index)
            if call is None or (call_id and call_id != call.tool_call_id):
                call = _Call(call_id or f"call_{self.prefix}_{len(self.calls)}", function.get("name") or "")
                self.by_index[index] = call
                self.calls.append(call)
            elif function.get("name") and not call.tool_name:
                call.tool_name = function["name"]
            arguments = function.get("arguments")
            if arguments:
                call.parts.append(arguments)
            if not call.started and call.tool_name:
                call.started = True
                if self.text_id is not None:
                    out.append(TextEnd(self.text_id))
                    self.text_id = None
                out.append(ToolInputStart(call.tool_call_id, call.tool_name))
                if call.parts:
                    out.append(ToolInputDelta(call.tool_call_id, "".join(call.parts)))
            elif call.started and arguments:
                out.append(ToolInputDelta(call.tool_call_id, arguments))

    def _finish(self) -> Sequence[ModelChunk]:
        out: list[ModelChunk] = []
        if self.reasoning_id is not None:
            out.append(ReasoningEnd(self.reasoning_id))
        if self.text_id is not None:
            out.append(TextEnd(self.text_id))
        raw = self.finish or ""
        calls = [c for c in self.calls if c.tool_name]
        for call in calls:
            if not call.started:
                out.append(ToolInputStart(call.tool_call_id, call.tool_name))
        out.extend(finish_tool_calls(calls, raw in _TRUNCATED))
        reason: FinishReason = _FINISH.get(raw, "other") if raw else "stop"
        if reason == "stop" and calls:
            reason = "tool-calls"
        metadata: dict[str, Any] = {}
        if self.refusal:
            reason = "content-filter"
            metadata["refusal"] = "".join(self.refusal)
        if self.text is not None and reason == "stop" and self.output_schema is not None:
            check_structured_output(self.provider, "".join(self.text), self.output_schema)
        usage = self.usage or {}
        input_tokens = as_int(usage.get("prompt_tokens"))
        output_tokens = as_int(usage.get("completion_tokens"))
        if usage:
            metadata["usage"] = usage
        out.append(
            finish_step(
                reason,
                raw_reason=raw,
                usage=Usage(
                    input_tokens=input_tokens,
                    output_tokens=output_tokens,
                    total_tokens=as_int(usage.get("total_tokens")) or input_tokens + output_tokens,
                    reasoning_tokens=as_int(
                        (usage.get("completion_tokens_details") or {}).get("reasoning_tokens")
                    ),
                    cached_input_tokens=as_int(
                        (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
                    ),
                ),
                response_id=self.response_id,
                response_model=self.model,
                metadata={"openai": metadata} if metadata else {},
                warnings=self.warnings,
            )
        )
        return out

    def end(self) -> Sequence[ModelChunk]:
        """EOF without ``[DONE]``: fine after a finish reason (some servers omit it), an error before."""
        if self.finish is None:
            raise errors.incomplete_stream(self.provider, "a finish reason")
        self.done = True
        return self._finish()


class OpenAIChatProvider:
    """Streams steps from Chat Completions through ``client`` (an ``AsyncOpenAI``; ``base_url`` for
    OpenAI-compatible servers). ``max_tokens_param`` names the output limit field
    (``max_completion_tokens`` for OpenAI, ``max_tokens`` for most compatible servers);
    ``include_usage`` asks for the usage chunk."""

    type = "openai"

    def __init__(
        self,
        name: str,
        client: openai.AsyncOpenAI,
        *,
        models: Sequence[str] = (),
        max_tokens_param: MaxTokensParam = "max_completion_tokens",
        include_usage: bool = True,
        retry_delay: float = 0.5,
    ) -> None:
        self.name = name
        self.client = client
        self.models = frozenset(models)
        self.max_tokens_param: MaxTokensParam = max_tokens_param
        self.include_usage = include_usage
        self.retry_delay = retry_delay

    def has_model(self, model: str) -> bool:
        """True unless an allow-list is configured and ``model`` is not on it."""
        return not self.models or model in self.models

    async def stream(self, request: ModelRequest) -> AsyncGenerator[ModelChunk, None]:
        """Stream one step. Raises ProviderError (see :mod:`server.providers.errors`)."""
        body, warnings = build_request(
            request,
            provider=self.name,
            max_tokens_param=self.max_tokens_param,
            include_usage=self.include_usage,
        )
        settings = request.settings
        client = self.client
        if settings.max_retries is not None:
            client = client.with_options(max_retries=settings.max_retries)
        model, messages = body.pop("model"), body.pop("messages")
        extra: dict[str, Any] = {"extra_body": body} if body else {}
        if settings.headers:
            extra["extra_headers"] = dict(settings.headers)
        if settings.timeout is not None:
            extra["timeout"] = settings.timeout
        create = client.chat.completions.with_streaming_response.create
        prefix, name, schema = f"s{request.step_number}", self.name, request.output_schema

        def open_response() -> Any:
            return create(model=model, messages=messages, stream=True, **extra)

        async for chunk in run_stream(
            name,
            open_response,
            lambda: ChatDecoder(name, prefix, schema, warnings),
            lambda error: map_openai_error(name, error),
            retries=client.max_retries,
            retry_delay=self.retry_delay,
        ):
            yield chunk

    async def aclose(self) -> None:
        """Close the SDK client and its connections."""
        await self.client.close()
