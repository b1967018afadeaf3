"""The ``turnwire`` command: ``serve`` the sidecar, ``migrate`` its store, ``chat`` with it,
``continue`` or ``cancel`` a turn, list ``conversations``, read ``history``, check its ``health``,
run the ``demo``, ``config show``; ``--version``."""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

if TYPE_CHECKING:
    from turnwire_client import TlsOptions

app = typer.Typer(
    name="turnwire",
    help="Turnwire: a gRPC sidecar that runs persisted, multi-step LLM chat turns.\n\n"
    "The client commands (chat, continue, approve, cancel, conversations, history, health) take their "
    "connection options (--target, --token, --tls*) before or after the command name.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    # Plain click help: rich mode keeps docstrings' line breaks and labels flags <bool>.
    rich_markup_mode=None,
)


def _check_target(value: str | None) -> str | None:
    """``--target``: HOST:PORT with a port of 0-65535 (gRPC would wrap 99999 to another port),
    or any other gRPC target scheme (``unix:PATH``, ``dns:///…``) as given."""
    if value is None:
        return None
    if ":" in value and not value.startswith(("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:", "vsock:")):
        port = value.rpartition(":")[2]
        if not port.isdigit() or not 0 <= int(port) <= 65535:
            raise typer.BadParameter(f"{value!r} needs a port of 0-65535, e.g. 127.0.0.1:50051")
    return value


# The connection options every client command declares (so `-h` lists them and TURNWIRE_* variables
# fill them); the command reads them through _connection(ctx), which adds those given before it.
TargetOption = Annotated[
    str,
    typer.Option(
        "--target",
        "-t",
        envvar="TURNWIRE_TARGET",
        callback=_check_target,
        help="Sidecar address HOST:PORT.",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="TURNWIRE_TOKEN",
        show_default=False,
        help="Bearer token for a sidecar with auth: on (prefer the TURNWIRE_TOKEN variable).",
    ),
]

# TLS towards the sidecar (its tls: section), for every command that connects to one.
_TLS_FILE = {"exists": True, "dir_okay": False, "readable": True, "rich_help_panel": "TLS"}
TlsOption = Annotated[
    bool,
    typer.Option(
        "--tls",
        help="Connect with TLS, trusting the system's root certificates (implied by any --tls-* option).",
        rich_help_panel="TLS",
    ),
]
TlsCaOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-ca",
        envvar="TURNWIRE_TLS_CA",
        help="PEM CA certificate(s) to trust for the sidecar's certificate.",
        **_TLS_FILE,
    ),
]
TlsCertOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-cert",
        envvar="TURNWIRE_TLS_CERT",
        help="PEM client certificate, for a sidecar that requires one (mutual TLS); with --tls-key.",
        **_TLS_FILE,
    ),
]
TlsKeyOption = Annotated[
    Path | None,
    typer.Option(
        "--tls-key", envvar="TURNWIRE_TLS_KEY", help="Unencrypted PEM key of --tls-cert.", **_TLS_FILE
    ),
]
TlsServerNameOption = Annotated[
    str | None,
    typer.Option(
        "--tls-server-name",
        envvar="TURNWIRE_TLS_SERVER_NAME",
        help="Name the sidecar's certificate must carry, when not the --target host.",
        rich_help_panel="TLS",
    ),
]


CLIENT_COMMANDS = ("chat", "continue", "cancel", "approve", "conversations", "history", "health")
"""The commands that connect to a sidecar: they take the connection options, after the command or
before it (``turnwire --target HOST:PORT chat …``)."""

_CONNECTION_FLAGS = {
    "target": "--target",
    "token": "--token",
    "tls": "--tls",
    "tls_ca": "--tls-ca",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "tls_server_name": "--tls-server-name",
}
"""The connection options (parameter name → flag), shared by the group and every client command."""


class Connection(NamedTuple):
    """Where and how a client command connects: ``target`` HOST:PORT, ``tls`` (None: plaintext),
    ``token`` (None: no bearer token)."""

    target: str
    tls: TlsOptions | None
    token: str | None


