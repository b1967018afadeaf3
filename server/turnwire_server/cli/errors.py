"""Errors in the CLI's terms: a refused call, an unreachable sidecar, a provider error's class.

The sidecar's messages are written for API clients; a message naming an RPC the CLI has a
command for names the command instead (:func:`cli_terms`).
"""

from __future__ import annotations

import re

import grpc
from rich.console import Console
from rich.text import Text

from turnwire_client import TlsMismatchError, TurnwireError
from turnwire_client.tls_mismatch import TlsFixes
from turnwire_server.cli.connection import Connection
from turnwire_server.cli.exit_codes import EXIT_CALL_FAILED, EXIT_UNREACHABLE

__all__ = ["CLI_FIXES", "cli_terms", "error_class", "print_call_error"]


def error_class(kind: str) -> str:
    """A provider error's fine class (``ErrorInfo.metadata["provider_error_class"]``) as
    ``coarse: fine``, the coarse name being the one the sidecar logs (``classification=``)."""
    from turnwire.error_classes import COARSE

    coarse = COARSE.get(kind)  # type: ignore[call-overload]
    return kind if coarse is None or coarse == kind else f"{coarse}: {kind}"


CLI_FIXES = TlsFixes(
    who="this command",
    use_tls="pass --tls-ca CA_FILE (or --tls when a public CA signed its certificate)",
    add_certificate="pass --tls-cert CERT_FILE --tls-key KEY_FILE",
    drop_tls="leave out --tls and the --tls-* options",
)
"""A TLS mismatch's fixes in the CLI's options (the client library finds the mismatch and says
it in its own arguments: :class:`~turnwire_client.errors.TlsMismatchError`)."""


def print_call_error(
    out: Console,
    connection: Connection,
    error: TurnwireError,
    *,
    mid_turn: bool = False,
    follow_up: str = "",
) -> int:
    """Print the ``error`` a call to the sidecar of ``connection`` ended with on ``out``, and
    return the exit code: :data:`EXIT_UNREACHABLE` when the sidecar cannot be reached (``mid_turn``:
    the connection was lost during a turn, and ``follow_up`` says how to follow the turn again; a
    TLS mismatch the client found, :class:`~turnwire_client.errors.TlsMismatchError`, is said in
    the CLI's options), else :data:`EXIT_CALL_FAILED`
    (code, reason, message and field violations, in the CLI's terms)."""
    target = connection.target
    if error.code == grpc.StatusCode.UNAVAILABLE and not error.reason:
        transport = error.message
        if isinstance(error, TlsMismatchError):
            problem = error.mismatch.explain(target, CLI_FIXES)
            transport = error.transport_message
        elif mid_turn:
            problem = f"lost the connection to the sidecar at {target}"
        else:
            problem = f"cannot reach the sidecar at {target}: is `turnwire serve` running?"
        out.print(Text(problem, style="bold red"), soft_wrap=True)
        if transport:
            out.print(Text(f"  ({transport})", style="dim"), soft_wrap=True)
        if mid_turn and follow_up:
            out.print(Text(follow_up, style="yellow"), soft_wrap=True, highlight=False)
        return EXIT_UNREACHABLE
    head = Text()
    head.append(error.code.name, style="bold red")
    if error.reason:
        head.append(f" [{error.reason}]", style="red")
    head.append(f": {cli_terms(error.message)}")
    out.print(head, soft_wrap=True, highlight=False)
    for field_path, description in error.field_violations:
        if error.message in (description, f"{field_path}: {description}"):
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
