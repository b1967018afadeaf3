"""Terminal rendering for the ``turnwire chat`` and ``turnwire history`` commands.

Both commands talk to a running sidecar through :class:`turnwire.TurnwireClient` and print
with rich. Output stays plain text (no control codes, no spinner) when it is not a terminal, so it
can be captured by tests and piped into files; what the spinner would say that a person still
needs (the turn's request id, for ``turnwire cancel``) goes to stderr then. Errors are phrased in
the CLI's terms: a server message naming an RPC the CLI has a command for names the command.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import UTC
from typing import Any

import grpc
from google.protobuf import json_format, timestamp_pb2
from rich.console import Console
from rich.status import Status
from rich.text import Text

from turnwire.errors import ABORTED_TOOL_ERROR, INTERRUPTED_TOOL_ERROR
from turnwire_client import ProtocolError, TlsOptions, TurnResult, TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.api.message_pages import turn_places

__all__ = [
    "EXIT_CALL_FAILED",
    "EXIT_OK",
    "EXIT_TURN_FAILED",
    "EXIT_UNREACHABLE",
    "cli_terms",
    "run_cancel",
    "run_chat",
    "run_continue",
    "run_conversations",
    "run_history",
]

EXIT_OK = 0
"""Exit code: the turn completed (``run_chat``) or the history was printed."""
EXIT_TURN_FAILED = 1
"""Exit code: the turn ended other than COMPLETED (ERROR, ABORTED, INTERRUPTED, SKIPPED)."""
EXIT_CALL_FAILED = 2
"""Exit code: the sidecar rejected the call (bad input, not found, overloaded, ...)."""
EXIT_UNREACHABLE = 3
"""Exit code: the sidecar could not be reached."""

_MAX_JSON = 300  # characters of tool input/output shown before eliding

_STATUS_STYLES: dict[int, str] = {
    event_pb2.TURN_STATUS_COMPLETED: "bold green",
    event_pb2.TURN_STATUS_ERROR: "bold red",
    event_pb2.TURN_STATUS_ABORTED: "bold yellow",
    event_pb2.TURN_STATUS_INTERRUPTED: "bold yellow",
    event_pb2.TURN_STATUS_SKIPPED: "bold",
}

_ROLE_STYLES: dict[int, str] = {
    message_pb2.ROLE_USER: "bold cyan",
    message_pb2.ROLE_ASSISTANT: "bold magenta",
    message_pb2.ROLE_SYSTEM: "bold yellow",
}


async def run_chat(
    target: str,
    conversation_id: str,
    text: str,
    *,
    model: str | None = None,
    body: Mapping[str, Any] | None = None,
    tls: TlsOptions | None = None,
    console: Console | None = None,
    token: str | None = None,
    err_console: Console | None = None,
) -> int:
    """Send ``text`` to ``conversation_id`` on the sidecar at ``target`` and render the turn live.

    Text deltas are printed as they arrive, reasoning dimmed, tool calls as
    ``→ name {input}`` and results as ``← name: {output}`` (failures in red); a streaming tool's
    preliminary results as ``… name: {output} (preliminary)``, its final result once; later steps
    get a dim ``step N`` marker, and one status line ends the output (status, the error for
    ERROR turns, steps, token usage as far as the provider reported it). On a terminal a spinner
    shows the request id while the turn waits; otherwise the request id is printed to
    ``err_console`` (stderr) once, when the sidecar accepted the turn (its first event). Errors
    (a refused call, an unreachable sidecar, a broken stream) go to ``err_console``.

    Args:
        target: The sidecar's address, e.g. ``"localhost:50051"``.
        conversation_id: The conversation to append to (created on first use).
        text: The user message.
        model: Optional ``provider:model`` for this turn.
        body: Optional JSON-like data for lifecycle hooks.
        tls: TLS towards the sidecar; None: plaintext.
        console: Where to print; a default stdout ``Console`` when ``None``.
        token: Bearer token for a sidecar with ``auth:`` on.
        err_console: Where errors go, and the request id when ``console`` is not a terminal;
            stderr when ``None``.

    Returns:
        The process exit code: 0 when the turn COMPLETED; 1 when it ended otherwise (or the
        stream broke the protocol); 2 when the sidecar rejected the call (code, message and
        field violations are printed); 3 when the sidecar cannot be reached.

    Never raises :class:`turnwire.TurnwireError`; other exceptions (e.g. cancellation) pass.
    """
    request_id = f"cli-{uuid.uuid4().hex[:16]}"
    return await _run_turn(
        target,
        request_id,
        lambda client: client.chat(conversation_id, text, request_id=request_id, body=body, model=model),
        tls=tls,
        console=console,
        token=token,
        err_console=err_console,
        conversation_id=conversation_id,
    )


async def run_continue(
    target: str,
    conversation_id: str,
    *,
    model: str | None = None,
    tls: TlsOptions | None = None,
    console: Console | None = None,
    token: str | None = None,
    err_console: Console | None = None,
) -> int:
    """Let the model continue after the conversation's last assistant message (``ContinueLastTurn``)
    and render that turn as :func:`run_chat` does. A last user message without a reply is answered
    instead (``SaveMessages`` with no messages, same request id); a conversation that is empty or
    ends in a system message ends ``SKIPPED`` (exit code 1). ``tls``: TLS towards the sidecar (None:
    plaintext); ``err_console`` and exit codes as for :func:`run_chat`."""
    request_id = f"cli-{uuid.uuid4().hex[:16]}"

    async def go_on(client: TurnwireClient) -> AsyncIterator[event_pb2.TurnEvent]:
        # A last user message without a reply (a turn cancelled before any) has nothing to
        # continue; what the person wants is its answer: a turn on the stored history as it is
        # (SaveMessages with no messages, docs/semantics.md §1), under the same request id.
        skipped: list[event_pb2.TurnEvent] = []
        async for event in client.continue_last_turn(conversation_id, request_id=request_id, model=model):
            if _unanswered(event):
                skipped.append(event)
                continue
            yield event
        if skipped:
            async for event in client.save_messages(conversation_id, [], request_id=request_id, model=model):
                yield event

    return await _run_turn(
        target,
        request_id,
        go_on,
        tls=tls,
        console=console,
        token=token,
        err_console=err_console,
        conversation_id=conversation_id,
    )


async def run_approval(
    target: str,
    conversation_id: str,
    tool_call_id: str,
    *,
    approved: bool,
    reason: str | None = None,
    model: str | None = None,
    tls: TlsOptions | None = None,
    console: Console | None = None,
    token: str | None = None,
    err_console: Console | None = None,
) -> int:
    """Approve or deny the call ``tool_call_id`` waiting for approval (``SubmitToolApprovals``,
    docs/semantics.md §6) and render the turn that goes on as :func:`run_chat` does; ``reason``
    is told to the model for a denial; ``model`` runs the turn that goes on. Exit codes as for
    :func:`run_chat` (2 when the call is not waiting: unknown id, or already answered)."""
    request_id = f"cli-{uuid.uuid4().hex[:16]}"
    reasons = {tool_call_id: reason} if reason else None

    async def names(client: TurnwireClient) -> dict[str, str]:
        # The continuation's events name the call by id only; the transcript has its tool name.
        conversation = await client.get_conversation(conversation_id)
        return {
            part.tool_call.tool_call_id: part.tool_call.tool_name
            for message in conversation.messages
            for part in message.parts
            if part.WhichOneof("kind") == "tool_call" and part.tool_call.tool_call_id == tool_call_id
        }

    return await _run_turn(
        target,
        request_id,
        lambda client: client.submit_tool_approvals(
            conversation_id, {tool_call_id: approved}, reasons=reasons, request_id=request_id, model=model
        ),
        tls=tls,
        console=console,
        token=token,
        err_console=err_console,
        conversation_id=conversation_id,
        tool_names=names,
    )


def _unanswered(event: event_pb2.TurnEvent) -> bool:
    """A ``ContinueLastTurn`` skipped because the last message is the user's (no reply yet)."""
    if event.WhichOneof("event") != "turn_end" or event.turn_end.status != event_pb2.TURN_STATUS_SKIPPED:
        return False
    error = TurnwireError.from_status(event.turn_end.error)
    return error.reason == "NOTHING_TO_CONTINUE" and error.error_metadata.get("last_role") == "user"


