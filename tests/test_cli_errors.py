"""How the CLI prints a failed call (server/turnwire_server/cli/errors.py): a field violation the
message already says in full is not printed again; others are, under the message."""

from __future__ import annotations

import io

import grpc
from rich.console import Console

from turnwire_client import TurnwireError
from turnwire_server.cli.connection import Connection
from turnwire_server.cli.errors import print_call_error
from turnwire_server.cli.exit_codes import EXIT_CALL_FAILED


def printed(error: TurnwireError) -> tuple[int, list[str]]:
    buffer = io.StringIO()
    code = print_call_error(Console(file=buffer, width=200), Connection("127.0.0.1:50051"), error)
    return code, [line for line in buffer.getvalue().splitlines() if line.strip()]


def test_a_violation_the_message_already_says_is_printed_once() -> None:
    """Before: ``turnwire chat "bad id!" hi`` printed the violation a second time under the message."""
    description = "'bad id!' is not a valid id; use 1-128 characters of [A-Za-z0-9._:-]"
    error = TurnwireError(
        grpc.StatusCode.INVALID_ARGUMENT,
        f"conversation_id: {description}",
        reason="INVALID_FIELD",
        field_violations=[("conversation_id", description)],
    )
    code, lines = printed(error)
    assert code == EXIT_CALL_FAILED
    assert lines == [f"INVALID_ARGUMENT [INVALID_FIELD]: conversation_id: {description}"]


def test_violations_the_message_does_not_spell_out_are_listed() -> None:
    error = TurnwireError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "2 fields are invalid",
        field_violations=[("model", "unknown provider"), ("message.id", "too long")],
    )
    _, lines = printed(error)
    assert lines[1:] == ["  model: unknown provider", "  message.id: too long"]
