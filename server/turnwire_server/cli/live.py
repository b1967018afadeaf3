"""A turn rendered live as its events arrive (``turnwire chat``, ``continue``, ``approve``).

Text deltas print as they arrive, reasoning dimmed, tool calls as ``→ name {input}`` and results
as ``← name: {output}``; on a terminal a spinner says what the turn waits for (piped output gets
no control codes). One status line ends the turn (:func:`print_status_line`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

from rich.console import Console
from rich.status import Status
from rich.text import Text

from turnwire.errors import ABORTED_TOOL_ERROR
from turnwire.values import tool_call_output_json
from turnwire_client import TurnResult, TurnwireError
from turnwire_client.v1 import event_pb2
from turnwire_server.cli.connection import command_name
from turnwire_server.cli.errors import cli_terms, error_class
from turnwire_server.cli.parts import (
    STATUS_STYLES,
    approval_hint,
    call_line,
    denied_line,
    error_line,
    file_line,
    input_json,
    plural,
    preliminary_line,
    result_line,
    short,
    source_line,
)

__all__ = ["TurnRenderer", "print_status_line"]

_WAITING_FOR: dict[str, str] = {
    "turn_start": "waiting for the model",
    "step_start": "waiting for the model",
    "tool_input_available": "running the tool",
}
"""Events after which nothing shows until the model or a tool answers: a spinner says so."""

_PROGRESS_PHASES: dict[int, str] = {
    event_pb2.PROGRESS_PHASE_QUEUED: "queued behind the conversation's running turn",
    event_pb2.PROGRESS_PHASE_MODEL: "waiting for the model",
    event_pb2.PROGRESS_PHASE_TOOL: "running the tool",
}
"""What the spinner says on a ``Progress`` keepalive, by phase (event.proto ``ProgressPhase``)."""

_SILENT = frozenset({"text_start", "reasoning_start", "tool_input_start", "tool_input_delta", "step_finish"})
"""Events that print nothing, so they leave the spinner up."""

_MODEL_OUTPUT = frozenset({"text_delta", "reasoning_delta", "tool_input_delta", "tool_input_available"})
"""Events that show the model produced output tokens."""

_REPLY_CONTENT = frozenset(
    {
        "text_start",
        "reasoning_start",
        "tool_input_start",
        "tool_input_available",
        "tool_input_error",
        "source",
        "file",
    }
)
"""Events that add a content part to the reply: after one, a cancel stores a partial reply (a reply
without content is not stored, docs/semantics.md §11; reasoning is streamed only when it is kept)."""


class TurnRenderer:
    """Prints one turn's events as they arrive."""

    def __init__(
        self,
        console: Console,
        request_id: str = "",
        *,
        err_console: Console | None = None,
        conversation_id: str = "CONVERSATION",
        target_flag: str = "",
    ) -> None:
        self.console = console
        self.request_id = request_id
        self.conversation_id = conversation_id
        #: `` --target HOST:PORT`` when the sidecar is not the default one: the commands it prints
        #: must reach the same sidecar.
        self.target_flag = target_flag
        #: Where the request id goes once the turn is accepted, when ``console`` shows no spinner.
        self.err_console = err_console
        self.at_line_start = True
        self.tool_names: dict[str, str] = {}
        #: Calls whose input arrived and whose result has not: a Ctrl-C aborts them.
        self.open_calls: dict[str, str] = {}
        #: The last preliminary result shown per tool call (its JSON), so the final is not repeated.
        self.preliminary: dict[str, str] = {}
        #: The model streamed output (text, reasoning, a tool call): its token count is not 0.
        self.output_streamed = False
        self.model = ""
        #: The step number of the last StepStart shown (-1: none yet).
        self.step_shown = -1
        self.events_seen = 0
        #: TurnStart arrived: the input is stored (and a cancel stores the partial reply).
        self.started = False
        #: The reply has content (text, reasoning, a tool call, a source, a file): a cancel stores it.
        self.reply_content = False
        self.waiting: Status | None = None
        self.wait("waiting for the sidecar")

    def wait(self, what: str) -> None:
        """Show a spinner saying ``what`` until the next visible output (terminals only: piped
        output gets no control codes)."""
        if not self.console.is_terminal or self.waiting is not None:
            return
        hint = f" · request {self.request_id} · Ctrl-C cancels" if self.request_id else ""
        self.waiting = self.console.status(Text(f"{what}…{hint}", style="dim"), spinner="dots")
        self.waiting.start()

    def stop_waiting(self) -> None:
        """Remove the spinner, if shown."""
        if self.waiting is not None:
            self.waiting.stop()
            self.waiting = None

    async def tee(self, events: AsyncIterator[event_pb2.TurnEvent]) -> AsyncIterator[event_pb2.TurnEvent]:
        """Pass ``events`` through, rendering each once the consumer has accepted it."""
        try:
            async for event in events:
                self.events_seen += 1
                if self.events_seen == 1:
                    self._announce()
                yield event
                self.render(event)
        finally:
            aclose = getattr(events, "aclose", None)
            if aclose is not None:
                await aclose()

    def _announce(self) -> None:
        """Piped output has no spinner to show the request id `turnwire cancel` needs: print it on
        the error console once the sidecar accepted the turn (its first event), so a call that
        fails prints only its error."""
        if self.console.is_terminal or self.err_console is None or not self.request_id:
            return
        self.err_console.print(
            Text(
                f"request {self.request_id} · `{command_name()} cancel {self.request_id}{self.target_flag}`"
                " cancels it while it runs",
                style="dim",
            ),
            soft_wrap=True,
            highlight=False,
        )

    def write(self, text: str, style: str = "") -> None:
        """Print inline text without wrapping or markup; tracks whether a line is open."""
        if not text:
            return
        self.console.print(Text(text, style=style), end="", soft_wrap=True, highlight=False, markup=False)
        self.at_line_start = text.endswith("\n")

    def end_line(self) -> None:
        """Close an open line, if any."""
        if not self.at_line_start:
            self.console.print()
            self.at_line_start = True

    def line(self, text: Text) -> None:
        """Print a whole line, closing an open one first."""
        self.end_line()
        self.console.print(text, soft_wrap=True, highlight=False)

    def render(self, event: event_pb2.TurnEvent) -> None:
        kind = event.WhichOneof("event")
        if kind == "progress":  # a keepalive, not part of the turn: only the spinner changes
            self._progress(event.progress)
            return
        self.started = self.started or kind == "turn_start"
        if kind in _WAITING_FOR:
            self.stop_waiting()
            self.wait(_WAITING_FOR[kind])
        elif kind == "tool_output_available" and event.tool_output_available.preliminary:
            self.stop_waiting()  # the line goes above the spinner, which stays: the tool goes on
            self._render(kind, event)
            self.wait("running the tool")
            return
        elif kind not in _SILENT:
            self.stop_waiting()
        self._render(kind, event)

    def _progress(self, progress: event_pb2.Progress) -> None:
        """Say what a silent turn waits for and for how long (whole seconds)."""
        what = _PROGRESS_PHASES.get(progress.phase)
        if what is None:
            return
        self.stop_waiting()
        self.wait(f"{what} ({progress.elapsed.ToTimedelta().total_seconds():.0f} s)")

    def _render(self, kind: str | None, event: event_pb2.TurnEvent) -> None:
        if kind in _MODEL_OUTPUT:
            self.output_streamed = True
        if kind in _REPLY_CONTENT:
            self.reply_content = True
        if kind == "turn_start":
            self.model = event.turn_start.model
        elif kind == "step_start":
            # A fallback's AttemptStart is followed by the same step's StepStart again: shown once.
            if event.step_start.step_number > 0 and event.step_start.step_number != self.step_shown:
                self.line(Text(f"· step {event.step_start.step_number + 1}", style="dim"))
            self.step_shown = event.step_start.step_number
            # The model the step runs on (a fallback when its model's breaker is open); empty
            # from a sidecar older than the field.
            self.model = event.step_start.model or self.model
        elif kind == "text_delta":
            self.write(event.text_delta.delta)
        elif kind == "reasoning_delta":
            self.write(event.reasoning_delta.delta, style="dim italic")
        elif kind in ("text_end", "reasoning_end"):
            self.end_line()
        elif kind == "tool_input_start":
            start = event.tool_input_start
            self.tool_names[start.tool_call_id] = start.tool_name
        elif kind == "tool_input_available":
            call = event.tool_input_available
            self.tool_names[call.tool_call_id] = call.tool_name
            self.open_calls[call.tool_call_id] = call.tool_name
            self.line(call_line(call.tool_name, input_json(call)))
        elif kind == "tool_input_error":
            bad = event.tool_input_error
            self.tool_names[bad.tool_call_id] = bad.tool_name
            self.line(call_line(bad.tool_name, short(bad.raw_input), style="red"))
            self.line(error_line(bad.tool_name, f"invalid input: {bad.error_text}"))
        elif kind == "tool_approval_request":
            name = self._name(event.tool_approval_request.tool_call_id, event.tool_approval_request.tool_name)
            call_id = event.tool_approval_request.tool_call_id
            self.open_calls.pop(call_id, None)  # it waits for the application, not running
            self.line(
                Text(
                    f"? {name} awaits approval"
                    + approval_hint(self.conversation_id, call_id, self.target_flag),
                    style="yellow",
                )
            )
        elif kind == "tool_output_available":
            output = event.tool_output_available
            name, value = self._name(output.tool_call_id, output.tool_name), tool_call_output_json(output)
            if not output.preliminary:
                self.open_calls.pop(output.tool_call_id, None)
            if output.preliminary:
                self.preliminary[output.tool_call_id] = value
                self.line(preliminary_line(name, value))
            elif self.preliminary.get(output.tool_call_id) == value:
                # A streaming tool's last preliminary value is its result: say so, do not repeat it.
                self.line(Text.assemble(("← ", "green"), (name, "bold green"), ": final result as above"))
            else:
                self.line(result_line(name, value, output.decision))
        elif kind == "tool_output_error":
            failed = event.tool_output_error
            self.open_calls.pop(failed.tool_call_id, None)
            self.line(error_line(self._name(failed.tool_call_id, failed.tool_name), failed.error_text))
        elif kind == "tool_output_denied":
            self.open_calls.pop(event.tool_output_denied.tool_call_id, None)
            denied = event.tool_output_denied
            name = self._name(denied.tool_call_id, denied.tool_name)
            self.line(denied_line(name, event.tool_output_denied.reason))
        elif kind == "source":
            self.line(source_line(event.source))
        elif kind == "file":
            self.line(file_line(event.file))
        elif kind == "step_finish":
            reason = event.step_finish.finish_reason
            if reason in (
                event_pb2.FINISH_REASON_LENGTH,
                event_pb2.FINISH_REASON_CONTENT_FILTER,
                event_pb2.FINISH_REASON_ERROR,
            ):
                name = event_pb2.FinishReason.Name(reason).removeprefix("FINISH_REASON_")
                self.line(Text(f"(step stopped: {name.lower()})", style="yellow"))
        elif kind == "context_compacted":
            c = event.context_compacted
            why = event_pb2.CompactionReason.Name(c.reason).removeprefix("COMPACTION_REASON_").lower()
            done = f"{c.tokens_before:,} → {c.tokens_after:,} tokens" if c.shortened else "nothing to shorten"
            self.line(Text(f"(context compacted, {why}, {c.strategy}: {done})", style="yellow"))
        elif kind == "attempt_start":
            a = event.attempt_start
            how = "continuing the reply" if a.appends else "starting the reply over"
            if a.model:  # a fallback: the step runs on another model from here on
                how = f"{how} on {a.model}"
                self.model = a.model
            why = _ATTEMPT_REASONS.get(a.reason) or a.reason.lower().replace("_", " ")
            self.line(
                Text(
                    f"(attempt {a.attempt} after {why}: {how})",
                    style="yellow",
                )
            )
        elif kind == "turn_end":
            self.end_line()

    def _name(self, tool_call_id: str, tool_name: str) -> str:
        # Result events name the tool; a sidecar older than that field leaves it empty.
        return tool_name or self.tool_names.get(tool_call_id, tool_call_id or "tool")

    def abort_open_calls(self) -> None:
        """After a Ctrl-C: each call still running is shown as the sidecar stores it, aborted
        (docs/semantics.md §5), as ``history`` will show it."""
        for name in self.open_calls.values():
            self.line(error_line(name, ABORTED_TOOL_ERROR))
        self.open_calls.clear()