def _on_command_line(ctx: typer.Context, name: str) -> bool:
    """Whether parameter ``name`` of ``ctx`` was given on the command line (not a variable or its
    default). By the source's name: typer may carry its own copy of click's enum."""
    source = ctx.get_parameter_source(name)
    return source is not None and source.name == "COMMANDLINE"


def _connection(ctx: typer.Context) -> Connection:
    """The connection options of the client command ``ctx`` runs. Each one given after the command
    wins; else the one given before it (the group's, in ``ctx.obj``); else the command's own value
    (its ``TURNWIRE_*`` variable or default): flags win over variables, and both flag positions
    mean the same."""
    before: dict[str, Any] = ctx.obj if isinstance(ctx.obj, dict) else {}
    values = {
        name: (before[name] if name in before and not _on_command_line(ctx, name) else ctx.params[name])
        for name in _CONNECTION_FLAGS
    }
    tls = _tls_options(
        values["tls"], values["tls_ca"], values["tls_cert"], values["tls_key"], values["tls_server_name"]
    )
    return Connection(values["target"], tls, values["token"])


def _tls_options(
    tls: bool, ca: Path | None, cert: Path | None, key: Path | None, server_name: str | None
) -> TlsOptions | None:
    """The client's TLS options from the --tls* flags; None (plaintext) when none is given."""
    from turnwire_client import TlsOptions

    if not tls and ca is None and cert is None and key is None and server_name is None:
        return None
    try:
        return TlsOptions(ca_file=ca, cert_file=cert, key_file=key, server_name=server_name)
    except ValueError:
        typer.echo("turnwire: --tls-cert and --tls-key go together (mutual TLS): give both", err=True)
        raise typer.Exit(2) from None


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"turnwire {version('turnwire')}")
        raise typer.Exit()


_FOR_CLIENTS = ", for the client commands."


def _for_clients(what: str, envvar: str) -> str:
    """A group option's help: ``what``, for the client commands, and the variable that sets it
    (the group does not read it, so that a bad value cannot stop ``serve``; each client command
    does, and the top-level help must still name it)."""
    return f"{what}{_FOR_CLIENTS}  [env var: {envvar}]"


@app.callback()
def _main(
    ctx: typer.Context,
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
    target: Annotated[
        str | None,
        typer.Option(
            "--target",
            "-t",
            callback=_check_target,
            show_default=False,
            help=_for_clients("Sidecar address HOST:PORT", "TURNWIRE_TARGET"),
        ),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option("--token", show_default=False, help=_for_clients("Bearer token", "TURNWIRE_TOKEN")),
    ] = None,
    tls: Annotated[bool, typer.Option("--tls", help="Connect with TLS" + _FOR_CLIENTS)] = False,
    tls_ca: Annotated[
        Path | None,
        typer.Option("--tls-ca", help=_for_clients("PEM CA certificate(s)", "TURNWIRE_TLS_CA"), **_TLS_FILE),
    ] = None,
    tls_cert: Annotated[
        Path | None,
        typer.Option(
            "--tls-cert", help=_for_clients("PEM client certificate", "TURNWIRE_TLS_CERT"), **_TLS_FILE
        ),
    ] = None,
    tls_key: Annotated[
        Path | None,
        typer.Option(
            "--tls-key", help=_for_clients("PEM key of --tls-cert", "TURNWIRE_TLS_KEY"), **_TLS_FILE
        ),
    ] = None,
    tls_server_name: Annotated[
        str | None,
        typer.Option(
            "--tls-server-name",
            show_default=False,
            help=_for_clients("Name the sidecar's certificate must carry", "TURNWIRE_TLS_SERVER_NAME"),
        ),
    ] = None,
) -> None:
    """Global options, before the command: ``--version``, and the client commands' connection
    options (kept in ``ctx.obj`` for :func:`_connection`); a connection option before a command
    that does not connect to a sidecar is a usage error (exit status 2), not ignored."""
    given = {name: ctx.params[name] for name in _CONNECTION_FLAGS if _on_command_line(ctx, name)}
    if given and ctx.invoked_subcommand not in CLIENT_COMMANDS:
        flags = ", ".join(_CONNECTION_FLAGS[name] for name in given)
        typer.echo(
            f"turnwire: {flags}: connection options are for the commands that talk to a sidecar "
            f"({', '.join(CLIENT_COMMANDS)}), not {ctx.invoked_subcommand}",
            err=True,
        )
        raise typer.Exit(2)
    ctx.obj = given


