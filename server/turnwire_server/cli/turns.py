"""The turn runners: ``turnwire chat``, ``continue`` and ``approve`` each open a turn's stream
on the sidecar and render it live (:mod:`.live`); ``turnwire cancel`` cancels one.

Each runner says which RPC opens its stream; :func:`run_turn` connects, renders, and turns the
outcome into an exit code (:mod:`.exit_codes`). On a terminal a spinner shows the request id while
the turn waits; otherwise it is printed to the error console (stderr) once the sidecar accepted
the turn, for ``turnwire cancel``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from rich.console import Console
from rich.text import Text

from turnwire_client import ProtocolError, TurnwireClient, TurnwireError, collect
from turnwire_client.v1 import event_pb2
from turnwire_server.cli.connection import Connection, command_name, target_flag
from turnwire_server.cli.errors import print_call_error
from turnwire_server.cli.exit_codes import EXIT_OK, EXIT_TURN_FAILED
from turnwire_server.cli.live import TurnRenderer, print_status_line
from turnwire_server.cli.parts import STATUS_STYLES, or_stderr

__all__ = ["run_approval", "run_cancel", "run_chat", "run_continue", "run_turn"]

OpenStream = Callable[[TurnwireClient, str], AsyncIterator[event_pb2.TurnEvent]]
"""Opens a turn's stream on a connected client, under the request id given."""


