"""``turnwire webhooks deliveries``: the webhook deliveries of the caller's submissions, each with
every attempt (``ListWebhookDeliveries``; docs/webhooks.md)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.text import Text

from turnwire_server.cli.connection import Connection, ConnectionOptions, client_command
from turnwire_server.cli.errors import print_call_error
from turnwire_server.cli.exit_codes import EXIT_OK
from turnwire_server.cli.parts import or_stderr, print_listing_end, utc_time

if TYPE_CHECKING:
    from turnwire_client.v1 import webhook_pb2

__all__ = ["deliveries", "run_deliveries", "webhooks_app"]

webhooks_app = typer.Typer(
    help="Inspect webhook deliveries (docs/webhooks.md).", no_args_is_help=True, rich_markup_mode=None
)

_STATES = {"pending": 1, "delivered": 2, "failed": 3}
_STATE_STYLES = {"pending": "yellow", "delivered": "green", "failed": "red"}


async def run_deliveries(
    connection: Connection,
    *,
    submission_id: str = "",
    conversation_id: str = "",
    state: str = "",
    limit: int = 50,
    console: Console | None = None,
    err_console: Console | None = None,
) -> int:
    """Print up to ``limit`` deliveries, oldest first: a line each (id, event, target, state,
    submission) and a line per attempt (number, start time UTC, HTTP status or error, duration).
    Exit codes: 0, 2 when the call is refused, 3 when the sidecar cannot be reached."""
    # Imported here: the client imports gRPC, which must not start before the CLI quiets its log
    # (cli/app.py: GRPC_VERBOSITY), and `turnwire -h` stays fast.
    from turnwire_client import TurnwireError

    out = console if console is not None else Console()
    shown, page_token = 0, ""
    try:
        async with connection.client() as client:
            while shown < limit:
                page = await client.list_webhook_deliveries(
                    submission_id=submission_id,
                    conversation_id=conversation_id,
                    state=_STATES.get(state, 0),  # type: ignore[arg-type]
                    page_size=min(limit - shown, 100),
                    page_token=page_token,
                )
                for delivery in page.deliveries:
                    _print_delivery(out, delivery)
                    shown += 1
                page_token = page.next_page_token
                if not page_token:
                    break
    except TurnwireError as error:
        return print_call_error(or_stderr(err_console), connection, error)
    print_listing_end(out, shown, bool(page_token), "no webhook deliveries")
    return EXIT_OK


def _print_delivery(out: Console, delivery: webhook_pb2.WebhookDelivery) -> None:
    from turnwire_client.v1 import webhook_pb2

    state = webhook_pb2.WebhookDeliveryState.Name(delivery.state).removeprefix("WEBHOOK_DELIVERY_STATE_")
    target = delivery.target.endpoint or delivery.target.url
    line = Text(delivery.delivery_id, style="bold")
    line.append(f" · {delivery.event_type} → {target} · ")
    line.append(state.lower(), style=_STATE_STYLES.get(state.lower(), ""))
    line.append(f" · submission {delivery.submission_id}", style="dim")
    if delivery.HasField("next_attempt_time"):
        line.append(f" · next attempt {utc_time(delivery.next_attempt_time)}", style="dim")
    out.print(line, soft_wrap=True, highlight=False)
    for attempt in delivery.attempts:
        outcome = f"HTTP {attempt.http_status}" if attempt.http_status else (attempt.error or "no result")
        if attempt.http_status and attempt.error and not attempt.error.startswith("HTTP"):
            outcome += f" ({attempt.error})"
        took = f" · {attempt.duration.ToMilliseconds()} ms" if attempt.HasField("duration") else ""
        out.print(
            Text(
                f"  attempt {attempt.attempt} · {utc_time(attempt.start_time)} · {outcome}{took}", style="dim"
            ),
            soft_wrap=True,
            highlight=False,
        )


@webhooks_app.command("deliveries")
@client_command
def deliveries(
    *,
    sidecar: ConnectionOptions,
    submission: Annotated[str, typer.Option(help="Only this submission's deliveries.")] = "",
    conversation: Annotated[str, typer.Option(help="Only this conversation's.")] = "",
    state: Annotated[str, typer.Option(help="Only in this state: pending, delivered or failed.")] = "",
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many.")] = 50,
) -> None:
    """List webhook deliveries, oldest first, each with its attempts."""
    if state and state not in _STATES:
        typer.echo(f"turnwire: --state must be one of {', '.join(_STATES)}, not {state!r}", err=True)
        raise typer.Exit(2)
    run = run_deliveries(
        sidecar.connection(), submission_id=submission, conversation_id=conversation, state=state, limit=limit
    )
    raise typer.Exit(asyncio.run(run))