@app.command()
def serve(
    listen: Annotated[
        str | None,
        typer.Option(
            help="Address to listen on, HOST:PORT. Default: $TURNWIRE_LISTEN, else listen: in the "
            "config, else 127.0.0.1:50051."
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="TURNWIRE_CONFIG", help="YAML configuration file."),
    ] = None,
    store: Annotated[
        str | None,
        typer.Option(
            help="Store URL: sqlite:///PATH or postgresql://... Default: $TURNWIRE_STORE__URL, else "
            "store.url in the config, else sqlite:///turnwire.db."
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=256,
            show_default=False,
            help="Processes serving the one port (SO_REUSEPORT), under a supervisor that restarts a "
            "worker that dies and serves the metrics of all. More than 1 needs the PostgreSQL store. "
            "Default: $TURNWIRE_WORKERS, else workers: in the config, else 1.",
        ),
    ] = None,
) -> None:
    """Run the sidecar until SIGTERM or SIGINT.

    It then stops gracefully and exits 0.

    Every setting also comes from TURNWIRE_* variables, sections joined by __ (TURNWIRE_LIMITS__MAX_STEPS=20).

    Flags win over variables, variables over the config file.

    With --workers N each worker gets the signal and stops so; exit 1 if one cannot start or keeps dying.
    """
    import os

    # gRPC's C core logs connection events (a client's GOAWAY) at info in its own format, outside
    # logging.level; read when grpc is first imported (below, and in each worker).
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    settings = _load(config, listen, store, workers)
    from turnwire_server.logs import configure_logging
    from turnwire_server.redaction import Redactor, secret_values

    configure_logging(settings.logging.level, settings.logging.format, Redactor(secret_values(settings)))
    if settings.log_level is not None:
        logging.getLogger("turnwire.server").warning(
            "log_level is deprecated: use logging.level (TURNWIRE_LOGGING__LEVEL)"
        )
    for warning in _unknown_variables():
        logging.getLogger("turnwire.server").warning("%s", warning)
    if settings.workers > 1:
        _supervise(settings)
        return
    from turnwire_server.app import StartupError
    from turnwire_server.app import serve as run_server
    from turnwire_server.event_loop import EventLoopUnavailable, run

    try:
        run(run_server(settings), settings.event_loop)
    except (StartupError, EventLoopUnavailable) as error:
        typer.echo(f"turnwire: cannot start: {error}", err=True)
        raise typer.Exit(1) from None


def _unknown_variables() -> list[str]:
    """Warnings for TURNWIRE_* variables that name no setting (a misspelt one is otherwise ignored)."""
    import os

    from turnwire_server.config import Settings
    from turnwire_server.config_hints import unknown_variables

    return unknown_variables(os.environ, Settings)


def _supervise(settings: Any) -> None:
    """``serve --workers N`` (N > 1): the supervisor (:mod:`turnwire_server.supervisor`)."""
    from turnwire_server.supervisor import SupervisorError, supervise

    try:
        code = asyncio.run(supervise(settings))
    except SupervisorError as error:
        typer.echo(f"turnwire: cannot start: {error}", err=True)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def _load(
    config: Path | None, listen: str | None = None, store: str | None = None, workers: int | None = None
) -> Any:
    """The settings ``serve`` runs with (flags, environment, file, defaults); exits 2 when invalid."""
    from turnwire_server.config import ConfigError, load_settings

    overrides: dict[str, Any] = {"listen": listen, "workers": workers}
    if store is not None:
        overrides["store"] = {"url": store}
    try:
        return load_settings(config, **overrides)
    except ConfigError as error:
        typer.echo(f"turnwire: {error}", err=True)
        raise typer.Exit(2) from None


