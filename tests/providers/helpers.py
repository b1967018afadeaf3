"""Test helpers: transcripts as proto messages, and a stream collector."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import orjson
from google.protobuf import struct_pb2

from turnwire import types as base
from turnwire.providers import ModelRequest, Provider, ProviderError
from turnwire.types import ModelChunk
from turnwire_client.v1 import message_pb2


def anthropic_http() -> anthropic.DefaultAioHttpClient:
    """The SDK's aiohttp client, the one the sidecar uses (providers/settings.py), without TLS setup
    (the replay server is plain HTTP; building a verifying SSL context costs ~50 ms per client)."""
    return anthropic.DefaultAioHttpClient(verify=False)


def cloud_adapter(api: str, url: str) -> Provider:
    """The ``bedrock``, ``vertex`` or ``gemini`` adapter at ``url`` with explicit test credentials
    (no credential chain is asked): AWS keys, a Vertex AI access token, a Gemini API key. The
    caller closes it (``aclose``)."""
    if api == "gemini":
        from google import genai
        from google.genai import types

        from turnwire_server.providers.gemini import GeminiProvider, async_http_client

        options = types.HttpOptions(base_url=url, httpx_async_client=async_http_client())
        client = genai.Client(api_key="test-key", http_options=options)
        return GeminiProvider("gemini", client, max_retries=0, retry_delay=0.01)
    from turnwire_server.providers.anthropic_platforms import BedrockMessagesProvider, VertexMessagesProvider

    if api == "bedrock":
        bedrock = anthropic.AsyncAnthropicBedrock(
            aws_access_key="AKIDEXAMPLE",
            aws_secret_key="test-secret",
            aws_region="us-east-1",
            base_url=url,
            max_retries=0,
            http_client=anthropic_http(),
        )
        return BedrockMessagesProvider("bedrock", bedrock, retry_delay=0.01)
    vertex = anthropic.AsyncAnthropicVertex(
        region="us-east5",
        project_id="test-project",
        access_token="test-token",
        base_url=f"{url}/v1",
        max_retries=0,
        http_client=anthropic_http(),
    )
    return VertexMessagesProvider("vertex", vertex, retry_delay=0.01)


def openai_http() -> openai.DefaultAioHttpClient:
    """See :func:`anthropic_http`."""
    return openai.DefaultAioHttpClient(verify=False)


def user(*parts: str | message_pb2.FilePart) -> message_pb2.Message:
    """A user message of text and file parts."""
    message = message_pb2.Message(role=message_pb2.ROLE_USER)
    for part in parts:
        if isinstance(part, str):
            message.parts.add().text.text = part
        else:
            message.parts.add().file.CopyFrom(part)
    return message


def system(text: str) -> message_pb2.Message:
    message = message_pb2.Message(role=message_pb2.ROLE_SYSTEM)
    message.parts.add().text.text = text
    return message


def text(value: str) -> message_pb2.Part:
    return message_pb2.Part(text=message_pb2.TextPart(text=value))


def reasoning(
    value: str, signature: bytes = b"", *, redacted: bool = False, metadata: dict[str, Any] | None = None
) -> message_pb2.Part:
    part = message_pb2.Part(
        reasoning=message_pb2.ReasoningPart(text=value, signature=signature, redacted=redacted)
    )
    if metadata:
        part.reasoning.provider_metadata.update(metadata)
    return part


def tool_call(
    call_id: str,
    name: str,
    arguments: dict[str, Any],
    *,
    output: Any = None,
    error: str | None = None,
    state: message_pb2.ToolCallState.ValueType | None = None,
) -> message_pb2.Part:
    """A tool call part; with ``output`` or ``error`` it carries its result."""
    call = message_pb2.ToolCallPart(tool_call_id=call_id, tool_name=name)
    call.input.update(arguments)
    if error is not None:
        call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR
        call.error_text = error
    elif output is not None:
        call.state = message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE
        value = struct_pb2.Value()
        if isinstance(output, str):
            value.string_value = output
        elif isinstance(output, dict):
            value.struct_value.update(output)
        else:
            raise TypeError(output)
        call.output.CopyFrom(value)
    else:
        call.state = message_pb2.TOOL_CALL_STATE_INPUT_AVAILABLE
    if state is not None:
        call.state = state
    return message_pb2.Part(tool_call=call)


def step_start() -> message_pb2.Part:
    return message_pb2.Part(step_start=message_pb2.StepStartPart())


def assistant(*steps: Sequence[message_pb2.Part]) -> message_pb2.Message:
    """An assistant message: each argument is one step's parts."""
    message = message_pb2.Message(role=message_pb2.ROLE_ASSISTANT)
    for parts in steps:
        message.parts.append(step_start())
        message.parts.extend(parts)
    return message


