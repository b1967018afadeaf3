"""``turnwire schedule create|list|get|pause|resume|delete`` (docs/schedules.md).

Each prints the schedule(s) it got back, one line each: id, state, timing, next fire time, how
many fires submitted and were skipped, and the webhook target its runs call, when it has one.
Exit status 0, 2 when the sidecar refused the call (a bad cron expression, an unknown id), 3 when
it cannot be reached.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from turnwire_server.cli.connection import Connection, ConnectionOptions, client_command

if TYPE_CHECKING:
    from turnwire_client import TurnwireClient
    from turnwire_client.v1 import chat_service_pb2

__all__ = ["schedule_app"]

schedule_app = typer.Typer(
    help="Submit a message on a cron schedule or once.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

ScheduleArgument = Annotated[str, typer.Argument(metavar="SCHEDULE", help="The schedule's id.")]


def _line(schedule: chat_service_pb2.Schedule) -> str:
    from turnwire_client.v1 import chat_service_pb2

    state = chat_service_pb2.ScheduleState.Name(schedule.state).removeprefix("SCHEDULE_STATE_").lower()
    if schedule.cron:
        timing = f"cron {schedule.cron!r} {schedule.time_zone or 'UTC'}"
    else:
        timing = f"at {schedule.fire_time.ToDatetime(dt.UTC).isoformat()}"
    following = (
        schedule.next_fire_time.ToDatetime(dt.UTC).isoformat() if schedule.HasField("next_fire_time") else "-"
    )
    target = schedule.input.webhook
    called = f" · webhook {target.endpoint or target.url}" if schedule.input.HasField("webhook") else ""
    return (
        f"{schedule.schedule_id} · {state} · {timing} · next {following} · "
        f"{schedule.fire_count} fired · {schedule.skipped_count} skipped{called}"
    )


def _run(connection: Connection, call: Callable[[TurnwireClient], Awaitable[Any]]) -> int:
    """Run ``call`` on a client of the sidecar and print what it returned; the exit code."""
    from rich.console import Console

    from turnwire_client import TurnwireError
    from turnwire_client.v1 import chat_service_pb2
    from turnwire_server.cli.errors import print_call_error
    from turnwire_server.cli.exit_codes import EXIT_OK

    async def run() -> int:
        try:
            async with connection.client() as client:
                answer = await call(client)
        except TurnwireError as error:
            return print_call_error(Console(stderr=True), connection, error)
        if isinstance(answer, chat_service_pb2.Schedule):
            typer.echo(_line(answer))
        elif isinstance(answer, chat_service_pb2.ListSchedulesResponse):
            for schedule in answer.schedules:
                typer.echo(_line(schedule))
        else:
            typer.echo("deleted" if answer else "not found")
        return EXIT_OK

    return asyncio.run(run())


@client_command
def create(
    conversation: Annotated[
        str,
        typer.Argument(
            metavar="CONVERSATION", help='Conversation each run goes to ("" with --new-conversation).'
        ),
    ],
    text: Annotated[str, typer.Argument(metavar="TEXT", help="The user message each fire submits.")],
    *,
    sidecar: ConnectionOptions,
    cron: Annotated[str, typer.Option(help="Cron expression: 5 fields, or 6 with seconds first.")] = "",
    time_zone: Annotated[
        str, typer.Option("--time-zone", help="IANA time zone for --cron (default UTC).")
    ] = "",
    at: Annotated[str, typer.Option(help="A single time instead of --cron (ISO 8601 with offset).")] = "",
    new_conversation: Annotated[
        str,
        typer.Option(
            help="Conversation id template for a new conversation per run ({fire_number}, {fire_time})."
        ),
    ] = "",
    overlap: Annotated[str, typer.Option(help="skip or enqueue while the previous run is open.")] = "skip",
    missed_runs: Annotated[
        str, typer.Option(help="skip or run_once for fires missed while no replica was up.")
    ] = "skip",
    schedule_id: Annotated[str, typer.Option(help="Choose the schedule's id (default: assigned).")] = "",
    model: Annotated[str | None, typer.Option(help="Model for each run, provider:model.")] = None,
    webhook: Annotated[
        str,
        typer.Option(
            metavar="ENDPOINT",
            help="Call this configured webhook endpoint when each run ends (an http(s) URL where the "
            "server takes per-request URLs).",
        ),
    ] = "",
) -> None:
    """Create a schedule that submits TEXT on a cron expression or once at a time."""
    fire_time = None
    if at:
        try:
            fire_time = dt.datetime.fromisoformat(at)
        except ValueError:
            typer.echo(f"turnwire: --at {at!r} is not an ISO 8601 time (2026-12-03T09:00:00+01:00)", err=True)
            raise typer.Exit(2) from None
        if fire_time.tzinfo is None:
            typer.echo("turnwire: --at needs an offset (…+00:00 or …Z)", err=True)
            raise typer.Exit(2)
    options: dict[str, Any] = {
        "cron": cron,
        "time_zone": time_zone,
        "fire_time": fire_time,
        "conversation_id_template": new_conversation,
        "overlap": overlap,
        "missed_runs": missed_runs,
        "schedule_id": schedule_id,
        "model": model,
        # An endpoint's name holds no ":" (webhooks.settings.ENDPOINT_NAME): "://" marks a URL.
        "webhook": ({"url": webhook} if "://" in webhook else webhook) if webhook else None,
    }
    if overlap not in ("skip", "enqueue") or missed_runs not in ("skip", "run_once"):
        typer.echo("turnwire: --overlap is skip or enqueue; --missed-runs is skip or run_once", err=True)
        raise typer.Exit(2)
    raise typer.Exit(_run(sidecar.connection(), lambda c: c.create_schedule(conversation, text, **options)))


@client_command
def list_(
    *,
    sidecar: ConnectionOptions,
    limit: Annotated[int, typer.Option(min=1, max=100, help="Show at most this many.")] = 50,
) -> None:
    """List schedules by id."""
    raise typer.Exit(_run(sidecar.connection(), lambda c: c.list_schedules(page_size=limit)))


@client_command
def get(schedule: ScheduleArgument, *, sidecar: ConnectionOptions) -> None:
    """Show one schedule."""
    raise typer.Exit(_run(sidecar.connection(), lambda c: c.get_schedule(schedule)))


@client_command
def pause(schedule: ScheduleArgument, *, sidecar: ConnectionOptions) -> None:
    """Pause a schedule: no fire until it is resumed."""
    raise typer.Exit(_run(sidecar.connection(), lambda c: c.pause_schedule(schedule)))


@client_command
def resume(schedule: ScheduleArgument, *, sidecar: ConnectionOptions) -> None:
    """Resume a paused schedule from its next time after now."""
    raise typer.Exit(_run(sidecar.connection(), lambda c: c.resume_schedule(schedule)))


@client_command
def delete(schedule: ScheduleArgument, *, sidecar: ConnectionOptions) -> None:
    """Delete a schedule (the submissions it made stay)."""
    raise typer.Exit(_run(sidecar.connection(), lambda c: c.delete_schedule(schedule)))


schedule_app.command()(create)
schedule_app.command("list")(list_)
schedule_app.command()(get)
schedule_app.command()(pause)
schedule_app.command()(resume)
schedule_app.command()(delete)