config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(
    listen: Annotated[str | None, typer.Option(help="As serve's --listen.")] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML configuration file.")] = None,
    store: Annotated[str | None, typer.Option(help="As serve's --store.")] = None,
) -> None:
    """Print the effective configuration as YAML, secrets masked.

    The configuration serve would load (flags, TURNWIRE_* variables, the file, defaults), with
    secrets shown as ***. Exit status 2 when it is invalid.
    """
    import yaml

    from turnwire_server.redaction import redacted_settings

    settings = _load(config, listen, store)
    for warning in _unknown_variables():
        typer.echo(f"turnwire: warning: {warning}", err=True)
    shown = redacted_settings(settings)
    if shown.get("log_level") is None:
        shown.pop("log_level", None)  # the deprecated spelling, shown only when it is set
    typer.echo(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True), nl=False)


@app.command()
def migrate(
    store_url: Annotated[
        str | None,
        typer.Option("--store-url", "--store", help="Store URL; default: the configured store.url."),
    ] = None,
    config: Annotated[Path | None, typer.Option("--config", "-c", help="YAML configuration file.")] = None,
    copy_from: Annotated[
        str | None, typer.Option("--from", help="Copy everything from this sqlite:/// store ...")
    ] = None,
    copy_to: Annotated[
        str | None, typer.Option("--to", help="... into this empty postgresql:// store.")
    ] = None,
) -> None:
    """Apply schema migrations, or copy SQLite to PostgreSQL.

    Applies the store's pending schema migrations, prints each one applied, and exits. With
    --from sqlite:///PATH --to postgresql://...: copies an SQLite store (stopped) into an empty
    PostgreSQL database instead, for a sidecar that outgrew one process.

    Exit status 0 when the schema is current afterwards (or the copy landed), 1 when the store
    cannot be migrated (or copied: nothing is copied then), 2 for an invalid configuration.
    """
    if copy_from is not None or copy_to is not None:
        _copy_store(copy_from, copy_to)
        return
    from pydantic import ValidationError

    from turnwire_server.config import ConfigError, StoreSettings, load_settings
    from turnwire_server.migrate import migrate_store
    from turnwire_server.store import StoreError, redact_url

    try:
        settings = load_settings(config)
    except ConfigError as error:
        typer.echo(f"turnwire: {error}", err=True)
        raise typer.Exit(2) from None
    store_settings = settings.store
    if store_url is not None:
        try:
            store_settings = StoreSettings.model_validate({**store_settings.model_dump(), "url": store_url})
        except ValidationError as error:  # its text would quote the URL, password included
            reasons = "; ".join(item["msg"] for item in error.errors())
            typer.echo(f"turnwire: --store-url {redact_url(store_url)}: {reasons}", err=True)
            raise typer.Exit(2) from None
    shown = redact_url(store_settings.url)
    try:
        applied = asyncio.run(
            migrate_store(
                store_settings.url,
                pool_size=store_settings.pool_size,
                password_env=store_settings.password_env,
            )
        )
    except (StoreError, ValueError) as error:
        typer.echo(f"turnwire: cannot migrate {shown}: {error}", err=True)
        raise typer.Exit(1) from None
    for name in applied:
        typer.echo(f"applied {name}")
    typer.echo(f"{shown}: {len(applied)} migration(s) applied; the schema is current")


def _copy_store(source: str | None, target: str | None) -> None:
    from turnwire_server.migrate import copy_sqlite_to_postgres
    from turnwire_server.store import StoreError, redact_url

    if source is None or target is None:
        typer.echo("turnwire: give both --from sqlite:///PATH and --to postgresql://…", err=True)
        raise typer.Exit(2)
    try:
        copied = asyncio.run(copy_sqlite_to_postgres(source, target))
    except (StoreError, ValueError) as error:
        typer.echo(f"turnwire: cannot copy {source} to {redact_url(target)}: {error}", err=True)
        raise typer.Exit(1) from None
    for table, rows in copied.items():
        typer.echo(f"copied {rows} {table}")
    typer.echo(f"{source} -> {redact_url(target)}: copied; serve it with --store {redact_url(target)}")


