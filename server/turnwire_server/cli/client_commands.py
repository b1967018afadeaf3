"""The commands that talk to a sidecar: ``chat``, ``continue``, ``approve``, ``cancel``,
``resume``, ``conversations``, ``history``, ``fork``, ``health``.

Each declares its own arguments and options and takes the connection options through
:func:`~turnwire_server.cli.connection.client_command`; the runners are imported when a command
runs, so that ``turnwire serve`` does not load the client.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Coroutine
from typing import Annotated, Any

import typer

from turnwire_server.cli.connection import ConnectionOptions, client_command

__all__ = ["approve", "cancel", "chat", "continue_", "conversations", "fork", "health", "history"]

ConversationArgument = Annotated[str, typer.Argument(metavar="CONVERSATION", help="Conversation id.")]
ModelOption = Annotated[str | None, typer.Option(help="Model for this turn, provider:model.")]
BudgetTokensOption = Annotated[
    int | None,
    typer.Option(
        "--budget-tokens",
        min=1,
        help="This turn's own budget in tokens (input plus output): lowers the configured turn budget, "
        "never raises it.",
    ),
]
BudgetUsdOption = Annotated[
    float | None,
    typer.Option(
        "--budget-usd",
        min=0,
        help="This turn's own budget in US dollars: lowers the configured turn budget, never raises it.",
    ),
]


@client_command
def chat(
    conversation: Annotated[
        str, typer.Argument(metavar="CONVERSATION", help="Conversation id (created on first use).")
    ],
    text: Annotated[
        str, typer.Argument(metavar="TEXT", help="The user message; - reads it from standard input.")
    ],
    *,
    sidecar: ConnectionOptions,
    model: ModelOption = None,
    body: Annotated[str | None, typer.Option(help="Per-turn JSON object for hooks.")] = None,
    budget_tokens: BudgetTokensOption = None,
    budget_usd: BudgetUsdOption = None,
) -> None:
    """Send one message and stream the reply.

    TEXT - reads the message from standard input (`git diff | turnwire chat c1 -`); an empty
    message is refused. Tool calls and their results are shown as they happen; on a terminal a
    spinner says what the turn waits for. Ctrl-C cancels the turn (the reply so far, if the model
    sent any, is stored) and exits 130. Errors go to stderr. Exit status 0 when the turn
    completed, 1 when it did not, 2 when the call was refused, 3 when the sidecar cannot be reached.
    --budget-tokens and --budget-usd give the turn a budget of its own (docs/cost.md, "Budgets"):
    a turn that meets it ends with BUDGET_EXHAUSTED, its reply so far stored.
    """
    from turnwire_server.cli.turns import run_chat

    text = _message_text(text)
    parsed_body = _body_object(body)
    budget = _budget(budget_tokens, budget_usd)
    turn = run_chat(sidecar.connection(), conversation, text, model=model, body=parsed_body, budget=budget)
    raise typer.Exit(_interruptible(turn))


def _message_text(text: str) -> str:
    """``text`` as given, or standard input when it is ``-``. Exits 2 (as for a refused call)
    when the message is blank: the server would refuse it (docs/semantics.md §1)."""
    if text == "-":
        text = sys.stdin.read()
    if not text.strip():
        typer.echo(
            "turnwire: the message is empty; give some text (or - to read it from standard input)", err=True
        )
        raise typer.Exit(2)
    return text


def _body_object(body: str | None) -> dict[str, Any] | None:
    """``--body`` parsed; exits 2 when it is not a JSON object."""
    if body is None:
        return None
    try:
        parsed = json.loads(body)
    except json.JSONDecodeError as error:
        typer.echo(f"turnwire: --body is not JSON: {error}", err=True)
        raise typer.Exit(2) from None
    if not isinstance(parsed, dict):
        typer.echo("turnwire: --body must be a JSON object", err=True)
        raise typer.Exit(2)
    return parsed


def _budget(tokens: int | None, usd: float | None) -> dict[str, float] | None:
    """``--budget-tokens`` and ``--budget-usd`` as the client's ``budget`` (None: neither given)."""
    budget: dict[str, float] = {}
    if tokens is not None:
        budget["max_tokens"] = tokens
    if usd is not None:
        budget["max_usd"] = usd
    return budget or None


def _interruptible(turn: Coroutine[Any, Any, int]) -> int:
    """Run a turn-rendering coroutine; Ctrl-C cancels it (the renderer says the turn was aborted)
    and gives exit status 130, as shells expect of SIGINT."""
    try:
        return asyncio.run(turn)
    except KeyboardInterrupt:
        return 130


@client_command
def continue_(
    conversation: ConversationArgument,
    *,
    sidecar: ConnectionOptions,
    model: ModelOption = None,
    budget_tokens: BudgetTokensOption = None,
    budget_usd: BudgetUsdOption = None,
) -> None:
    """Let the model continue after the last assistant message.

    Streams the continuation, a new assistant message, as chat does. When the last message is
    yours and has no reply yet (a turn cancelled before any), the model answers it instead (a turn
    on the history as it is). An empty conversation, or one ending in a system message, has
    nothing to continue: the turn ends SKIPPED (exit status 1). --budget-tokens and --budget-usd
    as for chat.
    """
    from turnwire_server.cli.turns import run_continue

    budget = _budget(budget_tokens, budget_usd)
    turn = run_continue(sidecar.connection(), conversation, model=model, budget=budget)
    raise typer.Exit(_interruptible(turn))