async def _run_turn(
    target: str,
    request_id: str,
    open_stream: Callable[[TurnwireClient], AsyncIterator[event_pb2.TurnEvent]],
    *,
    tls: TlsOptions | None,
    console: Console | None,
    token: str | None,
    err_console: Console | None = None,
    conversation_id: str = "CONVERSATION",
    tool_names: Callable[[TurnwireClient], Awaitable[Mapping[str, str]]] | None = None,
) -> int:
    """Render the turn ``open_stream`` opens; ``tool_names``: the names of calls the stream will
    name by id only (``{tool_call_id: tool_name}``, read before it opens)."""
    out = console if console is not None else Console()
    err = _or_stderr(err_console)
    renderer = _TurnRenderer(out, request_id, err_console=err, conversation_id=conversation_id)
    try:
        # Progress keepalives (a turn silent for limits.progress_interval_seconds) update the
        # spinner: a turn queued behind another says so instead of "waiting for the sidecar".
        async with TurnwireClient(target, tls=tls, token=token, include_progress=True) as client:
            if tool_names is not None:
                renderer.tool_names.update(await tool_names(client))
            result = await collect(renderer.tee(open_stream(client)))
    except asyncio.CancelledError:
        # Ctrl-C: asyncio.run cancels this task; leaving the stream cancels the turn on the
        # sidecar (disconnect policy "cancel"), which stores the partial reply as ABORTED.
        renderer.stop_waiting()
        renderer.end_line()
        if renderer.started:
            renderer.abort_open_calls()
        # Before TurnStart the input was not yet durable (queued, or being stored): nothing stays.
        # After it, the partial reply is stored only when it has content (docs/semantics.md §11,
        # "Empty replies"): a reply with none leaves no message, so `history` has nothing to mark.
        if not renderer.started:
            stored = "cancelled before the turn started; nothing was stored"
        elif renderer.reply_content:
            stored = "the partial reply is stored as aborted"
        else:
            stored = "your message is stored; no reply had arrived, so none was stored"
        out.print(
            Text(
                f"ABORTED by Ctrl-C · request {request_id}: {stored}",
                style=_STATUS_STYLES[event_pb2.TURN_STATUS_ABORTED],
            ),
            soft_wrap=True,
            highlight=False,
        )
        raise
    except ProtocolError as error:
        renderer.stop_waiting()
        renderer.end_line()
        err.print(Text(f"protocol error: {error.message}", style="bold red"), soft_wrap=True)
        return EXIT_TURN_FAILED
    except TurnwireError as error:
        renderer.stop_waiting()
        renderer.end_line()
        return _print_call_error(err, target, error, mid_turn=renderer.events_seen > 0)
    renderer.stop_waiting()
    renderer.end_line()
    _print_status_line(out, result, renderer.model, output_streamed=renderer.output_streamed)
    return EXIT_OK if result.ok else EXIT_TURN_FAILED


