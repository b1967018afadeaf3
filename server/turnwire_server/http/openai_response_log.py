"""A turn's sequenced events, read as an OpenAI Response and its streaming events.

:class:`ResponseLog` is fed a turn's ``TurnEvent`` s in order (from ``Chat``, ``ResumeTurn``,
``WatchSubmission`` …) and answers the OpenAI Responses streaming events each one makes
(``response.created``, ``response.output_item.added``, ``response.output_text.delta`` …,
``response.completed``), and the Response object as it stands (docs/api/openai.md#events).

The translation is a pure function of the turn's event log: the same log always gives the same
OpenAI events with the same ``sequence_number`` s (0, 1, 2 … without gaps, as OpenAI numbers
them). So an OpenAI sequence number is a cursor into the turn's log: resuming after ``N``
(``starting_after``) replays the log from its start through a new log and sends what comes after
``N``. Events without a sequence number (``Progress`` keepalives) make nothing.

What maps (one turn = one response, its request id = the response id):

- text blocks → ``message`` items with one ``output_text`` part;
- reasoning blocks → ``reasoning`` items with one ``reasoning_text`` part;
- a call the sidecar ran (its own tools, tool hosts, MCP: its result came in the turn) →
  an ``mcp_call`` item (``server_label`` ``turnwire``) with its ``arguments`` and ``output`` or
  ``error``: OpenAI's item for a tool the server ran, which clients show and do not run, so a
  caller sees the whole tool loop. A call an earlier response asked approval for, run (or
  denied) in this one, comes announced with its input and approval id (``ToolInputAvailable``'s
  ``approval_id``): its ``mcp_call`` carries them as ``arguments`` and ``approval_request_id``, as
  OpenAI's does; cut off before its result (a cancelled turn), it is an ``incomplete`` one. A
  client tool's call, which ends the turn waiting for its ``function_call_output``, → a
  ``function_call`` item. A call of the sidecar's own tools that
  waits for the user's approval (``ToolApprovalRequest``, docs/semantics.md §6) → OpenAI's
  ``mcp_approval_request`` item (``id`` the approval's id, which an ``mcp_approval_response`` input
  item names as its ``approval_request_id``), sent when its approval is asked. Which one a call is
  shows only when its result comes, its approval is asked or the turn ends, so a call's item is
  sent then (see :class:`_HeldCall`);
- ``TurnEnd`` → ``response.completed`` (``incomplete`` when the last step hit the output limit),
  ``response.failed`` (a failed or interrupted turn), or ``response.incomplete`` with status
  ``cancelled`` (a cancelled turn), with the turn's usage.

Sources, files and recovery attempts have no Responses event; they are not sent (the
turn's stored message keeps them: read it over gRPC or Connect). A new attempt
(``AttemptStart``: a provider fallback restarting a step, a recovery) closes the items the earlier
one left open, as ``incomplete`` (as a cancelled turn's), so no item stays ``in_progress``; the
new attempt's items follow them (what was streamed cannot be taken back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.http.openai_errors import turn_error

_STATUS = {
    event_pb2.TURN_STATUS_COMPLETED: "completed",
    event_pb2.TURN_STATUS_ERROR: "failed",
    event_pb2.TURN_STATUS_ABORTED: "cancelled",
    event_pb2.TURN_STATUS_INTERRUPTED: "failed",
    event_pb2.TURN_STATUS_SKIPPED: "completed",
}

_TERMINAL_EVENT = {
    "completed": "response.completed",
    "incomplete": "response.incomplete",
    "failed": "response.failed",
    "cancelled": "response.incomplete",
}


SERVER_LABEL = "turnwire"
"""The ``server_label`` of the ``mcp_call`` items of the calls the sidecar runs."""


@dataclass
class _HeldCall:
    """A tool call not shown yet: whether it is one the sidecar runs (its result comes: an
    ``mcp_call`` item) or a client tool's (the turn ends without one: a ``function_call`` item) is
    known only then, and the events must be a pure function of the log (sequence numbers are
    resume cursors), so both come out the same on every read."""

    name: str
    arguments: str = ""
    complete: bool = False
    approval_id: str = ""
    """Set for a call an earlier response asked approval for (the ``mcp_approval_request``'s id)."""


def usage_of(usage: Any) -> dict[str, Any]:
    """OpenAI's ``ResponseUsage`` of a ``turnwire.v1.Usage`` (tokens)."""
    return {
        "input_tokens": usage.input_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_input_tokens,
            "cache_write_tokens": usage.cache_write_input_tokens,
        },
        "output_tokens": usage.output_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens or usage.input_tokens + usage.output_tokens,
    }


