"""Start-up warns when the demo tools (on by default) would be offered to a real model: their
made-up data (get_weather) would reach it (a fresh-user trial configured only providers)."""

from __future__ import annotations

from typing import Any

import pytest

from turnwire_server.assembly import warn_of_demo_tools
from turnwire_server.config import Settings

OPENAI = {"o": {"type": "openai", "api_key_env": "TW_TEST_OPENAI_KEY"}}


def _warnings(caplog: pytest.LogCaptureFixture, **config: Any) -> list[str]:
    caplog.clear()
    with caplog.at_level("WARNING", logger="turnwire.server"):
        warn_of_demo_tools(Settings(**config))
    return [r.getMessage() for r in caplog.records]


def test_demo_tools_on_by_default_with_a_real_default_model_are_warned_of(
    caplog: pytest.LogCaptureFixture,
) -> None:
    (message,) = _warnings(caplog, default_model="o:gpt-4.1", providers=OPENAI)
    assert "the demo tools (get_current_time, calculator, get_weather)" in message
    assert "offered to o:gpt-4.1, a real model; set tools.demo: false" in message


@pytest.mark.parametrize(
    "config",
    [
        {},  # the scripted default model
        {"default_model": "o:gpt-4.1", "providers": OPENAI, "tools": {"demo": True}},  # asked for
        {"default_model": "o:gpt-4.1", "providers": OPENAI, "tools": {"demo": False}},
    ],
)
def test_no_warning_for_the_scripted_model_or_an_explicit_choice(
    caplog: pytest.LogCaptureFixture, config: dict[str, Any]
) -> None:
    assert _warnings(caplog, **config) == []


async def test_a_start_that_fails_prints_no_demo_tools_warning(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """Trial 3: a start that failed for a missing API key first warned about the demo tools being
    offered to that real model: the fatal error is the one thing to say."""
    from turnwire_server.app import start
    from turnwire_server.assembly import StartupError

    monkeypatch.delenv("TW_TEST_OPENAI_KEY", raising=False)
    settings = Settings(
        default_model="o:gpt-4.1", providers=OPENAI, store={"url": f"sqlite:///{tmp_path / 'tw.db'}"}
    )
    with (
        caplog.at_level("WARNING", logger="turnwire.server"),
        pytest.raises(StartupError, match="TW_TEST_OPENAI_KEY"),
    ):
        await start(settings)
    assert not [r for r in caplog.records if "demo tools" in r.getMessage()]
    assert not (tmp_path / "tw.db").exists()
