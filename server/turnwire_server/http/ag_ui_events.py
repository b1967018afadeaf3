"""A turn's sequenced event log read as AG-UI events (docs/api/ag-ui.md#events).

:class:`RunLog` turns each ``turnwire.v1.TurnEvent`` of one turn into the AG-UI events it makes:
plain dictionaries in the shapes of ``@ag-ui/core`` 1.0.0 (``EventSchemas``, the package pinned
in package.json; https://docs.ag-ui.com/concepts/events), ready for the SSE encoding
(``data: <json>``). One turn is one AG-UI run: its request id is the ``runId``, its conversation
the ``threadId``.

The translation is a pure function of the log (the same log always gives the same events and the
same ids), so a run re-read from its start (``ResumeTurn``) is the run sent the first time.
Events without a sequence number (``Progress`` keepalives) make nothing.

What maps:

- ``TurnStart`` → ``RUN_STARTED``; ``StepStart`` / ``StepFinish`` → ``STEP_STARTED`` /
  ``STEP_FINISHED`` (``stepName`` ``step-<n>``, n 0-based);
- text blocks → ``TEXT_MESSAGE_START`` / ``_CONTENT`` / ``_END`` (role ``assistant``);
- reasoning blocks → ``REASONING_START``, ``REASONING_MESSAGE_START`` / ``_CONTENT`` / ``_END``,
  ``REASONING_END`` (AG-UI 1.0 has no ``THINKING_*`` events);
- tool calls → ``TOOL_CALL_START`` / ``_ARGS`` / ``_END``; a result the sidecar has (a server
  tool's output, error or denial, a call whose input did not parse) → ``TOOL_CALL_RESULT``
  with a message id starting ``tw-`` (so the door knows it, docs/api/ag-ui.md#client-tools);
- ``TurnEnd`` → ``RUN_FINISHED`` (``COMPLETED``, ``SKIPPED``; outcome ``success`` with the
  ``pendingToolCallIds`` of client tool calls left to answer, and ``usage``), ``RUN_FINISHED``
  with outcome ``cancelled`` (``ABORTED``), or ``RUN_ERROR`` (``ERROR``, ``INTERRUPTED``, a
  ``SKIPPED`` turn with an error, an ``ABORTED`` one whose input was not stored), its ``code``
  the Turnwire error reason in lower case (``provider_error``, ``input_not_stored`` …).

Message ids are ``<reply id>.<n>`` (the turn's stored reply ``tw-a-<runId>``, n counting the
run's text and reasoning blocks), tool call ids are Turnwire's own. Sources, files, tool
approvals and compaction have no AG-UI event and are not sent. An ``AttemptStart`` (a provider
fallback's restart, a recovery) has none either: it ends what the earlier attempt left open (its
messages, its tool calls, which are then not pending, and its step), as AG-UI's clients require
before a run finishes; AG-UI cannot take back what was shown, so the new attempt's messages follow.
"""

from __future__ import annotations

from typing import Any, Final

from turnwire_client.v1 import event_pb2, message_pb2
from turnwire_server.engine.ids import assistant_message_id
from turnwire_server.http.openai_errors import turn_error

_ERRORED = frozenset({event_pb2.TURN_STATUS_ERROR, event_pb2.TURN_STATUS_INTERRUPTED})


_TOKEN_FIELDS: Final = (
    ("inputTokens", "input_tokens"),
    ("outputTokens", "output_tokens"),
    ("totalTokens", "total_tokens"),
    ("reasoningTokens", "reasoning_tokens"),
    ("cachedInputTokens", "cached_input_tokens"),
    ("cacheWriteInputTokens", "cache_write_input_tokens"),
)


def usage_of(usage: message_pb2.Usage, model: str) -> dict[str, Any]:
    """AG-UI's ``TokenUsage`` (``RUN_FINISHED.usage[i]``) of a ``turnwire.v1.Usage`` (tokens) for
    ``model`` (``provider:model``; ``provider`` is the part before the colon)."""
    provider, _, _ = model.partition(":")
    shown: dict[str, Any] = {"provider": provider, "model": model}
    shown.update((name, getattr(usage, field)) for name, field in _TOKEN_FIELDS)
    shown["totalTokens"] = _total(usage)
    return shown


def usages_of(
    turn: message_pb2.Usage, steps: dict[str, message_pb2.Usage], model: str
) -> list[dict[str, Any]]:
    """``RUN_FINISHED.usage``: one ``TokenUsage`` per model the turn's steps ran on (``steps``:
    model id → its steps' usage summed, in the order they first ran) when a provider fallback
    moved a step to another model (docs/providers.md, "Fallback across providers"), else the
    turn's usage ``turn`` for ``model``. What the turn counted beyond its steps (a compaction's
    summary) goes to ``model``, the model it ran on last, so the entries add up to the turn's."""
    if len(steps) < 2:
        return [usage_of(turn, model)]
    shown = {name: usage_of(usage, name) for name, usage in steps.items()}
    last = shown.setdefault(model, usage_of(message_pb2.Usage(), model))
    whole = usage_of(turn, model)
    for name, _ in _TOKEN_FIELDS:
        last[name] += max(0, whole[name] - sum(entry[name] for entry in shown.values()))
    return list(shown.values())