async def run_history(
    target: str,
    conversation_id: str,
    *,
    tls: TlsOptions | None = None,
    console: Console | None = None,
    token: str | None = None,
    err_console: Console | None = None,
) -> int:
    """Print a conversation's messages, oldest first.

    Each message gets a header (role, id and time in UTC), then its parts: text, reasoning
    dimmed, tool calls as ``→ name {input}`` with their result (``← name: {output}``) or
    error (red), files, sources and data parts as dim one-liners.

    Args:
        target: The sidecar's address.
        conversation_id: The conversation to show.
        tls: TLS towards the sidecar; None: plaintext.
        console: Where to print; a default stdout ``Console`` when ``None``.
        token: Bearer token for a sidecar with ``auth:`` on.
        err_console: Where errors go; stderr when ``None``.

    Returns:
        0 on success; 2 when the conversation does not exist (a clear message is printed) or
        the call is rejected otherwise; 3 when the sidecar cannot be reached.

    Never raises :class:`turnwire.TurnwireError`.
    """
    out = console if console is not None else Console()
    err = _or_stderr(err_console)
    try:
        async with TurnwireClient(target, tls=tls, token=token) as client:
            conversation = await client.get_conversation(conversation_id)
    except TurnwireError as error:
        if error.code == grpc.StatusCode.NOT_FOUND:
            err.print(Text(f"conversation {conversation_id!r} not found", style="bold red"), soft_wrap=True)
            return EXIT_CALL_FAILED
        return _print_call_error(err, target, error)

    header = Text.assemble(
        ("conversation ", "dim"),
        (conversation.conversation_id, "bold"),
        (f" · {_plural(conversation.message_count, 'message')}", "dim"),
    )
    if conversation.HasField("update_time"):
        header.append(f" · updated {_time(conversation.update_time)}", style="dim")
    out.print(header, soft_wrap=True)
    if not conversation.messages:
        out.print(Text("(no messages)", style="dim"), soft_wrap=True)
    partial = {reply.message_id: reply for reply in conversation.partial_replies}
    unreplied = conversation.turns_without_reply
    places = turn_places(conversation.messages, [turn.start_time for turn in unreplied])
    after: dict[int, list[chat_service_pb2.TurnWithoutReply]] = {}
    for turn, place in zip(unreplied, places, strict=True):
        after.setdefault(place - 1, []).append(turn)
    for turn in after.get(-1, []):
        out.print(_unreplied_line(turn), soft_wrap=True, highlight=False)
    for index, message in enumerate(conversation.messages):
        out.print()
        _print_message(out, message, conversation.conversation_id)
        if message.id in partial:
            out.print(_partial_line(partial[message.id]), soft_wrap=True, highlight=False)
        for turn in after.get(index, []):
            out.print(_unreplied_line(turn), soft_wrap=True, highlight=False)
    return EXIT_OK


