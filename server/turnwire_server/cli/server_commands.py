"""The commands that run here rather than talk to a sidecar: ``serve``, ``migrate``,
``config show`` and ``demo``. The server's modules are imported when a command runs."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from turnwire_server.cli.connection import check_target

__all__ = ["config_show", "demo", "migrate", "serve"]


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
            help="Store URL: sqlite:///PATH (in a directory that exists) or postgresql://... Default: "
            "$TURNWIRE_STORE__URL, else store.url in the config, else sqlite:///turnwire.db."
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

    Exit status 0 after a graceful stop, 2 for an invalid configuration (the message names the
    field), 1 when it cannot start (a provider's API key unset, the port in use, the store in use
    by another process or unreachable; the message says which).
    """
    settings = _load(config, listen, store, workers)
    from turnwire_server.logs import configure_process_logging, report_exit

    configure_process_logging(settings)
    if settings.log_level is not None:
        logging.getLogger("turnwire.server").warning(
            "log_level is deprecated: use logging.level (TURNWIRE_LOGGING__LEVEL)"
        )
    for warning in _unknown_variables(settings):
        logging.getLogger("turnwire.server").warning("%s", warning)
    if settings.workers > 1:
        _supervise(settings)
        return
    from turnwire_server.app import serve as run_server
    from turnwire_server.assembly import StartupError, StartupStopped
    from turnwire_server.event_loop import EventLoopUnavailable, run

    try:
        run(run_server(settings), settings.event_loop)
    except StartupStopped as stopped:
        report_exit(settings, str(stopped), level=logging.INFO)
        return
    except (StartupError, EventLoopUnavailable) as error:
        report_exit(settings, f"cannot start: {error}")
        raise typer.Exit(1) from None


def _unknown_variables(settings: Any) -> list[str]:
    """Warnings for TURNWIRE_* variables that name no setting (a misspelt one is otherwise ignored),
    but for those a ``*_env`` setting of ``settings`` names (``secret_env: TURNWIRE_WEBHOOK_SECRET``)."""
    import os

    from turnwire_server.config import Settings
    from turnwire_server.config_hints import unknown_variables, variables_named

    return unknown_variables(os.environ, Settings, variables_named(settings))


def _supervise(settings: Any) -> None:
    """``serve --workers N`` (N > 1): the supervisor (:mod:`turnwire_server.supervisor`)."""
    from turnwire_server.logs import report_exit
    from turnwire_server.supervisor import SupervisorError, supervise

    try:
        code = asyncio.run(supervise(settings))
    except SupervisorError as error:
        report_exit(settings, f"cannot start: {error}")
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


def config_show(
    listen: Annotated[str | None, typer.Option(help="As serve's --listen.")] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="TURNWIRE_CONFIG", help="YAML configuration file."),
    ] = None,
    store: Annotated[str | None, typer.Option(help="As serve's --store.")] = None,
) -> None:
    """Print the effective configuration as YAML, secrets masked.

    The configuration serve would load (flags, TURNWIRE_* variables, the file, defaults), with
    secrets shown as ***. Exit status 2 when it is invalid, or when serve would refuse it before
    opening anything: its providers (a default_model no provider serves, a missing API key), the
    tls: files, auth: tokens or key set, a webhook secret or store.password_env variable unset.
    """
    import yaml

    from turnwire_server.app import check_startable
    from turnwire_server.assembly import StartupError
    from turnwire_server.redaction import redacted_settings

    settings = _load(config, listen, store)
    try:
        asyncio.run(check_startable(settings))
    except StartupError as error:
        typer.echo(f"turnwire: serve would refuse this configuration: {error}", err=True)
        raise typer.Exit(2) from None
    for warning in _unknown_variables(settings):
        typer.echo(f"turnwire: warning: {warning}", err=True)
    shown = redacted_settings(settings)
    if shown.get("log_level") is None:
        shown.pop("log_level", None)  # the deprecated spelling, shown only when it is set
    typer.echo(yaml.safe_dump(shown, sort_keys=False, allow_unicode=True), nl=False)


def migrate(
    store_url: Annotated[
        str | None,
        typer.Option("--store-url", "--store", help="Store URL; default: the configured store.url."),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="TURNWIRE_CONFIG", help="YAML configuration file."),
    ] = None,
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
            callback=check_target,
            show_default=False,
            help="Address the demo's sidecar listens on, HOST:PORT. Default: 127.0.0.1 and a free port.",
        ),
    ] = None,
    inspect: Annotated[
        bool,
        typer.Option(
            "--inspect",
            help="Serve the inspector page too, print its address, and keep the sidecar up until Ctrl-C.",
        ),
    ] = False,
) -> None:
    """Run a demo conversation that calls tools.

    Starts the sidecar on its embedded defaults, holds a conversation that calls tools, and
    stops it. With --inspect it also serves the inspector page, prints its address, and stops
    once you press Ctrl-C (look at the turns there first).
    """
    from turnwire_server.cli.demo import run_demo

    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    raise typer.Exit(asyncio.run(run_demo(workdir, overflow=overflow, listen=listen, inspect=inspect)))
