"""The ``turnwire`` typer app: its global options and its commands, in the order ``-h`` lists them.

The commands live in :mod:`.server_commands` (they run here) and :mod:`.client_commands` (they
talk to a sidecar); the connection options those take before or after the command name are
declared once, in :mod:`.connection`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from turnwire_server.cli import client_commands, schedule_commands, server_commands
from turnwire_server.cli.connection import CLIENT_COMMANDS, options_before_command
from turnwire_server.cli.webhooks import webhooks_app

__all__ = ["app", "main"]

app = typer.Typer(
    name="turnwire",
    help="Turnwire: a gRPC sidecar that runs persisted, multi-step LLM chat turns.\n\n"
    f"The client commands ({', '.join(CLIENT_COMMANDS)}) take their "
    "connection options (--target, --token, --tls*) before or after the command name.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    # Plain click help: rich mode keeps docstrings' line breaks and labels flags <bool>.
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"turnwire {version('turnwire')}")
        raise typer.Exit()


@app.callback()
@options_before_command
def _main(
    *,
    _version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the installed version and exit.",
        ),
    ] = False,
) -> None:
    """Global options, before the command: ``--version``, and the client commands' connection
    options (:func:`~turnwire_server.cli.connection.options_before_command`)."""


app.command()(server_commands.serve)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(config_app, name="config")
config_app.command("show")(server_commands.config_show)
app.command()(server_commands.migrate)
app.command()(client_commands.chat)
app.command("continue")(client_commands.continue_)
app.command()(client_commands.approve)
app.command()(client_commands.cancel)
app.command()(client_commands.resume)
app.command()(client_commands.conversations)
app.command()(client_commands.history)
app.command()(client_commands.fork)
app.command()(client_commands.health)
app.add_typer(webhooks_app, name="webhooks")
app.command()(server_commands.demo)
app.add_typer(schedule_commands.schedule_app, name="schedule")


def main() -> None:
    """Console-script entry point (the package's ``__init__`` quiets gRPC's C core first)."""
    app()
