"""A conversation read back from the store: ``turnwire history`` and ``turnwire conversations``.

Each message gets a header (role, time in UTC, id), then its parts as the live renderer shows
them; a reply whose turn did not complete, and a turn that stored no reply, are marked in place.
"""

from __future__ import annotations

import grpc
from google.protobuf import json_format
from google.rpc import status_pb2
from rich.console import Console
from rich.text import Text

from turnwire.values import tool_call_output_json
from turnwire_client import TurnwireError
from turnwire_client.v1 import chat_service_pb2, event_pb2, message_pb2
from turnwire_server.cli.connection import Connection, target_flag
from turnwire_server.cli.errors import print_call_error
from turnwire_server.cli.exit_codes import EXIT_CALL_FAILED, EXIT_OK
from turnwire_server.cli.parts import (
    STATUS_STYLES,
    approval_hint,
    call_line,
    denied_line,
    error_line,
    file_line,
    input_json,
    or_stderr,
    plural,
    print_listing_end,
    responded_hint,
    result_line,
    short,
    sorted_json,
    source_line,
    utc_time,
)
from turnwire_server.turn_places import turn_places

__all__ = ["print_message", "run_conversations", "run_history"]

_ROLE_STYLES: dict[int, str] = {
    message_pb2.ROLE_USER: "bold cyan",
    message_pb2.ROLE_ASSISTANT: "bold magenta",
    message_pb2.ROLE_SYSTEM: "bold yellow",
}