async def run_conversations(
    target: str,
    *,
    limit: int = 50,
    tls: TlsOptions | None = None,
    console: Console | None = None,
    token: str | None = None,
    err_console: Console | None = None,
) -> int:
    """Print up to ``limit`` conversations, most recently updated first: id, message count, last
    update (UTC); a last line says when more exist. ``tls``, ``token``, ``err_console`` and exit
    codes as for :func:`run_history`."""
    out = console if console is not None else Console()
    shown = 0
    page_token = ""
    try:
        async with TurnwireClient(target, tls=tls, token=token) as client:
            while shown < limit:
                page = await client.list_conversations(
                    page_size=min(limit - shown, 1000), page_token=page_token
                )
                for conversation in page.conversations:
                    line = Text(conversation.conversation_id, style="bold")
                    line.append(f" · {_plural(conversation.message_count, 'message')}", style="dim")
                    if conversation.HasField("update_time"):
                        line.append(f" · updated {_time(conversation.update_time)}", style="dim")
                    out.print(line, soft_wrap=True, highlight=False)
                    shown += 1
                page_token = page.next_page_token
                if not page_token:
                    break
    except TurnwireError as error:
        return _print_call_error(_or_stderr(err_console), target, error)
    if shown == 0:
        out.print(Text("(no conversations)", style="dim"), soft_wrap=True)
    elif page_token:
        out.print(Text(f"(more than {shown}; use --limit to see more)", style="dim"), soft_wrap=True)
    return EXIT_OK


async def run_cancel(
    target: str,
    request_id: str,
    *,
    tls: TlsOptions | None = None,
    console: Console | None = None,
    token: str | None = None,
    err_console: Console | None = None,
) -> int:
    """Cancel the running or queued turn ``request_id`` (``CancelChat``; any replica). Prints
    that the turn was cancelled, or on ``err_console`` (stderr when ``None``) that there was none
    or the call's error. ``tls`` and ``token`` as for :func:`run_history`. Returns 0 when one was,
    1 when no such turn is running, else as for :func:`run_history`."""
    out = console if console is not None else Console()
    err = _or_stderr(err_console)
    try:
        async with TurnwireClient(target, tls=tls, token=token) as client:
            cancelled = await client.cancel_chat(request_id)
    except TurnwireError as error:
        return _print_call_error(err, target, error)
    if cancelled:
        out.print(Text(f"cancelled {request_id}: its turn ends ABORTED", style="bold yellow"), soft_wrap=True)
        return EXIT_OK
    err.print(
        Text(f"no running or queued turn {request_id} (finished, or never started)", style="dim"),
        soft_wrap=True,
    )
    return EXIT_TURN_FAILED


# -- live turn rendering ---------------------------------------------------------------------

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


_APPROVAL_HINT = (
    " (call {call_id}: `turnwire approve {conversation} {call_id}`, or add --deny [--reason TEXT];"
    " the turn goes on)"
)
"""Who answers a call waiting for approval: the CLI's ``approve`` (applications: SubmitToolApprovals)."""