class ResponseLog:
    """One response, built from its turn's events (see the module docstring).

    ``response_id`` is the turn's request id; ``echo`` holds the request fields a Response repeats
    (``instructions``, ``tools``, ``metadata``, ``previous_response_id`` …); ``status`` is the
    status before the turn starts (``queued`` for a background response); ``created_at`` and
    ``completed_at`` (Unix seconds) replace the times of the read when given (a stored turn's);
    ``usage_known`` false leaves ``usage`` None at the end (a stored turn's TurnEnd carries none)."""

    def __init__(
        self,
        response_id: str,
        *,
        echo: dict[str, Any] | None = None,
        status: str = "in_progress",
        created_at: int | None = None,
        completed_at: int | None = None,
        usage_known: bool = True,
    ):
        self.response: dict[str, Any] = {
            "id": response_id,
            "object": "response",
            "created_at": int(time.time()) if created_at is None else created_at,
            "status": status,
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": None,
            "metadata": {},
            "model": "",
            "output": [],
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "tool_choice": "auto",
            "tools": [],
            "usage": None,
            "conversation": None,
        }
        if echo:
            self.response.update(echo)
        self.next_sequence_number = 0
        self.ended = False
        self._open: dict[str, int] = {}  # text/reasoning block id → output index
        self._held: dict[str, _HeldCall] = {}  # tool call id → a call whose kind is not known yet
        self._finish_length = False
        self._completed_at = completed_at
        self._usage_known = usage_known

    # -- output items -------------------------------------------------------------------------

    def _event(self, type_: str, out: list[dict[str, Any]], **fields: Any) -> None:
        out.append({"type": type_, "sequence_number": self.next_sequence_number, **fields})
        self.next_sequence_number += 1

    def _add_item(self, key: str | None, item: dict[str, Any], out: list[dict[str, Any]]) -> int:
        index = len(self.response["output"])
        self.response["output"].append(item)
        if key is not None:
            self._open[key] = index
        self._event("response.output_item.added", out, output_index=index, item=_copy(item))
        return index

    def _item_id(self, prefix: str) -> str:
        return f"{prefix}_{self.response['id']}_{len(self.response['output'])}"

    def _done_item(self, index: int, out: list[dict[str, Any]], status: str = "completed") -> None:
        item = self.response["output"][index]
        item["status"] = status
        if item["type"] in ("message", "reasoning"):
            part = item["content"][0]
            text_event = (
                "response.output_text.done" if item["type"] == "message" else "response.reasoning_text.done"
            )
            extra: dict[str, Any] = {"logprobs": []} if item["type"] == "message" else {}
            self._event(
                text_event,
                out,
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=part["text"],
                **extra,
            )
            self._event(
                "response.content_part.done",
                out,
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            )
        self._event("response.output_item.done", out, output_index=index, item=_copy(item))

    def _block_start(self, key: str, kind: str, out: list[dict[str, Any]]) -> None:
        item: dict[str, Any]
        part: dict[str, Any]
        if kind == "message":
            item = {
                "id": self._item_id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
            }
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        else:
            item = {"id": self._item_id("rs"), "type": "reasoning", "summary": [], "status": "in_progress"}
            part = {"type": "reasoning_text", "text": ""}
        item["content"] = [part]
        shown = {**item, "content": []}
        index = len(self.response["output"])
        self.response["output"].append(item)
        self._open[key] = index
        self._event("response.output_item.added", out, output_index=index, item=shown)
        self._event(
            "response.content_part.added",
            out,
            item_id=item["id"],
            output_index=index,
            content_index=0,
            part=dict(part),
        )

    def _block_delta(self, key: str, delta: str, out: list[dict[str, Any]]) -> None:
        index = self._open.get(key)
        if index is None:
            return
        item = self.response["output"][index]
        item["content"][0]["text"] += delta
        if item["type"] == "message":
            self._event(
                "response.output_text.delta",
                out,
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=delta,
                logprobs=[],
            )
        else:
            self._event(
                "response.reasoning_text.delta",
                out,
                item_id=item["id"],
                output_index=index,
                content_index=0,
                delta=delta,
            )

    def _block_end(self, key: str, out: list[dict[str, Any]]) -> None:
        index = self._open.pop(key, None)
        if index is not None:
            self._done_item(index, out)

    def _hold(self, call_id: str, name: str) -> _HeldCall:
        """The held call ``call_id`` (see :class:`_HeldCall`), made when it is new."""
        held = self._held.get(call_id)
        if held is None:
            held = self._held[call_id] = _HeldCall(name)
        return held

    def _open_server_call(
        self, held: _HeldCall, name: str, out: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], int]:
        """The ``mcp_call`` item of ``held`` (a call of tool ``name``) added, ``in_progress``, and
        its output index."""
        item: dict[str, Any] = {
            "id": self._item_id("mcp"),
            "type": "mcp_call",
            "server_label": SERVER_LABEL,
            "name": held.name or name,
            "arguments": held.arguments or "{}",
            "approval_request_id": held.approval_id or None,
            "output": None,
            "error": None,
            "status": "in_progress",
        }
        return item, self._add_item(None, item, out)

    def _server_call(
        self, call_id: str, name: str, out: list[dict[str, Any]], *, output: str | None, error: str | None
    ) -> None:
        """A call the sidecar ran (its result came): OpenAI's ``mcp_call`` item, a tool the server
        ran, with its arguments and its ``output`` or ``error``, opened and done at once."""
        held = self._held.pop(call_id, None) or _HeldCall(name)
        item, index = self._open_server_call(held, name, out)
        self._event("response.mcp_call.in_progress", out, item_id=item["id"], output_index=index)
        self._event(
            "response.mcp_call_arguments.done",
            out,
            item_id=item["id"],
            output_index=index,
            arguments=item["arguments"],
        )
        if error is None:
            item["output"], item["status"] = output, "completed"
            self._event("response.mcp_call.completed", out, item_id=item["id"], output_index=index)
        else:
            item["error"] = {"type": "mcp_tool_execution_error", "content": [{"type": "text", "text": error}]}
            item["status"] = "failed"
            self._event("response.mcp_call.failed", out, item_id=item["id"], output_index=index)
        self._event("response.output_item.done", out, output_index=index, item=_copy(item))

    def _approval_request(self, call_id: str, name: str, approval_id: str, out: list[dict[str, Any]]) -> None:
        """A call waiting for the user's approval: OpenAI's ``mcp_approval_request`` item (no
        ``status``: OpenAI's has none), opened and done at once; its ``id`` is the approval's id,
        which the caller's ``mcp_approval_response`` names (docs/api/openai.md#tool-approvals)."""
        held = self._held.pop(call_id, None) or _HeldCall(name)
        item: dict[str, Any] = {
            "id": approval_id,
            "type": "mcp_approval_request",
            "server_label": SERVER_LABEL,
            "name": held.name or name,
            "arguments": held.arguments or "{}",
        }
        index = self._add_item(None, item, out)
        self._event("response.output_item.done", out, output_index=index, item=_copy(item))

    def _release_held(self, out: list[dict[str, Any]], *, ended_well: bool) -> None:
        """The held calls no result came for, as ``function_call`` items in the order they began:
        a client tool's call the caller answers with ``function_call_output`` (``completed``), or,
        when the turn did not end well (cancelled, failed) or a new attempt replaced its step, a
        call cut off (``incomplete``); a call approved earlier (the sidecar's) cut off before its
        result, as an ``incomplete`` ``mcp_call``."""
        for call_id, held in self._held.items():
            if held.approval_id:  # the sidecar's call, approved earlier, cut off before its result
                server_call, index = self._open_server_call(held, held.name, out)
                server_call["status"] = "incomplete"
                self._event("response.output_item.done", out, output_index=index, item=_copy(server_call))
                continue
            item = {
                "id": self._item_id("fc"),
                "type": "function_call",
                "call_id": call_id,
                "name": held.name,
                "arguments": "",
                "status": "in_progress",
            }
            index = self._add_item(None, item, out)
            if held.arguments:
                self._event(
                    "response.function_call_arguments.delta",
                    out,
                    item_id=item["id"],
                    output_index=index,
                    delta=held.arguments,
                )
            item["arguments"] = held.arguments
            self._event(
                "response.function_call_arguments.done",
                out,
                item_id=item["id"],
                output_index=index,
                name=held.name,
                arguments=held.arguments,
            )
            status = "completed" if ended_well and held.complete else "incomplete"
            self._done_item(index, out, status=status)
        self._held.clear()

    # -- the turn's events ----------------------------------------------------------------------

    def feed(self, event: event_pb2.TurnEvent) -> list[dict[str, Any]]:
        """The OpenAI streaming events ``event`` makes (often one, sometimes none or several),
        each with its ``sequence_number``; the Response (:attr:`response`) is updated."""
        out: list[dict[str, Any]] = []
        if self.ended or event.sequence_number == 0:
            return out
        kind = event.WhichOneof("event")
        if kind == "turn_start":
            self.response["status"] = "in_progress"
            self.response["model"] = self.response["model"] or event.turn_start.model
            self.response["conversation"] = {"id": event.conversation_id}
            self._event("response.created", out, response=self.snapshot())
            self._event("response.in_progress", out, response=self.snapshot())
        elif kind == "step_start" and event.step_start.model:
            # The model that answers is the one each step ran on (a fallback's included): the
            # Response names the last one's, as OpenAI names the model that answered.
            self.response["model"] = event.step_start.model
        elif kind == "text_start":
            self._block_start(f"t:{event.text_start.id}", "message", out)
        elif kind == "text_delta":
            self._block_delta(f"t:{event.text_delta.id}", event.text_delta.delta, out)
        elif kind == "text_end":
            self._block_end(f"t:{event.text_end.id}", out)
        elif kind == "reasoning_start":
            self._block_start(f"r:{event.reasoning_start.id}", "reasoning", out)
        elif kind == "reasoning_delta":
            self._block_delta(f"r:{event.reasoning_delta.id}", event.reasoning_delta.delta, out)
        elif kind == "reasoning_end":
            self._block_end(f"r:{event.reasoning_end.id}", out)
        elif kind == "tool_input_start":
            self._hold(event.tool_input_start.tool_call_id, event.tool_input_start.tool_name)
        elif kind == "tool_input_delta":
            if (held := self._held.get(event.tool_input_delta.tool_call_id)) is not None:
                held.arguments += event.tool_input_delta.input_text_delta
        elif kind == "tool_input_available":
            available = event.tool_input_available
            held = self._hold(available.tool_call_id, available.tool_name)
            held.arguments, held.complete = available.input_json or "{}", True
            held.approval_id = available.approval_id
        elif kind == "tool_input_error":
            failed = event.tool_input_error
            self._hold(failed.tool_call_id, failed.tool_name).arguments = failed.raw_input
            self._server_call(
                failed.tool_call_id, failed.tool_name, out, output=None, error=failed.error_text
            )
        elif kind == "tool_output_available" and not event.tool_output_available.preliminary:
            result = event.tool_output_available
            self._server_call(
                result.tool_call_id, result.tool_name, out, output=result.output_json, error=None
            )
        elif kind == "tool_output_error":
            failed_call = event.tool_output_error
            self._server_call(
                failed_call.tool_call_id,
                failed_call.tool_name,
                out,
                output=None,
                error=failed_call.error_text,
            )
        elif kind == "tool_output_denied":
            denied = event.tool_output_denied
            self._server_call(
                denied.tool_call_id, denied.tool_name, out, output=None, error=denied.reason or "denied"
            )
        elif kind == "tool_approval_request":
            asked = event.tool_approval_request
            self._approval_request(asked.tool_call_id, asked.tool_name, asked.approval_id, out)
        elif kind == "attempt_start":
            self._close_open(out)
            self._release_held(out, ended_well=False)
        elif kind == "step_finish":
            self._finish_length = event.step_finish.finish_reason == event_pb2.FINISH_REASON_LENGTH
        elif kind == "turn_end":
            self.response["conversation"] = {"id": event.conversation_id}
            self._end(event.turn_end, out)
        return out

    def _end(self, end: event_pb2.TurnEnd, out: list[dict[str, Any]]) -> None:
        if self.next_sequence_number == 0:  # a turn that never started (SKIPPED): still opened first
            self._event("response.created", out, response=self.snapshot())
        status = _STATUS.get(end.status, "failed")
        self._close_open(out)
        self._release_held(out, ended_well=status == "completed")
        if status == "completed" and self._finish_length:
            status = "incomplete"
            self.response["incomplete_details"] = {"reason": "max_output_tokens"}
        if end.HasField("error") and status == "failed":
            self.response["error"] = turn_error(end.error)
        elif end.HasField("error") and end.status == event_pb2.TURN_STATUS_SKIPPED:
            status = "failed"
            self.response["error"] = turn_error(end.error)
        self.response["status"] = status
        self.response["usage"] = usage_of(end.usage) if self._usage_known else None
        self.response["completed_at"] = int(time.time()) if self._completed_at is None else self._completed_at
        self.ended = True
        self._event(_TERMINAL_EVENT[status], out, response=self.snapshot())

    def _close_open(self, out: list[dict[str, Any]]) -> None:
        """Close every item still open, as ``incomplete``, in output order."""
        for index in sorted(self._open.values()):
            self._done_item(index, out, status="incomplete")
        self._open.clear()

    def snapshot(self) -> dict[str, Any]:
        """A copy of the Response as it stands (items copied, so later events do not change it)."""
        return {**self.response, "output": [_copy(item) for item in self.response["output"]]}