@app.command()
def chat(
    ctx: typer.Context,
    conversation: Annotated[
        str, typer.Argument(metavar="CONVERSATION", help="Conversation id (created on first use).")
    ],
    text: Annotated[
        str, typer.Argument(metavar="TEXT", help="The user message; - reads it from standard input.")
    ],
    *,
    target: TargetOption = "127.0.0.1:50051",
    model: Annotated[str | None, typer.Option(help="Model for this turn, provider:model.")] = None,
    body: Annotated[str | None, typer.Option(help="Per-turn JSON object for hooks.")] = None,
    tls: TlsOption = False,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_server_name: TlsServerNameOption = None,
    token: TokenOption = None,
) -> None:
    """Send one message and stream the reply.

    TEXT - reads the message from standard input (`git diff | turnwire chat c1 -`); an empty
    message is refused. Tool calls and their results are shown as they happen; on a terminal a
    spinner says what the turn waits for. Ctrl-C cancels the turn (the reply so far, if the model
    sent any, is stored) and exits 130. Errors go to stderr. Exit status 0 when the turn
    completed, 1 when it did not, 2 when the call was refused, 3 when the sidecar cannot be reached.
    """
    from turnwire_server.console import run_chat

    text = _message_text(text)

    parsed_body = None
    if body is not None:
        try:
            parsed_body = json.loads(body)
        except json.JSONDecodeError as error:
            typer.echo(f"turnwire: --body is not JSON: {error}", err=True)
            raise typer.Exit(2) from None
        if not isinstance(parsed_body, dict):
            typer.echo("turnwire: --body must be a JSON object", err=True)
            raise typer.Exit(2)
    connection = _connection(ctx)
    raise typer.Exit(
        _interruptible(
            run_chat(
                connection.target,
                conversation,
                text,
                model=model,
                body=parsed_body,
                tls=connection.tls,
                token=connection.token,
            )
        )
    )


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


def _interruptible(turn: Coroutine[Any, Any, int]) -> int:
    """Run a turn-rendering coroutine; Ctrl-C cancels it (the renderer says the turn was aborted)
    and gives exit status 130, as shells expect of SIGINT."""
    try:
        return asyncio.run(turn)
    except KeyboardInterrupt:
        return 130


@app.command("continue")
def continue_(
    ctx: typer.Context,
    conversation: Annotated[str, typer.Argument(metavar="CONVERSATION", help="Conversation id.")],
    *,
    target: TargetOption = "127.0.0.1:50051",
    model: Annotated[str | None, typer.Option(help="Model for this turn, provider:model.")] = None,
    tls: TlsOption = False,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_server_name: TlsServerNameOption = None,
    token: TokenOption = None,
) -> None:
    """Let the model continue after the last assistant message.

    Streams the continuation, a new assistant message, as chat does. When the last message is
    yours and has no reply yet (a turn cancelled before any), the model answers it instead (a turn
    on the history as it is). An empty conversation, or one ending in a system message, has
    nothing to continue: the turn ends SKIPPED (exit status 1).
    """
    from turnwire_server.console import run_continue

    connection = _connection(ctx)
    raise typer.Exit(
        _interruptible(
            run_continue(
                connection.target, conversation, model=model, tls=connection.tls, token=connection.token
            )
        )
    )


@app.command()
def approve(
    ctx: typer.Context,
    conversation: Annotated[str, typer.Argument(metavar="CONVERSATION", help="Conversation id.")],
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
    target: TargetOption = "127.0.0.1:50051",
    tls: TlsOption = False,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_server_name: TlsServerNameOption = None,
    token: TokenOption = None,
) -> None:
    """Approve or deny a tool call that awaits approval.

    An approved call runs first (before_tool_call still decides); a denied one reaches the model as
    denied, with --reason. The turn streams as chat does. Exit status 2 when the call is not
    waiting for approval (unknown id, already answered).
    """
    from turnwire_server.console import run_approval

    if reason is not None and not deny:
        typer.echo("turnwire: --reason is for --deny (an approved call needs none)", err=True)
        raise typer.Exit(2)
    connection = _connection(ctx)
    raise typer.Exit(
        _interruptible(
            run_approval(
                connection.target,
                conversation,
                tool_call_id,
                approved=not deny,
                reason=reason,
                model=model,
                tls=connection.tls,
                token=connection.token,
            )
        )
    )