class _TurnRenderer:
    """Prints one turn's events as they arrive."""

    def __init__(
        self,
        console: Console,
        request_id: str = "",
        *,
        err_console: Console | None = None,
        conversation_id: str = "CONVERSATION",
    ) -> None:
        self.console = console
        self.request_id = request_id
        self.conversation_id = conversation_id
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
            Text(f"request {self.request_id} · `turnwire cancel {self.request_id}` cancels it", style="dim"),
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
            if event.step_start.step_number > 0:
                self.line(Text(f"· step {event.step_start.step_number + 1}", style="dim"))
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
            self.line(_call_line(call.tool_name, _input_json(call)))
        elif kind == "tool_input_error":
            bad = event.tool_input_error
            self.tool_names[bad.tool_call_id] = bad.tool_name
            self.line(_call_line(bad.tool_name, _short(bad.raw_input), style="red"))
            self.line(_error_line(bad.tool_name, f"invalid input: {bad.error_text}"))
        elif kind == "tool_approval_request":
            name = self._name(event.tool_approval_request.tool_call_id)
            call_id = event.tool_approval_request.tool_call_id
            self.open_calls.pop(call_id, None)  # it waits for the application, not running
            self.line(
                Text(
                    f"? {name} awaits approval"
                    + _APPROVAL_HINT.format(call_id=call_id, conversation=self.conversation_id),
                    style="yellow",
                )
            )
        elif kind == "tool_output_available":
            output = event.tool_output_available
            name, value = self._name(output.tool_call_id), _output_json(output)
            if not output.preliminary:
                self.open_calls.pop(output.tool_call_id, None)
            if output.preliminary:
                self.preliminary[output.tool_call_id] = value
                self.line(_preliminary_line(name, value))
            elif self.preliminary.get(output.tool_call_id) == value:
                # A streaming tool's last preliminary value is its result: say so, do not repeat it.
                self.line(Text.assemble(("← ", "green"), (name, "bold green"), ": final result as above"))
            else:
                self.line(_result_line(name, value, output.decision))
        elif kind == "tool_output_error":
            failed = event.tool_output_error
            self.open_calls.pop(failed.tool_call_id, None)
            self.line(_error_line(self._name(failed.tool_call_id), failed.error_text))
        elif kind == "tool_output_denied":
            self.open_calls.pop(event.tool_output_denied.tool_call_id, None)
            name = self._name(event.tool_output_denied.tool_call_id)
            self.line(_denied_line(name, event.tool_output_denied.reason))
        elif kind == "source":
            self.line(_source_line(event.source))
        elif kind == "file":
            self.line(_file_line(event.file))
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
            self.line(
                Text(
                    f"(attempt {a.attempt} after {a.reason.lower().replace('_', ' ')}: {how})", style="yellow"
                )
            )
        elif kind == "turn_end":
            self.end_line()

    def _name(self, tool_call_id: str) -> str:
        return self.tool_names.get(tool_call_id, tool_call_id or "tool")

    def abort_open_calls(self) -> None:
        """After a Ctrl-C: each call still running is shown as the sidecar stores it, aborted
        (docs/semantics.md §5), as ``history`` will show it."""
        for name in self.open_calls.values():
            self.line(_error_line(name, ABORTED_TOOL_ERROR))
        self.open_calls.clear()


def _print_status_line(
    out: Console, result: TurnResult, model: str, *, output_streamed: bool = False
) -> None:
    """The line that ends a turn: status, why, steps, tokens, model.

    Why: the error's reason and message; for a provider error its class as ``classify_chat_error``
    and the sidecar's log name it, then the fine class (``(transient: server_error)``,
    :data:`turnwire.error_classes.COARSE`); an ``ABORTED`` without an error (a plain cancel, which
    the stream does not attribute, docs/semantics.md §10) says where it can have come from, since
    this client did not cancel it. Steps are shown once a step finished (``step_count`` counts a
    step cut short too: one the model never answered is no step to show). Token counts are the
    provider's: none when it reported none; an output count of 0 after output was streamed
    (``output_streamed``: a stream cut by a cancel before the provider's usage event, or a server
    that reports no usage) is said to be not reported rather than shown as 0."""
    line = Text()
    line.append(result.status_name, style=_STATUS_STYLES.get(result.status, "bold"))
    if result.error is not None:
        error = TurnwireError.from_status(result.error)
        if error.reason:
            line.append(f" [{error.reason}]", style="red")
        kind = error.error_metadata.get("provider_error_class")
        if kind:
            line.append(f" ({_error_class(kind)})", style="red")
        line.append(f": {cli_terms(error.message)}", style="red")
    elif result.status == event_pb2.TURN_STATUS_ABORTED:
        line.append(f" {_CANCELLED_ELSEWHERE}", style=_STATUS_STYLES[result.status])
    facts = []
    if any(event.WhichOneof("event") == "step_finish" for event in result.events):
        facts.append(_plural(result.step_count, "step"))
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
        facts.append(tokens)
    if model:
        facts.append(model)
    if facts:
        line.append(" · " + " · ".join(facts), style="dim")
    out.print(line, soft_wrap=True, highlight=False)