def stored_log(turn: chat_service_pb2.Turn, reply: message_pb2.Message | None = None) -> ResponseLog:
    """An empty :class:`ResponseLog` for ``turn`` (``ListTurns``), a turn whose events are gone
    (past ``durability.event_retention_seconds``) but whose record and reply ``reply`` are stored,
    to feed :func:`stored_events` into: its model (the one the reply's last step ran on, as its
    ``step_start`` part records it, else the one the turn was asked to use), the turn's start
    and end times as ``created_at`` and ``completed_at``, and ``usage`` None."""
    ran = [p.step_start.model for p in reply.parts if p.step_start.model] if reply is not None else []
    return ResponseLog(
        turn.request_id,
        echo={"model": ran[-1] if ran else turn.model},
        created_at=turn.start_time.seconds if turn.HasField("start_time") else None,
        completed_at=turn.end_time.seconds if turn.HasField("end_time") else None,
        usage_known=False,
    )


def stored_events(
    turn: chat_service_pb2.Turn, reply: message_pb2.Message | None
) -> list[event_pb2.TurnEvent]:
    """The turn events a replay of stored turn ``turn`` would be, made from its record and its
    assistant message ``reply`` (None when it has none), numbered from 1: what the stored reply
    keeps maps as the events did (text, reasoning, the calls and results of the sidecar's own
    tools; a client tool's call without the result the client sent later, as when it ended the
    response; a call whose approval was asked, as its approval request, as when it ended the
    response, whatever was answered since). The TurnEnd carries no usage (a turn record keeps its
    cost, not its tokens: the Response's ``usage`` is None) and no finish reason (an
    ``incomplete`` for ``max_output_tokens`` reads as ``completed``). Not the numbering of the
    turn's own events."""
    events: list[event_pb2.TurnEvent] = []

    def add(**kind: Any) -> None:
        events.append(
            event_pb2.TurnEvent(
                conversation_id=turn.conversation_id,
                request_id=turn.request_id,
                sequence_number=len(events) + 1,
                **kind,
            )
        )

    add(turn_start=event_pb2.TurnStart(message_id=turn.assistant_message_id, model=turn.model))
    for number, part in enumerate(reply.parts if reply is not None else ()):
        block = f"stored-{number}"
        kind = part.WhichOneof("kind")
        if kind == "text":
            add(text_start=event_pb2.TextStart(id=block))
            add(text_delta=event_pb2.TextDelta(id=block, delta=part.text.text))
            add(text_end=event_pb2.TextEnd(id=block))
        elif kind == "reasoning" and not part.reasoning.redacted:
            add(reasoning_start=event_pb2.ReasoningStart(id=block))
            add(reasoning_delta=event_pb2.ReasoningDelta(id=block, delta=part.reasoning.text))
            add(reasoning_end=event_pb2.ReasoningEnd(id=block))
        elif kind == "tool_call":
            call = part.tool_call
            call_id, name = call.tool_call_id, call.tool_name
            add(
                tool_input_available=event_pb2.ToolInputAvailable(
                    tool_call_id=call_id, tool_name=name, input_json=call.input_json or "{}"
                )
            )
            if call.client_executed:
                continue  # the response ended at the call; the client sent its result
            if call.approval.id:  # the response ended asking its approval; the answer came later
                add(
                    tool_approval_request=event_pb2.ToolApprovalRequest(
                        tool_call_id=call_id, tool_name=name, approval_id=call.approval.id
                    )
                )
                continue
            if call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
                add(
                    tool_output_available=event_pb2.ToolOutputAvailable(
                        tool_call_id=call_id, tool_name=name, output_json=call.output_json
                    )
                )
            elif call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
                add(
                    tool_output_error=event_pb2.ToolOutputError(
                        tool_call_id=call_id, tool_name=name, error_text=call.error_text
                    )
                )
            elif call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
                add(
                    tool_output_denied=event_pb2.ToolOutputDenied(
                        tool_call_id=call_id, tool_name=name, reason=call.approval.reason
                    )
                )
    end = event_pb2.TurnEnd(status=turn.status)
    if turn.HasField("error"):
        end.error.CopyFrom(turn.error)
    if reply is not None:
        end.message.CopyFrom(reply)
    add(turn_end=end)
    return events


def _copy(item: dict[str, Any]) -> dict[str, Any]:
    copied = dict(item)
    if "content" in copied:
        copied["content"] = [dict(part) for part in copied["content"]]
    return copied


__all__ = ["ResponseLog", "stored_events", "stored_log", "usage_of"]