def print_status_line(out: Console, result: TurnResult, model: str, *, output_streamed: bool = False) -> None:
    """The line that ends a turn: status, why, steps, tokens, cost, model.

    Why: the error's reason and message; for a provider error its class as ``classify_chat_error``
    and the sidecar's log name it, then the fine class (``(transient: server_error)``,
    :data:`turnwire.error_classes.COARSE`); an ``ABORTED`` without an error (a plain cancel from a
    sidecar that did not yet say who cancelled: ``CANCELLED``, docs/semantics.md §10) says where it
    can have come from, since this client did not cancel it. Steps are shown once a step finished
    (``step_count`` counts a step cut short too: one the model never answered is no step to show).
    Token counts are the provider's: none when it reported none; an output count of 0 after output
    was streamed (``output_streamed``: a stream cut by a cancel before the provider's usage event,
    or a server that reports no usage) is said to be not reported rather than shown as 0. The cost
    is ``TurnEnd.cost`` in US dollars, shown only when known (docs/cost.md: unknown is not $0).
    The model is the one the turn's steps ran on, or each with its steps when they ran on several
    (:func:`step_models`); ``model`` when no step said (none finished, or an older sidecar)."""
    line = Text()
    line.append(result.status_name, style=STATUS_STYLES.get(result.status, "bold"))
    if result.error is not None:
        error = TurnwireError.from_status(result.error)
        if error.reason:
            line.append(f" [{error.reason}]", style="red")
        kind = error.error_metadata.get("provider_error_class")
        if kind:
            line.append(f" ({error_class(kind)})", style="red")
        line.append(f": {cli_terms(error.message)}", style="red")
    elif result.status == event_pb2.TURN_STATUS_ABORTED:
        line.append(f" {_CANCELLED_ELSEWHERE}", style=STATUS_STYLES[result.status])
    facts = []
    if any(event.WhichOneof("event") == "step_finish" for event in result.events):
        facts.append(plural(result.step_count, "step"))
    usage = result.usage
    if usage.input_tokens or usage.output_tokens or usage.total_tokens:
        out_tokens = (
            "not reported" if output_streamed and not usage.output_tokens else str(usage.output_tokens)
        )
        tokens = f"tokens in {usage.input_tokens} / out {out_tokens}"
        if usage.reasoning_tokens:
            tokens += f" (reasoning {usage.reasoning_tokens})"
        if usage.cached_input_tokens:
            tokens += f" · cached {usage.cached_input_tokens}"
        if usage.cache_write_input_tokens:  # priced apart (docs/cost.md): shown apart
            tokens += f" · cache write {usage.cache_write_input_tokens}"
        facts.append(tokens)
    end = result.events[-1] if result.events else None
    if end is not None and end.turn_end.HasField("cost"):
        facts.append(f"cost {usd(end.turn_end.cost.usd)}")
    ran = step_models(result.events)
    if ran or model:
        facts.append(ran or model)
    if facts:
        line.append(" · " + " · ".join(facts), style="dim")
    out.print(line, soft_wrap=True, highlight=False)