def image(data: bytes = b"\x89PNG...", media_type: str = "image/png") -> message_pb2.FilePart:
    return message_pb2.FilePart(media_type=media_type, data=data)


def request(*messages: message_pb2.Message, **kwargs: Any) -> ModelRequest:
    """A ModelRequest (model ``m``, system ``You are terse.`` unless given)."""
    kwargs.setdefault("model", "m")
    kwargs.setdefault("system", "You are terse.")
    return ModelRequest(messages=list(messages) or [user("hi")], **kwargs)


@dataclass
class Collected:
    """Everything one stream produced: ``usage_updates`` apart from the other ``chunks`` (they
    come between any of them, so the other chunks' order is what tests compare)."""

    chunks: list[ModelChunk] = field(default_factory=list)
    usage_updates: list[base.Usage] = field(default_factory=list)
    error: ProviderError | None = None

    @property
    def text(self) -> str:
        return "".join(c.delta for c in self.chunks if isinstance(c, base.TextDelta))

    @property
    def reasoning(self) -> str:
        return "".join(c.delta for c in self.chunks if isinstance(c, base.ReasoningDelta))

    @property
    def calls(self) -> list[base.ToolCall]:
        """The calls the application runs (provider-executed ones are in :attr:`executed`)."""
        return [c for c in self.chunks if isinstance(c, base.ToolCall) and not c.provider_executed]

    @property
    def executed(self) -> list[base.ToolCall]:
        """The calls the provider ran itself."""
        return [c for c in self.chunks if isinstance(c, base.ToolCall) and c.provider_executed]

    @property
    def finish(self) -> base.FinishStep:
        assert isinstance(self.chunks[-1], base.FinishStep), self.chunks[-1:]
        return self.chunks[-1]

    def of(self, kind: type[Any]) -> list[Any]:
        return [c for c in self.chunks if isinstance(c, kind)]


async def collect(provider: Provider, model_request: ModelRequest) -> Collected:
    """Consume the whole stream; a ProviderError is kept, not raised."""
    result = Collected()
    try:
        async for chunk in provider.stream(model_request):
            if isinstance(chunk, base.UsageUpdate):
                result.usage_updates.append(chunk.usage)
            else:
                result.chunks.append(chunk)
    except ProviderError as error:
        result.error = error
    return result


class Stored:
    """Builds the assistant message the engine would store from adapters' chunks (its own
    ``AssistantMessage``), then results for the tool calls: what the NEXT request replays."""

    def __init__(self) -> None:
        from google.protobuf import timestamp_pb2

        from turnwire_server.engine.assistant_message import AssistantMessage

        self.message = AssistantMessage("msg_test", timestamp_pb2.Timestamp())

    def step(self, chunks: Sequence[ModelChunk], outputs: dict[str, Any] | None = None) -> Stored:
        """Record one step's chunks; ``outputs`` maps tool call ids to results."""
        message = self.message
        message.start_step("scripted:test")
        for chunk in chunks:
            if isinstance(chunk, base.TextStart):
                message.open_block(chunk.id, "text")
            elif isinstance(chunk, base.ReasoningStart):
                message.open_block(chunk.id, "reasoning")
            elif isinstance(chunk, base.TextDelta | base.ReasoningDelta):
                message.append(chunk.id, chunk.delta)
            elif isinstance(chunk, base.TextEnd):
                message.close_block(chunk.id)
            elif isinstance(chunk, base.ReasoningEnd):
                message.close_block(chunk.id, chunk)
            elif isinstance(chunk, base.ToolInputStart):
                message.start_tool_call(chunk.tool_call_id, chunk.tool_name, chunk.provider_executed)
            elif isinstance(chunk, base.ToolCall):
                message.complete_tool_call(chunk)
            elif isinstance(chunk, base.ToolResult):
                message.set_provider_result(chunk)
            elif isinstance(chunk, base.Source):
                message.add_source(chunk)
            elif isinstance(chunk, base.File):
                message.add_file(chunk)
        message.close_all()
        for call_id, output in (outputs or {}).items():
            message.set_output(call_id, output)
        return self

    def build(self) -> message_pb2.Message:
        result = self.message.finalize()
        assert result is not None
        return result


# --- wire builders ---------------------------------------------------------------


def a_blocks(turn: dict[str, Any]) -> list[dict[str, Any]]:
    """A Messages API turn's content blocks: a string ``content`` is its one text block."""
    content = turn["content"]
    return [{"type": "text", "text": content}] if isinstance(content, str) else content