@client_command
def approve(
    conversation: ConversationArgument,
    tool_call_id: Annotated[
        str, typer.Argument(metavar="CALL_ID", help="The waiting call's id (chat and history show it).")
    ],
    *,
    deny: Annotated[bool, typer.Option("--deny", help="Deny the call instead of approving it.")] = False,
    model: Annotated[
        str | None, typer.Option(help="Model for the turn that goes on, provider:model.")
    ] = None,
    reason: Annotated[
        str | None, typer.Option(help="Why it was denied; the model is told (with --deny).")
    ] = None,
    sidecar: ConnectionOptions,
) -> None:
    """Approve or deny a tool call that awaits approval.

    An approved call runs first (before_tool_call still decides); a denied one reaches the model as
    denied, with --reason. The turn streams as chat does. Exit status 2 when the call is not
    waiting for approval (unknown id, already answered).
    """
    from turnwire_server.cli.turns import run_approval

    if reason is not None and not deny:
        typer.echo("turnwire: --reason is for --deny (an approved call needs none)", err=True)
        raise typer.Exit(2)
    connection = sidecar.connection()
    turn = run_approval(connection, conversation, tool_call_id, approved=not deny, reason=reason, model=model)
    raise typer.Exit(_interruptible(turn))


@client_command
def cancel(
    request_id: Annotated[
        str, typer.Argument(metavar="REQUEST_ID", help="The turn's request id (turnwire chat shows it).")
    ],
    *,
    sidecar: ConnectionOptions,
) -> None:
    """Cancel a running or queued turn by its request id.

    Exit status 1 when no turn with that id is running or queued.
    """
    from turnwire_server.cli.turns import run_cancel

    raise typer.Exit(asyncio.run(run_cancel(sidecar.connection(), request_id)))


@client_command
def resume(
    request_id: Annotated[
        str, typer.Argument(metavar="REQUEST_ID", help="The turn's request id (turnwire chat shows it).")
    ],
    *,
    after: Annotated[
        int, typer.Option(min=0, help="Show the events after this sequence number (0: all).")
    ] = 0,
    sidecar: ConnectionOptions,
) -> None:
    """Follow a turn by its request id, on any replica.

    Shows what it streamed, then the rest as it comes: for a turn started elsewhere, or one whose
    stream broke (a LEASE_LOST end says to follow it here). Ctrl-C stops following and leaves the
    turn running. Exit status as for chat; 2 when no such turn is known (or its events are past
    the retention).
    """
    from turnwire_server.cli.turns import run_resume

    raise typer.Exit(_interruptible(run_resume(sidecar.connection(), request_id, after=after)))


@client_command
def conversations(
    *,
    sidecar: ConnectionOptions,
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
) -> None:
    """List conversations, most recently updated first."""
    from turnwire_server.cli.history import run_conversations

    raise typer.Exit(asyncio.run(run_conversations(sidecar.connection(), limit=limit)))


@client_command
def history(conversation: ConversationArgument, *, sidecar: ConnectionOptions) -> None:
    """Print a conversation's stored messages."""
    from turnwire_server.cli.history import run_history

    raise typer.Exit(asyncio.run(run_history(sidecar.connection(), conversation)))


@client_command
def fork(
    conversation: ConversationArgument,
    message_id: Annotated[
        str,
        typer.Argument(metavar="MESSAGE_ID", help="The message to fork at (turnwire history shows the ids)."),
    ],
    *,
    new_id: Annotated[
        str, typer.Option("--as", help="The new conversation's id; default: one the server assigns.")
    ] = "",
    sidecar: ConnectionOptions,
) -> None:
    """Fork a conversation at one of its messages.

    The fork holds the messages up to and including MESSAGE_ID, shared with the source without a
    copy; later turns and edits on either side never show on the other. Prints the new id. To
    edit a message and regenerate, fork at the message before it, then chat on the fork.
    """
    from turnwire_server.cli.forks import run_fork

    raise typer.Exit(
        asyncio.run(run_fork(sidecar.connection(), conversation, message_id, new_conversation_id=new_id))
    )


@client_command
def health(
    *,
    sidecar: ConnectionOptions,
    service: Annotated[str, typer.Option(help="Service to ask about; empty: the whole server.")] = "",
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the answer.")] = 5.0,
) -> None:
    """Ask the gRPC health service; exit 0 only when SERVING.

    Prints SERVING, NOT_SERVING, SERVICE_UNKNOWN or unreachable. Exit status 0 only when
    SERVING, else 1 (as Docker HEALTHCHECK expects).
    """
    from turnwire_server.health_check import check_health

    connection = sidecar.connection()
    answer = check_health(connection.target, service, timeout, connection.tls, token=connection.token)
    typer.echo(answer.status)
    if answer.detail:
        typer.echo(f"turnwire: {answer.detail}", err=True)
    raise typer.Exit(answer.exit_code)