def step_models(events: Sequence[event_pb2.TurnEvent]) -> str:
    """The models the finished steps of ``events`` (a turn's stream) ran on, from their
    ``StepFinish.model`` (a fallback's included, docs/providers.md "Fallback across providers"):
    ``openai:gpt-4o`` when one model ran them all, else each run of steps with its model in step
    order, ``openai:gpt-4o (step 1), anthropic:claude-sonnet-4-5 (steps 2-3)``; empty when no
    finished step names its model."""
    by_step: dict[int, str] = {}
    for event in events:
        if event.WhichOneof("event") == "step_finish" and event.step_finish.model:
            by_step[event.step_finish.step_number] = event.step_finish.model  # a re-run's wins
    if len(set(by_step.values())) <= 1:
        return next(iter(by_step.values()), "")
    runs: list[tuple[str, int, int]] = []  # (model, first step, last step), 1-based
    for number in sorted(by_step):
        model = by_step[number]
        if runs and runs[-1][0] == model and runs[-1][2] == number:
            runs[-1] = (model, runs[-1][1], number + 1)
        else:
            runs.append((model, number + 1, number + 1))
    return ", ".join(
        f"{model} (step {first})" if first == last else f"{model} (steps {first}-{last})"
        for model, first, last in runs
    )


def usd(value: float) -> str:
    """``value`` US dollars for reading: ``$0.0026``, ``$3``; to the millionth of a dollar."""
    return "$" + f"{value:.6f}".rstrip("0").rstrip(".")


_ATTEMPT_REASONS = {
    # The reason covers a takeover by another replica too (docs/semantics.md §8).
    "SERVER_RESTARTED": "its sidecar stopped (a restart, or another replica took the turn over)",
}
"""How a status line says an ``AttemptStart.reason`` whose words alone would mislead."""

_CANCELLED_ELSEWHERE = "(cancelled elsewhere: `turnwire cancel` or another client)"
"""Why a turn this client did not cancel ended ABORTED without an error."""
