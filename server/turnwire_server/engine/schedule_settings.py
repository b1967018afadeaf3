"""The ``schedules:`` section: how each replica's schedule loop polls (docs/schedules.md,
docs/configuration.md). Times in seconds."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from turnwire_server.config_section import ConfigSection


class ScheduleSettings(ConfigSection):
    """The schedule loop (:class:`~turnwire_server.engine.schedules.Scheduler`)."""

    model_config = ConfigDict(frozen=True)

    poll_interval_seconds: float = Field(
        1.0,
        gt=0,
        le=60,
        description="how often each replica looks for due schedules: a fire is made at most this late",
    )
    misfire_grace_seconds: float = Field(
        60.0,
        ge=0,
        description="a fire later than this (no replica was up) is missed: "
        "its schedule's missed_runs_policy decides",
    )
