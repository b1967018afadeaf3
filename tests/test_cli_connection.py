"""The client commands' connection options, declared once (``turnwire_server.cli.connection``):
every client command takes the same seven, before or after its name; after the name wins over
before it, before it over the ``TURNWIRE_*`` variables, the variables over the defaults."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from turnwire_server.cli import app
from turnwire_server.cli.connection import (
    CLIENT_COMMANDS,
    ConnectionOptions,
    client_command,
    options_before_command,
)

DOCS = Path(__file__).resolve().parents[1] / "docs"
SEVEN = {"--target", "--token", "--tls", "--tls-ca", "--tls-cert", "--tls-key", "--tls-server-name"}


def _options(command: Any) -> set[str]:
    """The connection flags among a (typer's) click command's options."""
    return {flag for param in command.params for flag in param.opts if flag in SEVEN}


def test_every_client_command_and_the_group_take_the_seven_options() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    assert _options(group) == SEVEN
    for name in CLIENT_COMMANDS:
        command = group.commands[name]
        if isinstance(command, typer.core.TyperGroup):  # a group: each of its subcommands connects
            assert command.commands, name
            for sub, subcommand in command.commands.items():
                assert _options(subcommand) == SEVEN, (name, sub)
        else:
            assert _options(command) == SEVEN, name
    for name in ("serve", "migrate", "demo"):
        assert not _options(group.commands[name]), name


def _seen_app(seen: list[ConnectionOptions]) -> typer.Typer:
    """An app with one client command, ``health``, that records the options it was given."""
    probe = typer.Typer()

    @probe.callback()
    @options_before_command
    def _main() -> None:
        pass

    @client_command
    def health(*, sidecar: ConnectionOptions) -> None:
        seen.append(sidecar)

    probe.command()(health)
    return probe


@pytest.mark.parametrize(
    ("args", "env", "target"),
    [
        (["health"], {}, "127.0.0.1:50051"),
        (["health"], {"TURNWIRE_TARGET": "e:1"}, "e:1"),
        (["--target", "b:2", "health"], {"TURNWIRE_TARGET": "e:1"}, "b:2"),
        (["--target", "b:2", "health", "-t", "a:3"], {"TURNWIRE_TARGET": "e:1"}, "a:3"),
        (["health", "--target", "a:3"], {}, "a:3"),
    ],
)
def test_after_the_name_wins_then_before_it_then_the_variable(
    args: list[str], env: dict[str, str], target: str
) -> None:
    seen: list[ConnectionOptions] = []
    result = CliRunner().invoke(_seen_app(seen), args, env={"TURNWIRE_TARGET": None, **env})
    assert result.exit_code == 0, result.output
    assert [options.target for options in seen] == [target]


def test_options_before_and_after_the_name_add_up(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("")
    seen: list[ConnectionOptions] = []
    args = ["--token", "before", "--tls-ca", str(ca), "health", "--tls-server-name", "sidecar"]
    result = CliRunner().invoke(_seen_app(seen), args, env={"TURNWIRE_TOKEN": "variable"})
    assert result.exit_code == 0, result.output
    [options] = seen
    assert (options.token, options.tls_ca, options.tls_server_name) == ("before", ca, "sidecar")


def _commands(
    group: typer.core.TyperGroup, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of ``group`` and its subgroups, with the words that run it (``("config", "show")``)."""
    for name, command in group.commands.items():
        yield (*prefix, name), command
        if isinstance(command, typer.core.TyperGroup):
            yield from _commands(command, (*prefix, name))


def test_client_commands_are_the_commands_that_connect_and_every_list_names_them() -> None:
    """CLIENT_COMMANDS (which admits the options before the command name), the top-level ``-h``
    and docs/getting-started.md name exactly the commands that take ``--target``."""
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    # A connecting subcommand counts by its top-level group (`schedule list` is `schedule`).
    connecting = {words[0] for words, command in _commands(group) if _options(command) == SEVEN}
    assert set(CLIENT_COMMANDS) == connecting
    top_help = CliRunner().invoke(app, ["--help"])
    assert top_help.exit_code == 0, top_help.output
    listed = re.search(r"client commands \(([^)]*)\)", " ".join(top_help.output.split()))
    assert listed is not None, top_help.output
    assert set(listed[1].split(", ")) == connecting
    guide = " ".join((DOCS / "getting-started.md").read_text().split())
    in_guide = re.search(r"The client commands \(([^)]*)\)", guide)
    assert in_guide is not None
    assert set(in_guide[1].replace("`", "").split(", ")) == connecting
    for name in connecting:
        assert f"turnwire {name} " in guide, f"docs/getting-started.md shows no `turnwire {name}` line"


def test_every_command_help_renders_without_rst_markup() -> None:
    """``-h`` shows docstrings and option help as written (plain click help): no reST ``double
    backticks`` or ``:role:`` markup may reach it."""
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    runner = CliRunner()
    for words in [(), *(words for words, _ in _commands(group))]:
        shown = runner.invoke(app, [*words, "--help"])
        assert shown.exit_code == 0, (words, shown.output)
        assert "``" not in shown.output, (words, shown.output)
        assert not re.search(r":(func|class|meth|mod|attr):`", shown.output), (words, shown.output)


def test_serve_help_names_its_exit_statuses() -> None:
    """``serve -h`` says what its exit statuses mean, as the client commands' help does: 2 for a
    configuration it refuses, 1 for a start that fails (a newcomer's script or supervisor tells the
    two apart)."""
    shown = CliRunner().invoke(app, ["serve", "--help"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.output.split())
    assert "Exit status 0 after a graceful stop, 2 for an invalid configuration" in text, text
    assert "1 when it cannot start" in text, text
