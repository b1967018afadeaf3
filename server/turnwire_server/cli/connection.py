"""The connection options of the client commands (``--target``, ``--token``, ``--tls*``), declared once.

Typer has no option groups, so each option is one :class:`_ConnectionOption` from which both of
its declarations are made: after the command name (:func:`client_command` adds the seven to each
client command, so that ``-h`` lists them and ``TURNWIRE_*`` variables fill them) and before it
(:func:`options_before_command` adds them to the group: ``turnwire --target HOST:PORT chat …``).
Each one given after the command wins; else the one given before it; else the command's own
value (its variable or default): flags win over variables, and both positions mean the same.
"""

from __future__ import annotations

import inspect
import shutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

if TYPE_CHECKING:  # imported when used: `turnwire serve` and `config show` need no client
    from turnwire_client import TlsOptions, TurnwireClient

__all__ = [
    "CLIENT_COMMANDS",
    "DEFAULT_TARGET",
    "Connection",
    "ConnectionOptions",
    "check_target",
    "client_command",
    "options_before_command",
]

CLIENT_COMMANDS = (
    "chat",
    "continue",
    "cancel",
    "approve",
    "resume",
    "conversations",
    "history",
    "fork",
    "schedule",
    "webhooks",
    "health",
)
"""The commands that connect to a sidecar: they take the connection options, after the command or
before it (``turnwire --target HOST:PORT chat …``). A group (``schedule``, ``webhooks``) stands for
its subcommands, every one of which connects."""


DEFAULT_TARGET = "127.0.0.1:50051"


def command_name() -> str:
    """How to run this program again from where it was started, for the commands the CLI prints as
    hints: ``turnwire`` when that name on the ``PATH`` is this program, else the path it was started
    by (``make demo`` and a checkout run ``.venv/bin/turnwire``, which a fresh shell does not find as
    ``turnwire``); ``turnwire`` when it was not started as ``turnwire`` at all (``python -m
    turnwire_server``)."""
    invoked = Path(sys.argv[0])
    if invoked.name != "turnwire":
        return "turnwire"
    found = shutil.which("turnwire")
    if found is not None and Path(found).resolve() == invoked.resolve():
        return "turnwire"
    return sys.argv[0]


def target_flag(target: str) -> str:
    """`` --target TARGET`` for a command printed as a hint, empty for the default target (a
    command without it would reach another sidecar)."""
    return "" if target == DEFAULT_TARGET else f" --target {target}"


"""The sidecar the client commands connect to when no ``--target`` or ``TURNWIRE_TARGET`` says."""


class Connection(NamedTuple):
    """Where and how a client command connects: ``target`` HOST:PORT, ``tls`` (None: plaintext),
    ``token`` (None: no bearer token)."""

    target: str
    tls: TlsOptions | None = None
    token: str | None = None

    def client(self, **options: Any) -> TurnwireClient:
        """A client for this sidecar (``options``: :class:`turnwire_client.TurnwireClient`'s
        others, e.g. ``include_progress``); use it as an async context manager."""
        from turnwire_client import TurnwireClient

        return TurnwireClient(self.target, tls=self.tls, token=self.token, **options)


@dataclass(frozen=True)
class ConnectionOptions:
    """The seven connection options of one client command as given: after the command name, else
    before it, else by a ``TURNWIRE_*`` variable, else by default. :meth:`connection` checks them."""

    target: str
    token: str | None
    tls: bool
    tls_ca: Path | None
    tls_cert: Path | None
    tls_key: Path | None
    tls_server_name: str | None

    def connection(self) -> Connection:
        """Where and how to connect; exits 2 when only one of --tls-cert and --tls-key is given."""
        from turnwire_client import TlsOptions

        tls = None
        if self.tls or any(
            value is not None for value in (self.tls_ca, self.tls_cert, self.tls_key, self.tls_server_name)
        ):
            try:
                tls = TlsOptions(
                    ca_file=self.tls_ca,
                    cert_file=self.tls_cert,
                    key_file=self.tls_key,
                    server_name=self.tls_server_name,
                )
            except ValueError:
                typer.echo("turnwire: --tls-cert and --tls-key go together (mutual TLS): give both", err=True)
                raise typer.Exit(2) from None
        return Connection(self.target, tls, self.token)