async def run_history(
    connection: Connection,
    conversation_id: str,
    *,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Print a conversation's messages, oldest first.

    Each message gets a header (role, id and time in UTC), then its parts: text, reasoning
    dimmed, tool calls as ``→ name {input}`` with their result (``← name: {output}``) or
    error (red), files, sources and data parts as dim one-liners.

    Args:
        connection: The sidecar's address, TLS and bearer token.
        conversation_id: The conversation to show.
        console: Where to print; a default stdout ``Console`` when ``None``.
        err_console: Where errors go; stderr when ``None``.

    Returns:
        0 on success; 2 when the conversation does not exist (a clear message is printed) or
        the call is rejected otherwise; 3 when the sidecar cannot be reached.

    Never raises :class:`turnwire.TurnwireError`.
    """
    out = console if console is not None else Console()
    err = or_stderr(err_console)
    try:
        async with connection.client() as client:
            conversation = await client.get_conversation(conversation_id)
    except TurnwireError as error:
        if error.code == grpc.StatusCode.NOT_FOUND:
            err.print(Text(f"conversation {conversation_id!r} not found", style="bold red"), soft_wrap=True)
            return EXIT_CALL_FAILED
        return print_call_error(err, connection, error)

    header = Text.assemble(
        ("conversation ", "dim"),
        (conversation.conversation_id, "bold"),
        (f" · {plural(conversation.message_count, 'message')}", "dim"),
    )
    if conversation.HasField("update_time"):
        header.append(f" · updated {utc_time(conversation.update_time)}", style="dim")
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
        print_message(out, message, conversation.conversation_id, target_flag(connection.target))
        if message.id in partial:
            out.print(_partial_line(partial[message.id]), soft_wrap=True, highlight=False)
        for turn in after.get(index, []):
            out.print(_unreplied_line(turn), soft_wrap=True, highlight=False)
    return EXIT_OK


async def run_conversations(
    connection: Connection,
    *,
    limit: int = 50,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Print up to ``limit`` conversations, most recently updated first: id, message count, last
    update (UTC); a last line says when more exist. ``err_console`` and exit codes as for
    :func:`run_history`."""
    out = console if console is not None else Console()
    shown = 0
    page_token = ""
    try:
        async with connection.client() as client:
            while shown < limit:
                page = await client.list_conversations(
                    page_size=min(limit - shown, 1000), page_token=page_token
                )
                for conversation in page.conversations:
                    line = Text(conversation.conversation_id, style="bold")
                    line.append(f" · {plural(conversation.message_count, 'message')}", style="dim")
                    if conversation.HasField("update_time"):
                        line.append(f" · updated {utc_time(conversation.update_time)}", style="dim")
                    if conversation.HasField("forked_from"):
                        source = conversation.forked_from
                        line.append(
                            f" · forked from {source.conversation_id} at {source.message_id}", style="dim"
                        )
                    out.print(line, soft_wrap=True, highlight=False)
                    shown += 1
                page_token = page.next_page_token
                if not page_token:
                    break
    except TurnwireError as error:
        return print_call_error(or_stderr(err_console), connection, error)
    print_listing_end(out, shown, bool(page_token), "no conversations")
    return EXIT_OK


def print_message(out: Console, message: message_pb2.Message, conversation_id: str, where: str = "") -> None:
    """Print ``message`` of ``conversation_id`` as ``history`` shows it; the commands it suggests
    (``approve``, ``continue``) end with ``where`` (:func:`.connection.target_flag`)."""
    role = message_pb2.Role.Name(message.role).removeprefix("ROLE_").lower()
    header = Text(role, style=_ROLE_STYLES.get(message.role, "bold"))
    if message.HasField("create_time"):
        header.append(f" · {utc_time(message.create_time)}", style="dim")
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
            _print_tool_call(out, part.tool_call, conversation_id, where)
        elif kind == "step_start":
            steps += 1
            if steps > 1:
                out.print(Text(f"· step {steps}", style="dim"), soft_wrap=True)
        elif kind == "file":
            out.print(file_line(part.file), soft_wrap=True, highlight=False)
        elif kind == "source":
            out.print(source_line(part.source), soft_wrap=True, highlight=False)
        elif kind == "data":
            data = short(sorted_json(json_format.MessageToDict(part.data.data)))
            out.print(Text(f"[data {part.data.type}] {data}", style="dim"), soft_wrap=True)


def _why(error: status_pb2.Status) -> str:
    """Why a turn ended, as its error's reason, with who cancelled it for ``CANCELLED``
    (``CANCELLED (caller_left)``, docs/semantics.md §10)."""
    error_info = TurnwireError.from_status(error)
    cause = error_info.error_metadata.get("cancel_cause")
    return f"{error_info.reason} ({cause})" if cause else error_info.reason


def _partial_line(reply: chat_service_pb2.PartialReply) -> Text:
    """The mark under a reply whose turn did not complete (or is still running)."""
    if reply.status == event_pb2.TURN_STATUS_UNSPECIFIED:
        return Text(f"(partial: turn {reply.request_id} is still running)", style="yellow")
    status = event_pb2.TurnStatus.Name(reply.status).removeprefix("TURN_STATUS_")
    reason = _why(reply.error) if reply.HasField("error") else ""
    return Text(
        f"(partial: turn {reply.request_id} ended {status}{': ' + reason if reason else ''})",
        style=STATUS_STYLES.get(reply.status, "bold"),
    )


def _unreplied_line(turn: chat_service_pb2.TurnWithoutReply) -> Text:
    """The mark of a turn with no stored reply (``Conversation.turns_without_reply``), in its
    place: after the message stored just before it started."""
    if turn.status == event_pb2.TURN_STATUS_UNSPECIFIED:
        return Text(f"(turn {turn.request_id} is running; no reply stored yet)", style="yellow")
    status = event_pb2.TurnStatus.Name(turn.status).removeprefix("TURN_STATUS_")
    reason = _why(turn.error) if turn.HasField("error") else ""
    if reason.startswith("ROLLED_BACK"):
        text = f"(turn {turn.request_id} ended {status}: rolled back, its input and reply removed)"
    else:
        text = f"(turn {turn.request_id} ended {status} before any reply was stored"
        text += f": {reason})" if reason else ")"
    return Text(text, style=STATUS_STYLES.get(turn.status, "bold"))


def _print_tool_call(
    out: Console, call: message_pb2.ToolCallPart, conversation_id: str, where: str = ""
) -> None:
    if call.provider_executed:  # a server tool, a Responses built-in: the provider ran it
        line = call_line(call.tool_name, input_json(call))
        line.append(" (run by the provider)", style="dim")
        out.print(line, soft_wrap=True)
        if call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
            out.print(result_line(call.tool_name, tool_call_output_json(call)), soft_wrap=True)
        elif call.state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
            out.print(error_line(call.tool_name, call.error_text), soft_wrap=True)
        else:
            out.print(Text(f"← {call.tool_name}: (no result from the provider)", style="dim"), soft_wrap=True)
        return
    if call.input_json or call.HasField("input"):
        out.print(call_line(call.tool_name, input_json(call)), soft_wrap=True)
    elif call.raw_input:  # not a JSON object, or cut off while it streamed
        out.print(call_line(call.tool_name, short(call.raw_input), style="red"), soft_wrap=True)
    else:  # the turn stopped before any of the input arrived
        out.print(call_line(call.tool_name, "(input not received)", style="dim"), soft_wrap=True)
    state = call.state
    if state == message_pb2.TOOL_CALL_STATE_OUTPUT_AVAILABLE:
        line = result_line(call.tool_name, tool_call_output_json(call), call.decision)
        if call.preliminary:
            line.append(" (preliminary)", style="dim")
        out.print(line, soft_wrap=True)
    elif state == message_pb2.TOOL_CALL_STATE_OUTPUT_ERROR:
        out.print(error_line(call.tool_name, call.error_text), soft_wrap=True)
    elif state == message_pb2.TOOL_CALL_STATE_OUTPUT_DENIED:
        out.print(denied_line(call.tool_name, call.approval.reason), soft_wrap=True)
    elif state == message_pb2.TOOL_CALL_STATE_APPROVAL_REQUESTED:
        hint = approval_hint(conversation_id, call.tool_call_id, where)
        out.print(Text(f"? {call.tool_name} awaits approval{hint}", style="yellow"), soft_wrap=True)
    elif state == message_pb2.TOOL_CALL_STATE_APPROVAL_RESPONDED:
        # Answered without a continuation (a client's auto_continue=false): `approve` would be
        # TOOL_CALL_NOT_PENDING; the next turn runs an approved call first (docs/semantics.md §6).
        hint = responded_hint(conversation_id, where)
        out.print(Text(f"? {call.tool_name} {hint}", style="yellow"), soft_wrap=True)
    else:
        out.print(Text(f"← {call.tool_name}: (no result)", style="dim"), soft_wrap=True)