@app.command()
def cancel(
    ctx: typer.Context,
    request_id: Annotated[
        str, typer.Argument(metavar="REQUEST_ID", help="The turn's request id (turnwire chat shows it).")
    ],
    *,
    target: TargetOption = "127.0.0.1:50051",
    tls: TlsOption = False,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_server_name: TlsServerNameOption = None,
    token: TokenOption = None,
) -> None:
    """Cancel a running or queued turn by its request id.

    Exit status 1 when no turn with that id is running or queued.
    """
    from turnwire_server.console import run_cancel

    connection = _connection(ctx)
    raise typer.Exit(
        asyncio.run(run_cancel(connection.target, request_id, tls=connection.tls, token=connection.token))
    )


@app.command()
def conversations(
    ctx: typer.Context,
    *,
    target: TargetOption = "127.0.0.1:50051",
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
    tls: TlsOption = False,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_server_name: TlsServerNameOption = None,
    token: TokenOption = None,
) -> None:
    """List conversations, most recently updated first."""
    from turnwire_server.console import run_conversations

    connection = _connection(ctx)
    raise typer.Exit(
        asyncio.run(
            run_conversations(connection.target, limit=limit, tls=connection.tls, token=connection.token)
        )
    )


@app.command()
def history(
    ctx: typer.Context,
    conversation: Annotated[str, typer.Argument(metavar="CONVERSATION", help="Conversation id.")],
    *,
    target: TargetOption = "127.0.0.1:50051",
    tls: TlsOption = False,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_server_name: TlsServerNameOption = None,
    token: TokenOption = None,
) -> None:
    """Print a conversation's stored messages."""
    from turnwire_server.console import run_history

    connection = _connection(ctx)
    raise typer.Exit(
        asyncio.run(run_history(connection.target, conversation, tls=connection.tls, token=connection.token))
    )


@app.command()
def health(
    ctx: typer.Context,
    *,
    target: TargetOption = "127.0.0.1:50051",
    service: Annotated[str, typer.Option(help="Service to ask about; empty: the whole server.")] = "",
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for the answer.")] = 5.0,
    tls: TlsOption = False,
    tls_ca: TlsCaOption = None,
    tls_cert: TlsCertOption = None,
    tls_key: TlsKeyOption = None,
    tls_server_name: TlsServerNameOption = None,
    token: TokenOption = None,
) -> None:
    """Ask the gRPC health service; exit 0 only when SERVING.

    Prints SERVING, NOT_SERVING, SERVICE_UNKNOWN or unreachable. Exit status 0 only when
    SERVING, else 1 (as Docker HEALTHCHECK expects).
    """
    from turnwire_server.health_check import check_health

    connection = _connection(ctx)
    answer = check_health(connection.target, service, timeout, connection.tls, token=connection.token)
    typer.echo(answer.status)
    if answer.detail:
        typer.echo(f"turnwire: {answer.detail}", err=True)
    raise typer.Exit(answer.exit_code)


@app.command()
def demo(
    workdir: Annotated[
        Path, typer.Option(help="Working directory of the sidecar (its SQLite file lives there).")
    ] = Path("."),
    overflow: Annotated[
        bool,
        typer.Option(
            "--overflow",
            help="A small context window and compaction on: a turn overflows and recovers.",
        ),
    ] = False,
    listen: Annotated[
        str | None,
        typer.Option(
            callback=_check_target,
            show_default=False,
            help="Address the demo's sidecar listens on, HOST:PORT. Default: 127.0.0.1 and a free port.",
        ),
    ] = None,
) -> None:
    """Run a demo conversation that calls tools.

    Starts the sidecar on its embedded defaults, holds a conversation that calls tools, and
    stops it.
    """
    from turnwire_server.demo import run_demo

    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    raise typer.Exit(asyncio.run(run_demo(workdir, overflow=overflow, listen=listen)))


def main() -> None:
    """Console-script entry point."""
    app()