async def run_chat(
    connection: Connection,
    conversation_id: str,
    text: str,
    *,
    model: str | None = None,
    body: Mapping[str, Any] | None = None,
    budget: Mapping[str, float] | None = None,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Send ``text`` to ``conversation_id`` on the sidecar ``connection`` names and render the
    turn live.

    Text deltas are printed as they arrive, reasoning dimmed, tool calls as
    ``→ name {input}`` and results as ``← name: {output}`` (failures in red); a streaming tool's
    preliminary results as ``… name: {output} (preliminary)``, its final result once; later steps
    get a dim ``step N`` marker, and one status line ends the output (status, the error for
    ERROR turns, steps, token usage as far as the provider reported it). On a terminal a spinner
    shows the request id while the turn waits; otherwise the request id is printed to
    ``err_console`` (stderr) once, when the sidecar accepted the turn (its first event). Errors
    (a refused call, an unreachable sidecar, a broken stream) go to ``err_console``.

    Args:
        connection: The sidecar's address (e.g. ``"localhost:50051"``), TLS and bearer token.
        conversation_id: The conversation to append to (created on first use).
        text: The user message.
        model: Optional ``provider:model`` for this turn.
        body: Optional JSON-like data for lifecycle hooks.
        budget: Optional turn budget of its own, ``{"max_tokens": …, "max_usd": …}`` (lowers the
            configured one; docs/cost.md, "Budgets").
        console: Where to print; a default stdout ``Console`` when ``None``.
        err_console: Where errors go, and the request id when ``console`` is not a terminal;
            stderr when ``None``.

    Returns:
        The process exit code: 0 when the turn COMPLETED; 1 when it ended otherwise (or the
        stream broke the protocol); 2 when the sidecar rejected the call (code, message and
        field violations are printed); 3 when the sidecar cannot be reached.

    Never raises :class:`turnwire.TurnwireError`; other exceptions (e.g. cancellation) pass.
    """
    return await run_turn(
        connection,
        conversation_id,
        lambda client, request_id: client.chat(
            conversation_id, text, request_id=request_id, body=body, model=model, budget=budget
        ),
        console=console,
        err_console=err_console,
    )


async def run_continue(
    connection: Connection,
    conversation_id: str,
    *,
    model: str | None = None,
    budget: Mapping[str, float] | None = None,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Let the model continue after the conversation's last assistant message (``ContinueLastTurn``)
    and render that turn as :func:`run_chat` does. A last user message without a reply is answered
    instead (``SaveMessages`` with no messages, same request id); a conversation that is empty or
    ends in a system message ends ``SKIPPED`` (exit code 1). ``budget``, ``err_console`` and exit
    codes as for :func:`run_chat`."""

    async def go_on(client: TurnwireClient, request_id: str) -> AsyncIterator[event_pb2.TurnEvent]:
        # A last user message without a reply (a turn cancelled before any) has nothing to
        # continue; what the person wants is its answer: a turn on the stored history as it is
        # (SaveMessages with no messages, docs/semantics.md §1), under the same request id.
        skipped: list[event_pb2.TurnEvent] = []
        turn = client.continue_last_turn(conversation_id, request_id=request_id, model=model, budget=budget)
        async for event in turn:
            if _unanswered(event):
                skipped.append(event)
                continue
            yield event
        if skipped:
            answer = client.save_messages(
                conversation_id, [], request_id=request_id, model=model, budget=budget
            )
            async for event in answer:
                yield event

    return await run_turn(connection, conversation_id, go_on, console=console, err_console=err_console)


async def run_approval(
    connection: Connection,
    conversation_id: str,
    tool_call_id: str,
    *,
    approved: bool,
    reason: str | None = None,
    model: str | None = None,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Approve or deny the call ``tool_call_id`` waiting for approval (``SubmitToolApprovals``,
    docs/semantics.md §6) and render the turn that goes on as :func:`run_chat` does; ``reason``
    is told to the model for a denial; ``model`` runs the turn that goes on. Exit codes as for
    :func:`run_chat` (2 when the call is not waiting: unknown id, or already answered)."""
    reasons = {tool_call_id: reason} if reason else None

    return await run_turn(
        connection,
        conversation_id,
        lambda client, request_id: client.submit_tool_approvals(
            conversation_id, {tool_call_id: approved}, reasons=reasons, request_id=request_id, model=model
        ),
        console=console,
        err_console=err_console,
    )


def _unanswered(event: event_pb2.TurnEvent) -> bool:
    """A ``ContinueLastTurn`` skipped because the last message is the user's (no reply yet)."""
    if event.WhichOneof("event") != "turn_end" or event.turn_end.status != event_pb2.TURN_STATUS_SKIPPED:
        return False
    error = TurnwireError.from_status(event.turn_end.error)
    return error.reason == "NOTHING_TO_CONTINUE" and error.error_metadata.get("last_role") == "user"


async def run_resume(
    connection: Connection,
    request_id: str,
    *,
    after: int = 0,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Follow turn ``request_id`` (``ResumeTurn``, on any replica): its stored events after
    sequence number ``after`` (0: all), then the live ones to its end, rendered as :func:`run_chat`
    does. Leaving (Ctrl-C) never affects the turn. Exit codes as for :func:`run_chat` (2 for an
    unknown turn or one past the events' retention)."""
    return await run_turn(
        connection,
        "CONVERSATION",
        lambda client, _: client.resume_turn(request_id, after),
        request_id=request_id,
        following=True,
        console=console,
        err_console=err_console,
    )


async def run_turn(
    connection: Connection,
    conversation_id: str,
    open_stream: OpenStream,
    *,
    request_id: str | None = None,
    following: bool = False,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Render the turn ``open_stream`` opens on ``conversation_id`` under ``request_id`` (a new
    ``cli-…`` id when None); ``following``: the stream follows a turn started elsewhere
    (``ResumeTurn``), which leaving does not stop. Exit codes as for :func:`run_chat`."""
    request_id = request_id or f"cli-{uuid.uuid4().hex[:16]}"
    out = console if console is not None else Console()
    err = or_stderr(err_console)
    # A followed turn's id is the one its caller gave, and the turn may have ended long ago: no
    # "cancels it while it runs" line for it.
    announce_to = None if following else err
    renderer = TurnRenderer(
        out,
        request_id,
        err_console=announce_to,
        conversation_id=conversation_id,
        target_flag=target_flag(connection.target),
    )
    try:
        # Progress keepalives (a turn silent for limits.progress_interval_seconds) update the
        # spinner: a turn queued behind another says so instead of "waiting for the sidecar".
        async with connection.client(include_progress=True) as client:
            result = await collect(renderer.tee(open_stream(client, request_id)))
    except asyncio.CancelledError:
        # Ctrl-C: asyncio.run cancels this task; leaving the stream cancels the turn on the
        # sidecar (disconnect policy "cancel"), which stores the partial reply as ABORTED.
        renderer.stop_waiting()
        renderer.end_line()
        if following:
            out.print(
                Text(f"stopped following turn {request_id}; it goes on in the sidecar", style="yellow"),
                soft_wrap=True,
                highlight=False,
            )
            raise
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
                style=STATUS_STYLES[event_pb2.TURN_STATUS_ABORTED],
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
        return print_call_error(
            err,
            connection,
            error,
            mid_turn=renderer.events_seen > 0,
            follow_up=_follow_up(
                request_id, conversation_id, connection.target, stored=following or renderer.started
            ),
        )
    renderer.stop_waiting()
    renderer.end_line()
    print_status_line(out, result, renderer.model, output_streamed=renderer.output_streamed)
    return EXIT_OK if result.ok else EXIT_TURN_FAILED


def _follow_up(request_id: str, conversation_id: str, target: str, *, stored: bool) -> str:
    """How to follow turn ``request_id`` again after the connection to the sidecar at ``target``
    was lost during it: ``stored``, its input is durable (``TurnStart`` came, docs/semantics.md
    §5), and ``resume`` follows it on any replica, or replays how it ended (a sidecar that stopped
    recovers or ends its turns when it starts, §8); before that, the input may not have been
    stored. The commands name ``target`` unless it is the default one."""
    where = target_flag(target)
    program = command_name()
    resume = f"`{program} resume {request_id}{where}`"
    if stored:
        return (
            f"turn {request_id} is stored: {resume} follows it, or shows how it ended, "
            "once the sidecar answers again"
        )
    return (
        f"turn {request_id} had not started, so your message may not be stored: {resume} follows it "
        f"if it is, and `{program} history {conversation_id}{where}` shows whether it is"
    )


async def run_cancel(
    connection: Connection,
    request_id: str,
    *,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Cancel the running or queued turn ``request_id`` (``CancelChat``; any replica). Prints
    that the turn was cancelled, or on ``err_console`` (stderr when ``None``) that there was none
    or the call's error. Returns 0 when one was, 1 when no such turn is running, else 2 or 3 as
    :func:`run_chat` does."""
    out = console if console is not None else Console()
    err = or_stderr(err_console)
    try:
        async with connection.client() as client:
            cancelled = await client.cancel_chat(request_id)
    except TurnwireError as error:
        return print_call_error(err, connection, error)
    if cancelled:
        out.print(Text(f"cancelled {request_id}: its turn ends ABORTED", style="bold yellow"), soft_wrap=True)
        return EXIT_OK
    err.print(
        Text(f"no running or queued turn {request_id} (finished, or never started)", style="dim"),
        soft_wrap=True,
    )
    return EXIT_TURN_FAILED