_CANCELLED_ELSEWHERE = "(cancelled elsewhere: `turnwire cancel` or another client)"
"""Why a turn this client did not cancel ended ABORTED without an error."""


def _error_class(kind: str) -> str:
    """A provider error's fine class (``ErrorInfo.metadata["provider_error_class"]``) as
    ``coarse: fine``, the coarse name being the one the sidecar logs (``classification=``)."""
    from turnwire.error_classes import COARSE

    coarse = COARSE.get(kind)  # type: ignore[call-overload]
    return kind if coarse is None or coarse == kind else f"{coarse}: {kind}"


def _print_call_error(out: Console, target: str, error: TurnwireError, *, mid_turn: bool = False) -> int:
    if error.code == grpc.StatusCode.UNAVAILABLE and not error.reason:
        problem = (
            f"lost the connection to the sidecar at {target}"
            if mid_turn
            else f"cannot reach the sidecar at {target}: is `turnwire serve` running?"
        )
        out.print(Text(problem, style="bold red"), soft_wrap=True)
        if error.message:
            out.print(Text(f"  ({error.message})", style="dim"), soft_wrap=True)
        return EXIT_UNREACHABLE
    head = Text()
    head.append(error.code.name, style="bold red")
    if error.reason:
        head.append(f" [{error.reason}]", style="red")
    head.append(f": {cli_terms(error.message)}")
    out.print(head, soft_wrap=True, highlight=False)
    for field_path, description in error.field_violations:
        if description == error.message:
            continue  # a lone violation the message already says in full
        out.print(Text.assemble("  ", (field_path, "bold"), f": {cli_terms(description)}"), soft_wrap=True)
    return EXIT_CALL_FAILED


_RPC_COMMANDS: dict[str, str] = {
    "Chat or SaveMessages": "`turnwire chat`",
    "ContinueLastTurn": "`turnwire continue`",
    "CancelChat": "`turnwire cancel`",
    "GetConversation": "`turnwire history`",
    "ListConversations": "`turnwire conversations`",
}
"""The sidecar's RPC names (in its messages, written for API clients) that a CLI command does."""

_RPC_NAMES = re.compile(r"\b(?:" + "|".join(re.escape(name) for name in _RPC_COMMANDS) + r")\b")


def cli_terms(message: str) -> str:
    """``message`` (from the sidecar) with each RPC a CLI command does named by that command
    ("start it with Chat or SaveMessages" → "start it with `turnwire chat`"); other text as is."""
    return _RPC_NAMES.sub(lambda match: _RPC_COMMANDS[match.group(0)], message)


# -- history rendering -----------------------------------------------------------------------


def _print_message(out: Console, message: message_pb2.Message, conversation_id: str) -> None:
    role = message_pb2.Role.Name(message.role).removeprefix("ROLE_").lower()
    header = Text(role, style=_ROLE_STYLES.get(message.role, "bold"))
    if message.HasField("create_time"):
        header.append(f" · {_time(message.create_time)}", style="dim")
    if message.id:
        header.append(f" · {message.id}", style="dim")
    out.print(header, soft_wrap=True, highlight=False)
    steps = 0
    for part in message.parts:
        kind = part.WhichOneof("kind")
        if kind == "text":
            if part.text.text:
                out.print(Text(part.text.text), soft_wrap=True, highlight=False)
        elif kind == "reasoning":
            reasoning = part.reasoning
            shown = "(redacted reasoning)" if reasoning.redacted else reasoning.text
            if shown:
                out.print(Text(shown, style="dim italic"), soft_wrap=True, highlight=False)
        elif kind == "tool_call":
            _print_tool_call(out, part.tool_call, conversation_id)
        elif kind == "step_start":
            steps += 1
            if steps > 1:
                out.print(Text(f"· step {steps}", style="dim"), soft_wrap=True)
        elif kind == "file":
            out.print(_file_line(part.file), soft_wrap=True, highlight=False)
        elif kind == "source":
            out.print(_source_line(part.source), soft_wrap=True, highlight=False)
        elif kind == "data":
            data = _short(_json(json_format.MessageToDict(part.data.data)))
            out.print(Text(f"[data {part.data.type}] {data}", style="dim"), soft_wrap=True)


