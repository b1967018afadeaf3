"""A turn's events as the AI SDK's UI message stream chunks (docs/api/ai-sdk.md#chunks).

The chunk shapes are the ``ai`` npm package's ``UIMessageChunk`` union
(``packages/ai/src/ui-message-stream/ui-message-chunks.ts`` of ``ai`` 6.0.326, the version pinned
in ``package.json``; its ``DefaultChatTransport`` validates every chunk against that schema). The
translation is a pure function of the turn's event log, like the OpenAI door's
(:mod:`turnwire_server.http.openai_response_log`), so a replay (``ResumeTurn`` from the start)
gives the same chunks.

What maps, event → chunk:

- ``TurnStart`` → ``start`` (``messageId``: the stored reply's id, or the assistant message the
  client continues, as the AI SDK's own server does for a continuation);
- ``StepStart`` / ``StepFinish`` → ``start-step`` / ``finish-step``;
- text and reasoning blocks → ``text-*`` / ``reasoning-*`` with the block's id;
- ``ToolInputStart`` / ``ToolInputDelta`` / ``ToolInputAvailable`` / ``ToolInputError`` →
  ``tool-input-start`` / ``-delta`` / ``-available`` (``input`` parsed from ``input_json``) /
  ``tool-input-error``; ``ToolApprovalRequest`` → ``tool-approval-request``;
  ``ToolOutputAvailable`` / ``ToolOutputError`` / ``ToolOutputDenied`` →
  ``tool-output-available`` (``output`` parsed from ``output_json``) / ``tool-output-error`` /
  ``tool-output-denied``. A continuation announces each call an earlier turn asked approval for
  (``ToolInputAvailable`` with its ``approval_id``) before its result: ``tool-input-available``
  with its input, unless the client holds the call (``known_calls``: the message it continues),
  which is not told again. A call the stream has not shown otherwise is first announced with
  ``tool-input-available`` and ``input: null``, since the AI SDK refuses an output for a call it
  does not hold;
- ``SourcePart`` → ``source-url`` or ``source-document``; ``FilePart`` → ``file`` (bytes as a
  ``data:`` URL; a file kept only by the provider's id has no URL and is not sent);
- ``TurnEnd`` → open blocks closed, then ``message-metadata`` (the turn's ``metadata``, when a
  middleware set any) and ``finish`` (the last step's finish reason) for a completed or skipped
  turn; ``abort`` for a cancelled one; ``error`` (the turn's error message) for a failed or
  interrupted one.

``AttemptStart`` (a provider fallback's restart, a recovery) closes what the earlier attempt left
open, its text and reasoning blocks, a call whose input was still streaming (as a
``tool-input-error``) and its step, so no part of the page's message stays streaming; the AI SDK
has no chunk to take back what it showed, so the new attempt's chunks go on after the earlier
attempt's.

Not sent: ``Progress`` keepalives (no sequence number; the SSE response pings on its own) and
``ContextCompacted``. Turnwire streams no ``data-*`` parts.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable
from typing import Any

import orjson
from google.protobuf import json_format

from turnwire_client.v1 import event_pb2, message_pb2

Chunk = dict[str, Any]
"""One UI message chunk as its JSON object (``{"type": "text-delta", "id": …, "delta": …}``)."""

_FINISH_REASONS = {
    event_pb2.FINISH_REASON_STOP: "stop",
    event_pb2.FINISH_REASON_LENGTH: "length",
    event_pb2.FINISH_REASON_TOOL_CALLS: "tool-calls",
    event_pb2.FINISH_REASON_CONTENT_FILTER: "content-filter",
    event_pb2.FINISH_REASON_ERROR: "error",
    event_pb2.FINISH_REASON_OTHER: "other",
}
"""Turnwire's finish reasons to the AI SDK's ``FinishReason``."""


def json_value(text: str) -> Any:
    """The value of JSON ``text`` (a tool's input or output); text that is not JSON is kept as a
    string, empty text is None."""
    if not text:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _provider(flag: bool) -> dict[str, Any]:
    return {"providerExecuted": True} if flag else {}


class UIMessageStream:
    """The UI message stream chunks of one turn, built from its events (see the module docstring).

    ``message_id``: the ``messageId`` the ``start`` chunk carries instead of the turn's own reply
    id (the assistant message a client continues after answering tool calls); ``known_calls``: the
    tool call ids the client already holds (that message's calls)."""

    def __init__(self, *, message_id: str | None = None, known_calls: Iterable[str] = ()) -> None:
        self._message_id = message_id
        self._calls = set(known_calls)
        self._streaming: dict[str, str] = {}  # call id → tool name, while its input streams
        self._open: dict[str, str] = {}  # open text/reasoning block key → its chunk type prefix
        self._started = False
        self._in_step = False
        self._finish_reason: str | None = None
        self.ended = False

    def feed(self, event: event_pb2.TurnEvent) -> list[Chunk]:
        """The chunks ``event`` makes (none, one or several); events after the ``TurnEnd`` and
        ``Progress`` keepalives (sequence number 0) make none."""
        if self.ended or event.sequence_number == 0:
            return []
        out: list[Chunk] = []
        kind = event.WhichOneof("event")
        if kind == "turn_start":
            self._start(out, self._message_id or event.turn_start.message_id)
        elif kind == "step_start":
            self._in_step = True
            out.append({"type": "start-step"})
        elif kind == "step_finish":
            self._in_step = False
            self._finish_reason = _FINISH_REASONS.get(event.step_finish.finish_reason)
            out.append({"type": "finish-step"})
        elif kind == "attempt_start":
            self._close_blocks(out)
            for call_id, name in self._streaming.items():  # the attempt that streamed it is over
                out.append(
                    {
                        "type": "tool-input-error",
                        "toolCallId": call_id,
                        "toolName": name,
                        "input": None,
                        "errorText": "cut off: the turn started a new attempt before this call's "
                        "input was complete",
                    }
                )
            self._streaming.clear()
            if self._in_step:  # the step starts again (StepStart) on the new attempt
                self._in_step = False
                out.append({"type": "finish-step"})
        elif kind in ("text_start", "reasoning_start"):
            block = getattr(event, kind)
            prefix = kind.removesuffix("_start")
            self._open[f"{prefix}:{block.id}"] = prefix
            out.append({"type": f"{prefix}-start", "id": block.id})
        elif kind in ("text_delta", "reasoning_delta"):
            block = getattr(event, kind)
            out.append({"type": f"{kind.removesuffix('_delta')}-delta", "id": block.id, "delta": block.delta})
        elif kind in ("text_end", "reasoning_end"):
            block = getattr(event, kind)
            prefix = kind.removesuffix("_end")
            if self._open.pop(f"{prefix}:{block.id}", None) is not None:
                out.append({"type": f"{prefix}-end", "id": block.id})
        elif kind is not None and kind.startswith("tool_"):
            self._tool(kind, getattr(event, kind), out)
        elif kind == "source":
            out.extend(_source(event.source))
        elif kind == "file":
            out.extend(_file(event.file))
        elif kind == "turn_end":
            self._end(event.turn_end, out)
        return out

    def _close_blocks(self, out: list[Chunk]) -> None:
        for key, prefix in self._open.items():
            out.append({"type": f"{prefix}-end", "id": key.partition(":")[2]})
        self._open.clear()

    def _start(self, out: list[Chunk], message_id: str) -> None:
        self._started = True
        out.append({"type": "start", "messageId": message_id} if message_id else {"type": "start"})

    def _announce(self, call_id: str, name: str, out: list[Chunk]) -> None:
        """A ``tool-input-available`` for a call this stream has not shown (module docstring)."""
        if call_id not in self._calls:
            self._calls.add(call_id)
            out.append(
                {"type": "tool-input-available", "toolCallId": call_id, "toolName": name, "input": None}
            )

    def _tool(self, kind: str, value: Any, out: list[Chunk]) -> None:
        call_id = value.tool_call_id
        if kind != "tool_input_delta":
            self._streaming.pop(call_id, None)
        if kind == "tool_input_start":
            self._calls.add(call_id)
            self._streaming[call_id] = value.tool_name
            out.append(
                {
                    "type": "tool-input-start",
                    "toolCallId": call_id,
                    "toolName": value.tool_name,
                    **_provider(value.provider_executed),
                }
            )
        elif kind == "tool_input_delta":
            if call_id in self._calls:
                out.append(
                    {
                        "type": "tool-input-delta",
                        "toolCallId": call_id,
                        "inputTextDelta": value.input_text_delta,
                    }
                )
        elif kind == "tool_input_available":
            if value.approval_id and call_id in self._calls:
                return  # a continuation's announcement of a call the client holds, input and all
            self._calls.add(call_id)
            out.append(
                {
                    "type": "tool-input-available",
                    "toolCallId": call_id,
                    "toolName": value.tool_name,
                    "input": json_value(value.input_json or "{}"),
                    **_provider(value.provider_executed),
                }
            )
        elif kind == "tool_input_error":
            self._calls.add(call_id)
            out.append(
                {
                    "type": "tool-input-error",
                    "toolCallId": call_id,
                    "toolName": value.tool_name,
                    "input": json_value(value.raw_input),
                    "errorText": value.error_text,
                }
            )
        elif kind == "tool_approval_request":
            self._announce(call_id, value.tool_name, out)
            out.append(
                {"type": "tool-approval-request", "approvalId": value.approval_id, "toolCallId": call_id}
            )
        elif kind == "tool_output_available":
            self._announce(call_id, value.tool_name, out)
            chunk: Chunk = {
                "type": "tool-output-available",
                "toolCallId": call_id,
                "output": json_value(value.output_json),
                **_provider(value.provider_executed),
            }
            if value.preliminary:
                chunk["preliminary"] = True
            out.append(chunk)
        elif kind == "tool_output_error":
            self._announce(call_id, value.tool_name, out)
            out.append(
                {
                    "type": "tool-output-error",
                    "toolCallId": call_id,
                    "errorText": value.error_text,
                    **_provider(value.provider_executed),
                }
            )
        elif kind == "tool_output_denied":
            self._announce(call_id, value.tool_name, out)
            out.append({"type": "tool-output-denied", "toolCallId": call_id})

    def _end(self, end: event_pb2.TurnEnd, out: list[Chunk]) -> None:
        self.ended = True
        if not self._started:  # a turn that never started (SKIPPED, input not stored): still opened
            self._start(out, self._message_id or "")
        self._close_blocks(out)
        if end.status in (event_pb2.TURN_STATUS_ERROR, event_pb2.TURN_STATUS_INTERRUPTED):
            out.append({"type": "error", "errorText": end.error.message or "the turn failed"})
            return
        if end.status == event_pb2.TURN_STATUS_ABORTED:
            reason = end.error.message
            out.append({"type": "abort", "reason": reason} if reason else {"type": "abort"})
            return
        if end.HasField("metadata") and end.metadata.fields:
            metadata = json_format.MessageToDict(end.metadata)
            out.append({"type": "message-metadata", "messageMetadata": metadata})
        finish: Chunk = {"type": "finish"}
        if self._finish_reason is not None:
            finish["finishReason"] = self._finish_reason
        out.append(finish)


def _source(source: message_pb2.SourcePart) -> list[Chunk]:
    is_url = source.source_type == message_pb2.SOURCE_TYPE_URL or (
        source.source_type == message_pb2.SOURCE_TYPE_UNSPECIFIED and bool(source.url)
    )
    if is_url:
        chunk: Chunk = {"type": "source-url", "sourceId": source.source_id, "url": source.url}
        if source.title:
            chunk["title"] = source.title
        return [chunk]
    chunk = {
        "type": "source-document",
        "sourceId": source.source_id,
        "mediaType": source.media_type or "application/octet-stream",
        "title": source.title or source.filename or source.source_id,
    }
    if source.filename:
        chunk["filename"] = source.filename
    return [chunk]


def _file(file: message_pb2.FilePart) -> list[Chunk]:
    media_type = file.media_type or "application/octet-stream"
    content = file.WhichOneof("content")
    if content == "url":
        url = file.url
    elif content == "data":
        url = f"data:{media_type};base64,{base64.b64encode(file.data).decode('ascii')}"
    else:
        return []
    return [{"type": "file", "url": url, "mediaType": media_type}]


__all__ = ["Chunk", "UIMessageStream", "json_value"]