def add_usage(total: message_pb2.Usage, usage: message_pb2.Usage) -> None:
    """Add ``usage`` to ``total`` in place, field by field (``total_tokens`` as :func:`usage_of`
    reads it: input plus output where the provider gave no total)."""
    for _, field in _TOKEN_FIELDS:
        added = _total(usage) if field == "total_tokens" else getattr(usage, field)
        setattr(total, field, getattr(total, field) + added)


def _total(usage: message_pb2.Usage) -> int:
    return int(usage.total_tokens or usage.input_tokens + usage.output_tokens)


def error_code(status: Any) -> str:
    """The ``RUN_ERROR.code`` of a ``google.rpc.Status``: its ErrorInfo reason in lower case, else
    ``server_error`` (or ``rate_limit_exceeded`` for ``RESOURCE_EXHAUSTED``), as the OpenAI door
    names it (:func:`~turnwire_server.http.openai_errors.turn_error`)."""
    shown = turn_error(status)
    return str(shown["type"] or shown["code"])


class RunLog:
    """One AG-UI run built from its turn's events (see the module docstring). ``thread_id`` and
    ``run_id`` are the conversation and the turn's request id as the client named them."""

    def __init__(self, thread_id: str, run_id: str) -> None:
        self.thread_id = thread_id
        self.run_id = run_id
        self.started = False
        self.ended = False
        self._reply_id = assistant_message_id(run_id)
        self._blocks = 0
        self._open_blocks: dict[str, tuple[str, str]] = {}  # "t:<id>" / "r:<id>" → (kind, message id)
        self._open_calls: set[str] = set()
        self._called: list[str] = []  # tool call ids, in order
        self._answered: set[str] = set()
        self._dropped: set[str] = set()  # calls an earlier attempt began and never finished
        self._step: str | None = None
        self._model = ""  # the model the current step runs on: TurnStart's, then a fallback's
        self._step_usage: dict[str, message_pb2.Usage] = {}  # model → its steps' usage, summed

    # -- pieces -----------------------------------------------------------------------------------

    def _start_run(self, out: list[dict[str, Any]]) -> None:
        if not self.started:
            self.started = True
            out.append({"type": "RUN_STARTED", "threadId": self.thread_id, "runId": self.run_id})

    def _block_start(self, key: str, kind: str, out: list[dict[str, Any]]) -> None:
        message_id = f"{self._reply_id}.{self._blocks}"
        self._blocks += 1
        self._open_blocks[key] = (kind, message_id)
        if kind == "text":
            out.append({"type": "TEXT_MESSAGE_START", "messageId": message_id, "role": "assistant"})
        else:
            out.append({"type": "REASONING_START", "messageId": message_id})
            out.append({"type": "REASONING_MESSAGE_START", "messageId": message_id, "role": "reasoning"})

    def _block_delta(self, key: str, delta: str, out: list[dict[str, Any]]) -> None:
        opened = self._open_blocks.get(key)
        if opened is None or not delta:
            return
        kind, message_id = opened
        type_ = "TEXT_MESSAGE_CONTENT" if kind == "text" else "REASONING_MESSAGE_CONTENT"
        out.append({"type": type_, "messageId": message_id, "delta": delta})

    def _block_end(self, key: str, out: list[dict[str, Any]]) -> None:
        opened = self._open_blocks.pop(key, None)
        if opened is None:
            return
        kind, message_id = opened
        if kind == "text":
            out.append({"type": "TEXT_MESSAGE_END", "messageId": message_id})
        else:
            out.append({"type": "REASONING_MESSAGE_END", "messageId": message_id})
            out.append({"type": "REASONING_END", "messageId": message_id})

    def _call_start(self, call_id: str, name: str, out: list[dict[str, Any]]) -> bool:
        """Opens the call unless it was; True when it opened now. A call an earlier attempt
        dropped opens again when the new attempt makes it (a model that numbers its calls)."""
        if call_id in self._dropped:
            self._dropped.discard(call_id)
            self._called.remove(call_id)
        if call_id in self._open_calls or call_id in self._called:
            return False
        self._open_calls.add(call_id)
        self._called.append(call_id)
        out.append({"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": name})
        return True

    def _call_end(self, call_id: str, name: str, arguments: str, out: list[dict[str, Any]]) -> None:
        if self._call_start(call_id, name, out) and arguments:
            out.append({"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": arguments})
        if call_id in self._open_calls:
            self._open_calls.discard(call_id)
            out.append({"type": "TOOL_CALL_END", "toolCallId": call_id})

    def _call_result(self, call_id: str, name: str, content: str, out: list[dict[str, Any]]) -> None:
        self._call_end(call_id, name, "", out)
        self._answered.add(call_id)
        out.append(
            {
                "type": "TOOL_CALL_RESULT",
                "messageId": f"tw-result-{call_id}",
                "toolCallId": call_id,
                "content": content,
                "role": "tool",
            }
        )

    def _close_open(self, out: list[dict[str, Any]], dropped: set[str] | None = None) -> None:
        """End the open text and reasoning messages and tool calls (added to ``dropped`` when
        given: an earlier attempt's calls, which nobody answers)."""
        for key in list(self._open_blocks):
            self._block_end(key, out)
        for call_id in [c for c in self._called if c in self._open_calls]:
            self._open_calls.discard(call_id)
            out.append({"type": "TOOL_CALL_END", "toolCallId": call_id})
            if dropped is not None:
                dropped.add(call_id)

    def _close_step(self, out: list[dict[str, Any]]) -> None:
        if self._step is not None:
            out.append({"type": "STEP_FINISHED", "stepName": self._step})
            self._step = None

    # -- the turn's events ------------------------------------------------------------------------

    def feed(self, event: event_pb2.TurnEvent) -> list[dict[str, Any]]:
        """The AG-UI events ``event`` makes (often one, sometimes none or several), in order."""
        out: list[dict[str, Any]] = []
        if self.ended or event.sequence_number == 0:
            return out
        kind = event.WhichOneof("event")
        if kind != "turn_end":
            self._start_run(out)
        if kind == "turn_start":
            self._model = event.turn_start.model
        elif kind == "step_start":
            self._close_step(out)
            self._model = event.step_start.model or self._model  # a fallback's when its breaker is open
            self._step = f"step-{event.step_start.step_number}"
            out.append({"type": "STEP_STARTED", "stepName": self._step})
        elif kind == "step_finish":
            self._close_step(out)
            self._model = event.step_finish.model or self._model
            add_usage(self._step_usage.setdefault(self._model, message_pb2.Usage()), event.step_finish.usage)
        elif kind == "attempt_start":
            self._close_open(out, dropped=self._dropped)
            self._close_step(out)
            self._model = event.attempt_start.model or self._model
        elif kind in ("text_start", "reasoning_start"):
            block = getattr(event, kind)
            self._block_start(f"{kind[0]}:{block.id}", kind.partition("_")[0], out)
        elif kind in ("text_delta", "reasoning_delta"):
            block = getattr(event, kind)
            self._block_delta(f"{kind[0]}:{block.id}", block.delta, out)
        elif kind in ("text_end", "reasoning_end"):
            self._block_end(f"{kind[0]}:{getattr(event, kind).id}", out)
        elif kind == "tool_input_start":
            self._call_start(event.tool_input_start.tool_call_id, event.tool_input_start.tool_name, out)
        elif kind == "tool_input_delta":
            delta = event.tool_input_delta
            if delta.tool_call_id in self._open_calls and delta.input_text_delta:
                out.append(
                    {
                        "type": "TOOL_CALL_ARGS",
                        "toolCallId": delta.tool_call_id,
                        "delta": delta.input_text_delta,
                    }
                )
        elif kind == "tool_input_available":
            available = event.tool_input_available
            self._call_end(available.tool_call_id, available.tool_name, available.input_json or "{}", out)
        elif kind == "tool_input_error":
            failed = event.tool_input_error
            self._call_end(failed.tool_call_id, failed.tool_name, failed.raw_input, out)
            self._call_result(failed.tool_call_id, failed.tool_name, failed.error_text, out)
        elif kind == "tool_output_available" and not event.tool_output_available.preliminary:
            result = event.tool_output_available
            self._call_result(result.tool_call_id, result.tool_name, result.output_json, out)
        elif kind == "tool_output_error":
            failed_output = event.tool_output_error
            self._call_result(
                failed_output.tool_call_id, failed_output.tool_name, failed_output.error_text, out
            )
        elif kind == "tool_output_denied":
            denied = event.tool_output_denied
            self._call_result(denied.tool_call_id, denied.tool_name, denied.reason or "denied", out)
        elif kind == "turn_end":
            self._end(event.turn_end, out)
        return out

    def _end(self, end: event_pb2.TurnEnd, out: list[dict[str, Any]]) -> None:
        self._start_run(out)  # a turn that never started (SKIPPED, input not stored) still opens its run
        self._close_open(out)
        self._close_step(out)
        self.ended = True
        usage = usages_of(end.usage, self._step_usage, self._model)
        code = error_code(end.error) if end.HasField("error") else "server_error"
        failed = end.status in _ERRORED or (
            end.HasField("error")
            and (end.status == event_pb2.TURN_STATUS_SKIPPED or code == "input_not_stored")
        )
        if failed:
            message = end.error.message or "the turn failed"
            out.append({"type": "RUN_ERROR", "message": message, "code": code, "usage": usage})
            return
        outcome: dict[str, Any] = {"type": "success"}
        if end.status == event_pb2.TURN_STATUS_ABORTED:
            outcome = {"type": "cancelled"}
        elif pending := [c for c in self._called if c not in self._answered and c not in self._dropped]:
            outcome["pendingToolCallIds"] = pending
        out.append(
            {
                "type": "RUN_FINISHED",
                "threadId": self.thread_id,
                "runId": self.run_id,
                "outcome": outcome,
                "usage": usage,
            }
        )


__all__ = ["RunLog", "add_usage", "error_code", "usage_of", "usages_of"]