def _partial_line(reply: chat_service_pb2.PartialReply) -> Text:
    """The mark under a reply whose turn did not complete (or is still running)."""
    if reply.status == event_pb2.TURN_STATUS_UNSPECIFIED:
        return Text(f"(partial: turn {reply.request_id} is still running)", style="yellow")
    status = event_pb2.TurnStatus.Name(reply.status).removeprefix("TURN_STATUS_")
    reason = TurnwireError.from_status(reply.error).reason if reply.HasField("error") else ""
    return Text(
        f"(partial: turn {reply.request_id} ended {status}{': ' + reason if reason else ''})",
        style=_STATUS_STYLES.get(reply.status, "bold"),
    )


def _unreplied_line(turn: chat_service_pb2.TurnWithoutReply) -> Text:
    """The mark of a turn with no stored reply (``Conversation.turns_without_reply``), in its
    place: after the message stored just before it started."""
    if turn.status == event_pb2.TURN_STATUS_UNSPECIFIED:
        return Text(f"(turn {turn.request_id} is running; no reply stored yet)", style="yellow")
    status = event_pb2.TurnStatus.Name(turn.status).removeprefix("TURN_STATUS_")
    reason = TurnwireError.from_status(turn.error).reason if turn.HasField("error") else ""
    if reason == "ROLLED_BACK":
        text = f"(turn {turn.request_id} ended {status}: rolled back, its input and reply removed)"
    else:
        text = f"(turn {turn.request_id} ended {status} before any reply was stored"
        text += f": {reason})" if reason else ")"
    return Text(text, style=_STATUS_STYLES.get(turn.status, "bold"))


def _print_tool_call(out: Console, call: message_pb2.ToolCallPart, conversation_id: str) -> None:
    if call.input_json or call.HasField("input"):
        out.print(_call_line(call.tool_name, _input_json(call)), soft_wrap=True)
    elif call.raw_input:  # not a JSON object, or cut off while it streamed
        out.print(_call_line(call.tool_name, _short(call.raw_input), style="red"), soft_wrap=True)
    else:  # the turn stopped before any of the input arrived
        out.print(_call_line(call.tool_name, "(input not received)", style="dim"), soft_wrap=True)
    state = call.state
    if state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
        line = _result_line(call.tool_name, _output_json(call), call.decision)
        if call.preliminary:
            line.append(" (preliminary)", style="dim")
        out.print(line, soft_wrap=True)
    elif state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
        out.print(_error_line(call.tool_name, call.error_text), soft_wrap=True)
    elif state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
        out.print(_denied_line(call.tool_name, call.approval.reason), soft_wrap=True)
    elif state in (
        message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED,
        message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED,
    ):
        hint = _APPROVAL_HINT.format(call_id=call.tool_call_id, conversation=conversation_id)
        out.print(Text(f"? {call.tool_name} awaits approval{hint}", style="yellow"), soft_wrap=True)
    else:
        out.print(Text(f"← {call.tool_name}: (no result)", style="dim"), soft_wrap=True)


# -- shared helpers --------------------------------------------------------------------------


def _call_line(name: str, payload: str, *, style: str = "") -> Text:
    return Text.assemble(("→ ", "cyan"), (name, "bold cyan"), " ", (payload, style))


