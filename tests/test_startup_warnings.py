"""Start-up warns when the demo tools (on by default) would be offered to a real model: their
made-up data (get_weather) would reach it (a fresh-user trial configured only providers); and when
a section that is off unless enabled (auth, metrics, tracing) sets fields but not ``enabled``."""

from __future__ import annotations

from typing import Any

import pytest

from turnwire_server.assembly import warn_of_demo_tools, warn_of_sections_left_off
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


def _section_warnings(caplog: pytest.LogCaptureFixture, **config: Any) -> list[str]:
    caplog.clear()
    with caplog.at_level("WARNING", logger="turnwire.server"):
        warn_of_sections_left_off(Settings(**config))
    return [r.getMessage() for r in caplog.records]


def test_a_section_set_up_but_not_enabled_is_warned_of(
    caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    """``auth: {tokens_file: …}`` without ``enabled: true`` ran every call unauthenticated, as the
    default tenant (so per-tenant budgets never applied), and ``metrics: {listen: …}`` served
    nothing, both without a word (developer trial)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text('{"tokens": {}}')
    assert _section_warnings(caplog, auth={"tokens_file": tokens}, metrics={"listen": "127.0.0.1:9999"}) == [
        "auth is off: auth.tokens_file is set but auth.enabled is not; set auth.enabled: true to turn it "
        "on (or auth.enabled: false to keep it off without this warning)",
        "metrics is off: metrics.listen is set but metrics.enabled is not; set metrics.enabled: true to "
        "turn it on (or metrics.enabled: false to keep it off without this warning)",
    ]
    (message,) = _section_warnings(
        caplog, tracing={"endpoint": "http://127.0.0.1:4317", "service_name": "shop"}
    )
    assert message.startswith("tracing is off: tracing.endpoint, tracing.service_name are set but")
    # The HTTP listener's switch is its address: an inspector without it served no page.
    assert _section_warnings(caplog, http={"inspector": True}) == [
        "http is off: http.inspector is set but http.listen is not; set http.listen: HOST:PORT to "
        "turn it on (or http.listen: null to keep it off without this warning)"
    ]


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"metrics": {"enabled": True, "listen": "127.0.0.1:9999"}},
        {"metrics": {"enabled": False, "listen": "127.0.0.1:9999"}},  # off, as asked
        {"tracing": {"enabled": False, "endpoint": "http://127.0.0.1:4317"}},
        {"http": {"listen": "127.0.0.1:8080", "inspector": True}},
        {"http": {"listen": None, "inspector": True}},
    ],
)
def test_no_section_warning_when_enabled_is_said(
    caplog: pytest.LogCaptureFixture, config: dict[str, Any]
) -> None:
    assert _section_warnings(caplog, **config) == []