def anthropic_sse(*events: dict[str, Any]) -> bytes:
    """Anthropic ``event:`` + ``data:`` pairs."""
    return b"".join(b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps(e)) for e in events)


def a_start(message_id: str = "msg_1", model: str = "claude-test", input_tokens: int = 10) -> dict[str, Any]:
    usage = {
        "input_tokens": input_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    message: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage,
    }
    return {"type": "message_start", "message": message}


def a_block(index: int, block: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def a_delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def a_text(index: int, value: str) -> dict[str, Any]:
    return a_delta(index, {"type": "text_delta", "text": value})


def a_json(index: int, fragment: str) -> dict[str, Any]:
    return a_delta(index, {"type": "input_json_delta", "partial_json": fragment})


def a_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def a_end(stop_reason: str = "end_turn", output_tokens: int = 5) -> list[dict[str, Any]]:
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def a_text_stream(value: str = "Hello there.") -> bytes:
    """A whole text-only Anthropic stream."""
    return anthropic_sse(
        a_start(), a_block(0, {"type": "text", "text": ""}), a_text(0, value), a_stop(0), *a_end()
    )


def chat_sse(*chunks: dict[str, Any], done: bool = True) -> bytes:
    """OpenAI ``data:`` chunk lines, then ``[DONE]``."""
    body = b"".join(b"data: %s\n\n" % orjson.dumps(c) for c in chunks)
    return body + (b"data: [DONE]\n\n" if done else b"")


def c_chunk(
    delta: dict[str, Any] | None = None,
    finish: str | None = None,
    *,
    usage: dict[str, Any] | None = None,
    chunk_id: str | None = "chatcmpl-1",
    empty: bool = False,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` (``empty``: ``choices: []``, for the usage chunk)."""
    chunk: dict[str, Any] = {"object": "chat.completion.chunk", "created": 1, "model": "gpt-test"}
    if chunk_id is not None:
        chunk["id"] = chunk_id
    chunk["choices"] = [] if empty else [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
    if usage is not None:
        chunk["usage"] = usage
    return chunk


def c_call(
    index: int, call_id: str | None = None, name: str | None = None, arguments: str = ""
) -> dict[str, Any]:
    """One ``delta.tool_calls`` entry."""
    entry: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        entry["id"] = call_id
        entry["type"] = "function"
    if name is not None:
        entry["function"]["name"] = name
    return entry


def responses_sse(*events: dict[str, Any]) -> bytes:
    """Responses ``event:`` + ``data:`` pairs, numbered."""
    out = []
    for number, event in enumerate(events):
        numbered = {**event, "sequence_number": number}
        out.append(b"event: %s\ndata: %s\n\n" % (event["type"].encode(), orjson.dumps(numbered)))
    return b"".join(out)


def r_response(status: str = "in_progress", **fields: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "model": "gpt-5.1-test",
        "status": status,
        "output": [],
        **fields,
    }


def c_usage_stream(prompt: int, cached: int, output: int, text: str = "Hi.") -> bytes:
    """A whole Chat Completions stream of ``text`` whose last chunk reports usage: ``prompt``
    input tokens of which ``cached`` read from the cache, ``output`` output tokens."""
    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    return chat_sse(c_chunk({"content": text}), c_chunk({}, "stop"), c_chunk(usage=usage, empty=True))


def c_text_stream(value: str = "ok") -> bytes:
    """A whole text-only Chat Completions stream."""
    return chat_sse(c_chunk({"role": "assistant", "content": value}), c_chunk({}, "stop"))


def r_text_stream(value: str = "ok") -> bytes:
    """A whole text-only Responses stream (one message item)."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    where = {"item_id": "msg_1", "output_index": 0, "content_index": 0}
    return responses_sse(
        {"type": "response.created", "response": r_response()},
        {"type": "response.output_item.added", "output_index": 0, "item": message},
        {"type": "response.output_text.delta", **where, "delta": value},
        {"type": "response.output_text.done", **where, "text": value},
        {"type": "response.output_item.done", "output_index": 0, "item": {**message, "status": "completed"}},
        {"type": "response.completed", "response": r_response("completed")},
    )


TEXT_STREAMS = {
    "anthropic_provider": a_text_stream,
    "chat_provider": c_text_stream,
    "responses_provider": r_text_stream,
}
"""A text-only stream for each adapter fixture, by fixture name."""


def escaped(body: bytes, escapes: dict[str, str]) -> bytes:
    """``body`` with each marker (a key of ``escapes``) replaced by its raw JSON text, e.g.
    ``{"HIGH": "\\\\ud83d"}``: what a server writes that orjson cannot produce (lone surrogates)."""
    for marker, raw in escapes.items():
        body = body.replace(marker.encode(), raw.encode())
    return body