def check_target(value: str | None) -> str | None:
    """``--target``: HOST:PORT with a port of 0-65535 (gRPC would wrap 99999 to another port),
    or any other gRPC target scheme (``unix:PATH``, ``dns:///…``) as given."""
    if value is None:
        return None
    if ":" in value and not value.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")):
        port = value.rpartition(":")[2]
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise typer.BadParameter(f"{value!r} needs a port of 0-65535, e.g. 127.0.0.1:50051")
    return value


_TLS_FILE = {"exists": True, "dir_okay": False, "readable": True, "rich_help_panel": "TLS"}


@dataclass(frozen=True)
class _ConnectionOption:
    """One connection option. ``help`` is its text on a client command's ``-h``; ``what`` on the
    top-level ``-h`` (with ", for the client commands." and ``envvar``, which only the commands
    read, so that a bad value cannot stop ``serve``); ``click`` holds what both declarations share."""

    name: str
    flags: tuple[str, ...]
    type: Any
    default: Any
    help: str
    what: str
    envvar: str | None = None
    click: Mapping[str, Any] = field(default_factory=dict)
    panel: bool = False  # the commands list it under TLS (the group does only for file options)

    def after_command(self) -> inspect.Parameter:
        """Its declaration on a client command."""
        settings: dict[str, Any] = {"envvar": self.envvar, "help": self.help, **self.click}
        if self.default is None:
            settings["show_default"] = False
        if self.panel:
            settings["rich_help_panel"] = "TLS"
        return _keyword(self.name, Annotated[self.type, _option(*self.flags, **settings)], self.default)

    def before_command(self) -> inspect.Parameter:
        """Its declaration on the group (before the command name), without a variable."""
        for_clients = f"{self.what}, for the client commands."
        settings: dict[str, Any] = {
            "help": for_clients if self.envvar is None else f"{for_clients}  [env var: {self.envvar}]",
            **self.click,
        }
        if self.type is bool:
            return _keyword(self.name, Annotated[bool, _option(*self.flags, **settings)], False)
        settings["show_default"] = False
        return _keyword(self.name, Annotated[self.type | None, _option(*self.flags, **settings)], None)


_option: Callable[..., Any] = typer.Option
"""``typer.Option``, called with settings built per option (its overloads cannot type them)."""


def _keyword(name: str, annotation: Any, default: Any) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


_OPTIONS = (
    _ConnectionOption(
        "target",
        ("--target", "-t"),
        str,
        DEFAULT_TARGET,
        "Sidecar address HOST:PORT.",
        "Sidecar address HOST:PORT",
        "TURNWIRE_TARGET",
        {"callback": check_target},
    ),
    _ConnectionOption(
        "token",
        ("--token",),
        str | None,
        None,
        "Bearer token for a sidecar with auth: on (prefer the TURNWIRE_TOKEN variable).",
        "Bearer token",
        "TURNWIRE_TOKEN",
    ),
    _ConnectionOption(
        "tls",
        ("--tls",),
        bool,
        False,
        "Connect with TLS, trusting the system's root certificates (implied by any --tls-* option).",
        "Connect with TLS",
        panel=True,
    ),
    _ConnectionOption(
        "tls_ca",
        ("--tls-ca",),
        Path | None,
        None,
        "PEM CA certificate(s) to trust for the sidecar's certificate.",
        "PEM CA certificate(s)",
        "TURNWIRE_TLS_CA",
        _TLS_FILE,
    ),
    _ConnectionOption(
        "tls_cert",
        ("--tls-cert",),
        Path | None,
        None,
        "PEM client certificate, for a sidecar that requires one (mutual TLS); with --tls-key.",
        "PEM client certificate",
        "TURNWIRE_TLS_CERT",
        _TLS_FILE,
    ),
    _ConnectionOption(
        "tls_key",
        ("--tls-key",),
        Path | None,
        None,
        "Unencrypted PEM key of --tls-cert.",
        "PEM key of --tls-cert",
        "TURNWIRE_TLS_KEY",
        _TLS_FILE,
    ),
    _ConnectionOption(
        "tls_server_name",
        ("--tls-server-name",),
        str | None,
        None,
        "Name the sidecar's certificate must carry, when not the --target host.",
        "Name the sidecar's certificate must carry",
        "TURNWIRE_TLS_SERVER_NAME",
        panel=True,
    ),
)
"""The seven options, in the order the top-level ``-h`` lists them."""