def _result_line(
    name: str,
    output_json: str,
    decision: message_pb2.ToolCallDecision.ValueType = message_pb2.TOOL_CALL_DECISION_UNSPECIFIED,
) -> Text:
    """``← name: output``; a result a ``before_tool_call`` hook decided is marked as such (the
    model took it as a success, but the tool did not run)."""
    payload = _exact_json(output_json)
    if decision == message_pb2.TOOL_CALL_DECISION_BLOCKED:
        value = json.loads(output_json) if output_json else None
        shown = value if isinstance(value, str) else payload
        return Text.assemble(
            ("← ", "yellow"), (name, "bold yellow"), (": blocked by a hook: ", "yellow"), shown
        )
    line = Text.assemble(("← ", "green"), (name, "bold green"), ": ", payload)
    if decision == message_pb2.TOOL_CALL_DECISION_SUBSTITUTED:
        line.append(" (substituted by a hook; the tool did not run)", style="yellow")
    return line


def _preliminary_line(name: str, output_json: str) -> Text:
    payload = _exact_json(output_json)
    return Text.assemble(("… ", "dim"), (name, "bold dim"), ": ", (payload, "dim"), (" (preliminary)", "dim"))


_STOPPED_TOOL_CALLS: dict[str, str] = {
    ABORTED_TOOL_ERROR: "aborted before it finished (the turn stopped)",
    INTERRUPTED_TOOL_ERROR: "interrupted: no result was recorded",
}
"""The sidecar's results for calls the turn stopped, not the tool failing: shown apart from errors."""


def _denied_line(name: str, reason: str) -> Text:
    """``← name: denied`` (yellow), with the reason given when there is one."""
    return Text(f"← {name}: denied" + (f" ({reason})" if reason else ""), style="yellow")


def _error_line(name: str, error_text: str) -> Text:
    """``← name: error: text`` (red); a call the turn stopped is shown as such (yellow), as
    blocked and denied calls are, not as the tool's failure."""
    stopped = _STOPPED_TOOL_CALLS.get(error_text)
    if stopped is not None:
        word, _, rest = stopped.partition(" ")
        return Text.assemble(
            ("← ", "yellow"), (name, "bold yellow"), ": ", (word, "bold yellow"), (f" {rest}", "yellow")
        )
    return Text(f"← {name}: error: {error_text}", style="red")


def _source_line(source: message_pb2.SourcePart) -> Text:
    label = source.title or source.filename or source.source_id
    where = source.url or source.media_type
    return Text(" ".join(s for s in ("[source]", label, where) if s), style="dim")


def _file_line(file: message_pb2.FilePart) -> Text:
    where = file.url if file.WhichOneof("content") == "url" else f"{len(file.data)} bytes"
    bits = ("[file]", file.filename, file.media_type, where)
    return Text(" ".join(s for s in bits if s), style="dim")


def _input_json(call: message_pb2.ToolCallPart | event_pb2.ToolInputAvailable) -> str:
    """The call's input for display: its exact JSON text, else (a sidecar before input_json
    existed) the deprecated Struct view."""
    if call.input_json:
        return _exact_json(call.input_json)
    return _short(_json(json_format.MessageToDict(call.input)))


def _output_json(call: message_pb2.ToolCallPart | event_pb2.ToolOutputAvailable) -> str:
    """The call's output as exact JSON text (from the deprecated Value view on an older sidecar)."""
    if call.output_json or not call.HasField("output"):
        return call.output_json
    return json.dumps(_plain(json_format.MessageToDict(call.output)))


def _exact_json(text: str) -> str:
    """A tool input or output from its exact JSON text (integers of any size kept), keys sorted
    so the same data always prints the same; ``null`` for an empty text."""
    if not text:
        return "null"
    return _short(json.dumps(json.loads(text), ensure_ascii=False, sort_keys=True))


def _json(value: object) -> str:
    # Struct maps have no order; sort keys so the same data always prints the same.
    return json.dumps(_plain(value), ensure_ascii=False, sort_keys=True)


def _plain(value: object) -> object:
    """Undo protobuf's number widening for display: ``21.0`` becomes ``21``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _short(text: str, limit: int = _MAX_JSON) -> str:
    text = " ".join(text.split()) if "\n" in text else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _or_stderr(console: Console | None) -> Console:
    """``console``, or a stderr ``Console`` when ``None``: where errors go."""
    return console if console is not None else Console(stderr=True)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _time(stamp: timestamp_pb2.Timestamp) -> str:
    return stamp.ToDatetime(tzinfo=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
