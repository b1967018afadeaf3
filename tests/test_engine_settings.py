"""The engine gets its configuration sections whole (``assembly.engine_settings``): nothing is copied
field by field on the way, so a field added to a section reaches the engine without a second
edit. ``limits.concurrent_input`` is the case a hand copy once lost (docs/configuration.md)."""

from __future__ import annotations

import dataclasses

import pytest

from turnwire.hooks import SessionConfig
from turnwire_server.assembly import engine_settings, metric_models
from turnwire_server.config import load_settings
from turnwire_server.engine.settings import EngineSettings, LimitsSettings


def test_the_engine_holds_the_validated_sections_themselves() -> None:
    settings = load_settings(
        limits={"max_steps": 3, "concurrent_input": "reject"},
        durability={"lease_seconds": 5},
        events={"hook_timeline": True},
        checkpoint={"interval_ms": 40},
    )
    engine = engine_settings(settings, SessionConfig(), "replica-test")
    assert engine.limits is settings.limits
    assert engine.events is settings.events
    assert engine.checkpoint is settings.checkpoint
    assert engine.durability is settings.durability
    assert engine.limits.concurrent_input == "reject"
    assert engine.replica_id == "replica-test"
    assert (engine.default_model, engine.system_prompt) == (settings.default_model, settings.system_prompt)


def test_sections_are_frozen_and_engine_settings_keyword_only() -> None:
    with pytest.raises(ValueError, match="frozen"):
        LimitsSettings().max_steps = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        EngineSettings("scripted:demo")  # type: ignore[call-arg]
    assert {f.name for f in dataclasses.fields(EngineSettings)} >= {
        "limits",
        "events",
        "checkpoint",
        "durability",
    }


def test_fallback_and_subagent_models_label_the_metrics_by_name() -> None:
    """A fallback's steps are counted under its own id (docs/operate/metrics.md: ids the
    configuration names are labels); before, ``openai:gpt-4o`` named only under ``fallback.models``
    was counted as ``openai:other`` (money trial)."""
    sdk = {"api_key_env": None}
    settings = load_settings(
        default_model="anthropic:claude-sonnet-4-5",
        providers={"anthropic": {"type": "anthropic", **sdk}, "openai": {"type": "openai", **sdk}},
        fallback={"models": {"anthropic:claude-haiku-4-5": ["openai:gpt-4o", "openai:gpt-4o-mini"]}},
        subagents=[{"name": "helper", "description": "helps", "model": "openai:gpt-4.1"}],
    )
    known = metric_models(settings, SessionConfig())
    assert {
        "anthropic:claude-sonnet-4-5",
        "anthropic:claude-haiku-4-5",
        "openai:gpt-4o",
        "openai:gpt-4o-mini",
        "openai:gpt-4.1",
    } <= known