_FLAGS = {option.name: option.flags[0] for option in _OPTIONS}


def _as_typer_sees(
    wrapper: Callable[..., None], wrapped: Callable[..., None], parameters: list[inspect.Parameter]
) -> Callable[..., None]:
    """``wrapper`` named and documented as ``wrapped``, with the signature typer reads its
    arguments and options from: the context (``ctx``), then ``parameters``."""
    wrapper.__name__, wrapper.__qualname__ = wrapped.__name__, wrapped.__qualname__
    wrapper.__module__, wrapper.__doc__ = wrapped.__module__, wrapped.__doc__
    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    wrapper.__signature__ = inspect.Signature([context, *parameters])  # type: ignore[attr-defined]
    return wrapper


def client_command(run: Callable[..., None]) -> Callable[..., None]:
    """A client command from ``run``, which declares a keyword-only ``sidecar: ConnectionOptions``
    where its ``-h`` lists ``--target``. The command typer sees takes the seven options instead
    (``--target`` there; the TLS options and ``--token`` after ``run``'s own, as ``-h`` lists
    them) and calls ``run`` with them, merged with those given before the command name. Name and
    help text are ``run``'s."""
    own = list(inspect.signature(run, eval_str=True).parameters.values())
    at = [parameter.name for parameter in own].index("sidecar")
    target, token, *tls = (option.after_command() for option in _OPTIONS)

    def command(ctx: typer.Context, **values: Any) -> None:
        after = {name: values.pop(name) for name in _FLAGS}
        run(**values, sidecar=_merged(ctx, after))

    return _as_typer_sees(command, run, [*own[:at], target, *own[at + 1 :], *tls, token])


def options_before_command(callback: Callable[..., None]) -> Callable[..., None]:
    """The group's callback with the connection options before the command name after its own
    (``callback``'s); it keeps those given in ``ctx.obj`` for the client command. One before a
    command that does not connect to a sidecar is a usage error (exit status 2), not ignored."""
    own = list(inspect.signature(callback, eval_str=True).parameters.values())

    def group(ctx: typer.Context, **values: Any) -> None:
        given = {name: values[name] for name in _FLAGS if _on_command_line(ctx, name)}
        if given and ctx.invoked_subcommand not in CLIENT_COMMANDS:
            flags = ", ".join(_FLAGS[name] for name in given)
            typer.echo(
                f"turnwire: {flags}: connection options are for the commands that talk to a sidecar "
                f"({', '.join(CLIENT_COMMANDS)}), not {ctx.invoked_subcommand}",
                err=True,
            )
            raise typer.Exit(2)
        ctx.obj = given
        callback(**{name: value for name, value in values.items() if name not in _FLAGS})

    return _as_typer_sees(group, callback, [*own, *(option.before_command() for option in _OPTIONS)])


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether parameter ``name`` of ``ctx`` was given on the command line (not a variable or its
    default). By the source's name: typer may carry its own copy of click's enum."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _merged(ctx: typer.Context, after: Mapping[str, Any]) -> ConnectionOptions:
    """The connection options of the client command ``ctx`` runs, from its own (``after``): each
    one given after the command wins; else the one given before it (the group's, in ``ctx.obj``);
    else the command's own value (its ``TURNWIRE_*`` variable or default)."""
    before: dict[str, Any] = ctx.obj if isinstance(ctx.obj, dict) else {}
    return ConnectionOptions(
        **{
            name: (before[name] if name in before and not _on_command_line(ctx, name) else after[name])
            for name in _FLAGS
        }
    )
