"""Misspelt configuration keys get a suggestion at every depth, in the file and in TURNWIRE_*
variables; URL settings are checked at start (a fresh-user trial: ``limits.max_step``,
``providers.x.base_ur``, ``api_key:``, ``TURNWIRE_LIMIT__MAX_STEPS`` and a base_url on port
99999 were all reported badly or not at all)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from turnwire_server.config import ConfigError, Settings, load_settings
from turnwire_server.config_hints import unknown_variables, variables_named


def _error(tmp_path: Path, config: dict[str, Any]) -> str:
    path = tmp_path / "turnwire.yaml"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError) as raised:
        load_settings(path)
    return str(raised.value)


@pytest.mark.parametrize(
    ("config", "line"),
    [
        ({"limts": {}}, "  limts: unknown field; did you mean 'limits'?"),
        ({"limits": {"max_step": 3}}, "  limits.max_step: unknown field; did you mean 'max_steps'?"),
        (
            {"providers": {"x": {"type": "openai", "base_ur": "http://127.0.0.1:8000/v1"}}},
            "  providers.x.base_ur: unknown field; did you mean 'base_url'?",
        ),
        (
            {"providers": {"x": {"type": "anthropic", "timeout": 5}}},
            "  providers.x.timeout: unknown field; did you mean 'timeout_seconds'?",
        ),
        (
            {"tools": {"mcp": [{"name": "m", "url": "http://127.0.0.1:9/mcp", "header": {}}]}},
            "  tools.mcp.0.header: unknown field; did you mean 'headers'?",
        ),
    ],
)
def test_a_misspelt_key_gets_the_closest_key_of_its_own_section(
    tmp_path: Path, config: dict[str, Any], line: str
) -> None:
    assert line in _error(tmp_path, config).splitlines()


def test_a_key_far_from_any_lists_what_the_section_takes(tmp_path: Path) -> None:
    message = _error(tmp_path, {"limits": {"zzz": 1}})
    assert "limits.zzz: unknown field; this section takes " in message
    assert "max_steps" in message


def test_an_api_key_in_the_file_says_to_use_a_variable(tmp_path: Path) -> None:
    message = _error(
        tmp_path, {"providers": {"local": {"type": "openai", "base_url": "http://h/v1", "api_key": "sk-1"}}}
    )
    assert "providers.local.api_key: API keys are never read from the file" in message
    assert "api_key_env: OPENAI_API_KEY" in message
    assert "sk-1" not in message


@pytest.mark.parametrize(
    ("field", "entry"),
    [
        (
            "providers.bad.base_url",
            {"providers": {"bad": {"type": "openai", "base_url": "http://127.0.0.1:99999/v1"}}},
        ),
        (
            "tools.mcp.0.url",
            {"tools": {"mcp": [{"name": "m", "url": "http://127.0.0.1:70000/mcp"}]}},
        ),
    ],
)
def test_a_url_whose_port_is_out_of_range_is_refused_at_start(
    tmp_path: Path, field: str, entry: dict[str, Any]
) -> None:
    message = _error(tmp_path, entry)
    assert f"{field}: " in message and "has no valid port (0-65535)" in message


def test_misspelt_variables_are_reported_and_the_clients_are_not() -> None:
    environ = {
        "TURNWIRE_LIMIT__MAX_STEPS": "3",
        "TURNWIRE_LIMITS__MAX_STEP": "3",
        "TURNWIRE_LIMITS__MAX_STEPS": "3",  # right
        "TURNWIRE_PROVIDERS__LOCAL__BASE_URL": "http://h/v1",  # a mapping's own keys are free-form
        "TURNWIRE_TARGET": "127.0.0.1:1",  # the CLI's
        "TURNWIRE_TEST_POSTGRES_URL": "postgresql://x",  # the tests'
        "PATH": "/bin",
    }
    assert unknown_variables(environ, Settings) == [
        "TURNWIRE_LIMITS__MAX_STEP is ignored: LIMITS has no setting 'max_step'; "
        "did you mean TURNWIRE_LIMITS__MAX_STEPS?",
        "TURNWIRE_LIMIT__MAX_STEPS is ignored: the top level has no setting 'limit'; "
        "did you mean TURNWIRE_LIMITS?",
    ]


def test_a_variable_a_setting_reads_by_name_is_not_reported(tmp_path: Path) -> None:
    """A fresh-user trial: ``secret_env: TURNWIRE_WEBHOOK_SECRET`` (the webhooks page's example then)
    made every start warn that the variable, which the sidecar reads, "is ignored"."""
    path = tmp_path / "turnwire.yaml"
    config = {
        "webhooks": {
            "endpoints": {"app": {"url": "https://app.example/hook", "secret_env": "TURNWIRE_HOOK_KEY"}}
        },
        "auth": {"enabled": True, "tokens_env": "TURNWIRE_TOKENS_JSON"},
        "providers": {"o": {"type": "openai", "api_key_env": "TURNWIRE_OPENAI_KEY"}},
    }
    path.write_text(yaml.safe_dump(config))
    named = variables_named(load_settings(path))
    assert {"TURNWIRE_HOOK_KEY", "TURNWIRE_TOKENS_JSON", "TURNWIRE_OPENAI_KEY"} <= named
    environ = {name: "x" for name in ("TURNWIRE_HOOK_KEY", "TURNWIRE_TOKENS_JSON", "TURNWIRE_OPENAI_KEY")}
    environ["TURNWIRE_LIMITS__MAX_STEP"] = "3"
    assert unknown_variables(environ, Settings, named) == [
        "TURNWIRE_LIMITS__MAX_STEP is ignored: LIMITS has no setting 'max_step'; "
        "did you mean TURNWIRE_LIMITS__MAX_STEPS?"
    ]
    assert len(unknown_variables(environ, Settings)) == 4  # read by no setting, each is reported


def test_a_bad_header_value_is_reported_without_the_value(tmp_path: Path) -> None:
    """Header values are secrets (config show masks them); the error must not quote one."""
    message = _error(
        tmp_path,
        {
            "providers": {
                "p": {"type": "openai", "default_headers": {"Authorization": "Bearer sk-SECRET123 "}}
            }
        },
    )
    assert "header Authorization: its value has leading or trailing whitespace" in message
    assert "SECRET123" not in message
