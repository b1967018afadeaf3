"""``turnwire fork``: a conversation forked from another at one of its messages (docs/forks.md)."""

from __future__ import annotations

from rich.console import Console
from rich.text import Text

from turnwire_client import TurnwireError
from turnwire_server.cli.connection import Connection
from turnwire_server.cli.errors import print_call_error
from turnwire_server.cli.exit_codes import EXIT_OK
from turnwire_server.cli.parts import or_stderr, plural

__all__ = ["run_fork"]


async def run_fork(
    connection: Connection,
    conversation_id: str,
    message_id: str,
    *,
    new_conversation_id: str = "",
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Fork ``conversation_id`` at ``message_id`` (into ``new_conversation_id``, a server id when
    empty) and print the new conversation's id, then what it holds. Exit codes as for
    :func:`~turnwire_server.cli.history.run_history` (a refused fork: the call's status)."""
    out = console if console is not None else Console()
    try:
        async with connection.client() as client:
            fork = await client.fork_conversation(
                conversation_id, message_id, new_conversation_id=new_conversation_id
            )
    except TurnwireError as error:
        return print_call_error(or_stderr(err_console), connection, error)
    out.print(Text(fork.conversation_id, style="bold"), soft_wrap=True, highlight=False)
    detail = f"{plural(fork.message_count, 'message')} shared with {conversation_id}, up to {message_id}"
    out.print(Text(detail, style="dim"), soft_wrap=True, highlight=False)
    return EXIT_OK
